"""Template context processor: ``resourcesync_capability_lists``, the URIs of the Capability
Lists that cover the current page (worked out when a template first uses it)."""

from django.utils.functional import SimpleLazyObject

from . import discovery


def resourcesync(request):
    return {"resourcesync_capability_lists": SimpleLazyObject(lambda: discovery.capability_lists(request))}
