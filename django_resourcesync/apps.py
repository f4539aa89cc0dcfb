from importlib import import_module

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules
from django.utils.translation import gettext_lazy as _

# (module, exception) for each RESOURCESYNC["SOURCE_MODULES"] entry that failed to import;
# reported by the system check resourcesync.E013 instead of breaking start-up.
source_module_errors = []


class ResourceSyncConfig(AppConfig):
    name = "django_resourcesync"
    label = "resourcesync"
    verbose_name = _("ResourceSync")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import checks, signals  # noqa: F401  (registers the system checks and receivers)
        from .conf import app_settings

        autodiscover_modules("resourcesync")
        try:
            modules = list(app_settings.SOURCE_MODULES)
        except Exception:  # a bad RESOURCESYNC is reported by the system checks, with a hint
            modules = []
        for module in modules:
            try:
                import_module(module)
            except ImportError as exc:
                source_module_errors.append((module, exc))
        signals.connect_tracked_models()
        signals.connect_celery()
