"""``{% load resourcesync %}``, then ``{% resourcesync_links %}`` in a page's ``<head>``: a
``<link rel="resourcesync" href="...">`` per Capability List that covers the page (spec section
6.3.3)."""

from django import template
from django.utils.html import format_html_join

from .. import discovery

register = template.Library()


@register.simple_tag(takes_context=True)
def resourcesync_links(context, obj=None):
    """The discovery links of the current page: those of the sets whose records list its URI;
    or, given the object the page shows (``{% resourcesync_links item %}``), those of the sets
    that list that object at this page's URI, as they are now. Pass the object on a page that is
    itself a resource whose bytes are hashed (a :class:`~django_resourcesync.sources.ViewSource`):
    its links then never depend on whether its own record is written yet."""
    request = context.get("request")
    if request is None:
        return ""
    targets = discovery.capability_lists(request) if obj is None else discovery.capability_lists_of_object(request, obj)
    return format_html_join("\n", '<link rel="resourcesync" href="{}">', ((target,) for target in targets))
