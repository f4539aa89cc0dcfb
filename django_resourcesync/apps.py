from importlib import import_module

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules
from django.utils.translation import gettext_lazy as _


class ResourceSyncConfig(AppConfig):
    name = "django_resourcesync"
    label = "resourcesync"
    verbose_name = _("ResourceSync")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Django's app loading: these modules need the models, so they are imported now. They
        # register the system checks, the receivers, and the tasks (found by name by the layers
        # below them).
        from . import access, checks, push, signals, sqlite, tasks  # noqa: F401
        from .builders import withdrawal  # noqa: F401  (receives signals.resources_left)
        from .conf import app_settings, source_module_errors
        from .push import receivers as push_receivers
        from .sources import registry
        from .tracking import outbox, receivers

        self.sources = registry

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
        receivers.connect_tracked_models()
        receivers.connect_sets()
        receivers.connect_celery()
        outbox.connect()  # the embedded mode's catch-up, once the process serves requests
        outbox.dispatcher.also_on_look(push.catch_up)  # and the push's, with it
        push_receivers.connect()
        access.connect()
        sqlite.connect()
