"""What the channels announce: notifications recorded from what changed since the last one.

- **Change notifications**: the set's change events after the last one its channel announced,
  oldest first, as the entries of its Change List (so with their ``change``, ``datetime``,
  hashes, length and type), at most one document's worth per notification.
- **Framework notifications** (section 2): the channel keeps what each document was when it last
  told of it (:class:`~django_resourcesync.models.Channel`); a run compares that with what is
  published now (each capability builder's ``notice()``, the Capability List's and the Source
  Description's bytes) and tells of what was created, updated or deleted, as Table 2 allows.
  Changes of the Source Description go out on every set's framework channel.

Each channel is read and advanced under its row's lock, in the transaction that records the
notification and its deliveries: two runs at once never announce a change twice, and a run that
dies announces nothing.
"""

import hashlib
import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from .. import capabilities, uris
from ..builders import capabilitylist
from ..conf import app_settings
from ..models import ChangeEvent, Channel, Delivery, Notification, ResourceSet, Subscription
from ..xml.writer import DocumentWriter, w3c_datetime
from . import payloads

logger = logging.getLogger(__name__)


def anyone_listens(now=None):
    """Whether a notification would reach anyone: an external hub (which knows its own
    subscribers), or a subscription at the built-in hub whose lease is not over. One query."""
    if app_settings.HUB_URL:
        return True
    return Subscription.objects.filter(expires__gt=now or timezone.now()).exists()


def announce(on_made=None):
    """Record the notifications due on every channel, each in the transaction that advances its
    channel; ``on_made(notification)`` is called once that transaction has committed. Every
    channel is looked at, whichever set changed: a run that was lost (a broker outage, a process
    that died) is made up by the next. A set whose notifications cannot be made is logged and
    skipped; the others go on. Returns the notifications made."""
    made = []

    def keep(found):
        for notification in found:
            made.append(notification)
            if on_made is not None:
                on_made(notification)

    for capability in (capabilities.FRAMEWORK_NOTIFICATION, capabilities.CHANGE_NOTIFICATION):
        known = set(Channel.objects.filter(capability=capability).values_list("resource_set_id", flat=True))
        for resource_set in ResourceSet.objects.order_by("pk"):
            offers = resource_set.enabled and resource_set.has_capability(capability)
            try:
                if capability == capabilities.FRAMEWORK_NOTIFICATION:
                    # A set that stopped offering the channel (or was disabled) is told once
                    # more, if its channel had told of anything: its Capability List changed,
                    # or is gone.
                    if offers or resource_set.pk in known:
                        keep(_framework(resource_set, offers))
                elif offers:
                    keep(_changes(resource_set))
                elif resource_set.pk in known:
                    # Offered again later, it tells of changes from then on, not of those meanwhile.
                    Channel.objects.filter(resource_set=resource_set, capability=capability).delete()
            except Exception:
                logger.exception("Set %s: its %s could not be announced; the next run tries again", resource_set.slug, capability)
    return made


def _channel(resource_set, capability, initial):
    """The set's channel row, locked; created (announcing nothing) with ``initial()``'s values."""
    channel = Channel.objects.select_for_update().filter(resource_set=resource_set, capability=capability).first()
    if channel is None:
        Channel.objects.get_or_create(resource_set=resource_set, capability=capability, defaults=initial())
        return None
    return channel


def _changes(resource_set):
    limit = app_settings.MAX_ENTRIES_PER_DOCUMENT
    while True:
        with transaction.atomic():
            channel = _channel(resource_set, capabilities.CHANGE_NOTIFICATION, lambda: {
                "last_event": ChangeEvent.objects.filter(resource_set=resource_set).aggregate(m=Max("id"))["m"] or 0
            })
            if channel is None:
                return  # a new channel: it tells of changes from now on
            events = list(
                ChangeEvent.objects.filter(resource_set=resource_set, id__gt=channel.last_event)
                .order_by("id").values_list("id", "entry_xml")[:limit]
            )
            if not events:
                return
            entries, writer = [], DocumentWriter()
            for _id, entry in events:
                if entries and not writer.fits(len(entry.encode()), limit, app_settings.MAX_DOCUMENT_BYTES):
                    break
                writer.add(entry)
                entries.append(entry)
            writer.discard()
            channel.last_event = events[len(entries) - 1][0]
            channel.save(update_fields=["last_event"])
            notification = _record(resource_set, capabilities.CHANGE_NOTIFICATION, entries)
        yield notification


def _description():
    """The Source Description's state, as a framework notification tells of it."""
    body, last_modified = capabilitylist.source_description()
    return {"marker": hashlib.sha256(body).hexdigest(), "loc": uris.source_description_uri(), "index": None,
            "datetime": w3c_datetime(last_modified) if last_modified else None}


def framework_state(resource_set, description, offers=True):
    """``{capability: notice}`` of every document the set's framework channel tells of."""
    state = {capabilities.DESCRIPTION: description}
    if not offers:
        return state
    for name, _changed in capabilitylist.published_capabilities(resource_set):
        capability = capabilities.get(name)
        notice = getattr(capability.builder, "notice", None)
        if capability.channel or notice is None:
            continue
        found = notice(resource_set)
        if found is not None:
            state[name] = found
    rendered = capabilitylist.capability_list(resource_set)
    if rendered is not None:
        state[capabilities.CAPABILITYLIST] = {
            "marker": hashlib.sha256(rendered[0]).hexdigest(), "loc": uris.capability_list_uri(resource_set), "index": None,
            "datetime": w3c_datetime(rendered[1]),
        }
    return state


#: The order in which a framework notification lists its entries.
ORDER = [capabilities.DESCRIPTION, capabilities.CAPABILITYLIST, *(c.name for c in capabilities.TABLE)]


def _framework(resource_set, offers):
    with transaction.atomic():
        channel = _channel(resource_set, capabilities.FRAMEWORK_NOTIFICATION,
                           lambda: {"announced": framework_state(resource_set, _description())})
        if channel is None:
            return []
        # Read under the channel's lock: a run that started earlier cannot tell an older state.
        # A set still enabled that stopped offering the channel is told of as it is (its
        # Capability List lost the channel); a disabled one, as gone.
        now = framework_state(resource_set, _description(), resource_set.enabled)
        before = channel.announced or {}
        entries = []
        for name in sorted(set(before) | set(now), key=ORDER.index):
            change = payloads.change_type(name, before.get(name), now.get(name))
            if change is None:
                continue
            notice = now.get(name) or before[name]
            entries.append(payloads.framework_entry(
                notice["loc"], change, name, notice["datetime"] if change != "deleted" else w3c_datetime(timezone.now()),
                notice["index"],
            ))
        if not offers:
            channel.delete()  # told once that its set went, or stopped offering it; nothing more
        else:
            channel.announced = now
            channel.save(update_fields=["announced"])
        if not entries:
            return []
        notification = _record(resource_set, capabilities.FRAMEWORK_NOTIFICATION, entries,
                               up=capabilities.CAPABILITYLIST in now)
    return [notification]


def _record(resource_set, capability, entries, *, up=True):
    """A notification of ``entries`` and its deliveries (in the caller's transaction)."""
    payload = payloads.render(resource_set, capability, entries, up=up).decode()
    notification = Notification.objects.create(
        resource_set=resource_set, capability=capability, payload=payload, entries=len(entries)
    )
    now = timezone.now()
    if app_settings.HUB_URL and not resource_set.is_public:
        deliveries = []  # an external hub would hand a restricted set's changes to anyone (check W015)
    elif app_settings.HUB_URL:
        give_up = now + timedelta(seconds=app_settings.HUB_GIVE_UP_SECONDS)
        deliveries = [Delivery(notification=notification, target=app_settings.HUB_URL, to_hub=True, give_up=give_up)]
    else:
        subscribers = Subscription.objects.filter(resource_set=resource_set, capability=capability)
        subscribers.filter(expires__lte=now).delete()  # their lease is over
        if not resource_set.is_public:
            # A restricted set's notifications go to the holders of a valid token for it only.
            subscribers = subscribers.filter(
                Q(token__expires__isnull=True) | Q(token__expires__gt=now), token__revoked__isnull=True,
                token__sets=resource_set,
            )
        deliveries = [
            Delivery(notification=notification, subscription=subscription, target=subscription.callback,
                     give_up=subscription.expires)
            for subscription in subscribers.filter(expires__gt=now)
        ]
    Delivery.objects.bulk_create(deliveries)
    return notification


def prune(now=None):
    """Forget subscriptions whose lease is over, and notifications older than
    ``NOTIFICATION_RETENTION`` (with their deliveries), except each channel's latest (its
    topic serves it) and those still being delivered. Returns how many notifications went."""
    now = now or timezone.now()
    Subscription.objects.filter(expires__lte=now).delete()
    latest = (
        Notification.objects.values("resource_set", "capability").annotate(latest=Max("id")).values_list("latest", flat=True)
    )
    old = Notification.objects.filter(created__lt=now - timedelta(seconds=app_settings.NOTIFICATION_RETENTION))
    old = old.exclude(pk__in=list(latest)).exclude(deliveries__state=Delivery.State.PENDING)
    return old.delete()[1].get(Notification._meta.label, 0)
