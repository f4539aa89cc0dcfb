"""The app's exceptions, at the bottom of its modules: any layer may raise or catch them."""

from django.core.exceptions import ImproperlyConfigured


class AlreadyRegistered(ImproperlyConfigured):
    """A resource source of that name is registered already."""


class NotRegistered(KeyError):
    """No resource source of that name is registered."""


class UnpublishableResource(ValueError):
    """An object whose entry cannot be published (its URI is too long, say)."""


class BuildInProgress(RuntimeError):
    """Another process holds the lock for this set and capability."""


class BuildAbandoned(RuntimeError):
    """The build was failed meanwhile (a part failed, or its lock expired and went to another)."""
