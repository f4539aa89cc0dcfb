"""Notification channels (framework notification 1.0, sections 2 and 5; the change notification
of the 2013 paper): a set's WebSub topics, as its Capability List advertises them.

A channel has nothing to build: its topic URI (``framework-notification`` or
``change-notification`` under the set's prefix) answers GET with the latest notification sent on
it, with ``Link`` headers ``rel="hub"`` and ``rel="self"``, as WebSub's discovery and a hub
fetching a topic after a thin ping expect. What is announced, and when, is
:mod:`django_resourcesync.push`'s part.
"""

from django.utils.translation import ngettext

from .. import uris
from ..models import Notification, Subscription
from ..push import payloads
from ..served import Served


def update(resource_set, *, progress=None, batch_size=None, parallel=False, lock=None):
    """The capability table's way in: nothing to build (notifications are sent as things change)."""
    return []


def published(resource_set):
    """A channel exists from when the set offers it: its configuration's date."""
    return resource_set.modified


def entry_links(resource_set):
    """The links of its entry in the Capability List: the hub (framework notification, Example 8)."""
    return [{"rel": "hub", "href": uris.hub_uri()}]


def link_header(resource_set, capability):
    """The ``Link`` header of the topic and of every notification sent on it."""
    topic = uris.topic_uri(resource_set, capability)
    return (
        f'<{uris.hub_uri()}>; rel="hub", <{topic}>; rel="self", '
        f'<{uris.capability_list_uri(resource_set)}>; rel="resourcesync"'
    )


def serve(resource_set, name):
    """The topic: its latest notification (an empty one before the first)."""
    capability = uris.topic_capability(name)
    if capability is None:
        return None
    latest = Notification.objects.filter(resource_set=resource_set, capability=capability).order_by("-pk").first()
    if latest is None:
        served = Served.rendered(payloads.empty(resource_set, capability), resource_set.modified)
    else:
        served = Served.rendered(latest.payload.encode(), latest.created)
    served.headers = {"Link": link_header(resource_set, capability)}
    return served


def describe(resource_set):
    """What the admin says of it."""
    subscribers = Subscription.objects.filter(resource_set=resource_set).count()
    sent = Notification.objects.filter(resource_set=resource_set).count()
    return (ngettext("%(n)d subscription", "%(n)d subscriptions", subscribers) % {"n": subscribers} + "; "
            + ngettext("%(n)d notification kept", "%(n)d notifications kept", sent) % {"n": sent})
