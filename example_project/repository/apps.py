from django.apps import AppConfig


class RepositoryConfig(AppConfig):
    name = "example_project.repository"
    label = "repository"
    verbose_name = "Repository"
    default_auto_field = "django.db.models.BigAutoField"
