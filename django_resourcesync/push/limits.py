"""The built-in hub's limits: what one client, or one callback host, may ask of it.

Every (un)subscription request the hub takes makes it request a URL that anyone may give it
(the verification), and every subscription costs a delivery per notification of its channel.
So, with the settings (``None``: no limit):

- ``HUB_REQUESTS_PER_CLIENT`` (``"60/hour"``): requests taken from one client in the period (a
  client as :func:`~django_resourcesync.clients.client_key` tells it: its address, behind the
  proxies the site declares; an IPv6 client by its ``/64``);
- ``HUB_SUBSCRIPTIONS_PER_HOST`` (100): subscriptions whose callbacks are on one host, those
  made (lease not over) and those being verified; renewing one is always taken;
- ``HUB_PENDING_VERIFICATIONS`` (100): verifications waiting or under way, all clients together.

A request past one is answered ``429`` with ``Retry-After`` (seconds) and the reason, and counts
for nothing. The requests are rows (:class:`~django_resourcesync.models.SubscriptionRequest`),
so the limits hold across the site's processes; each is written before it is counted, and
counted with those written before it only: requests that arrive at once never take more than
the limit.
"""

import math
from datetime import timedelta
from urllib.parse import urlsplit

from django.db.models import F, Func, Min, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from ..clients import SECONDS
from ..conf import DEFAULTS, app_settings, rate_setting
from ..models import Subscription, SubscriptionRequest

#: A request being admitted is claimed so (for :data:`ADMITTING`): no verifier takes it; one whose
#: process died before it was admitted is forgotten.
ADMITTING_CLAIM = "admitting"
ADMITTING = timedelta(seconds=60)


class Limited(Exception):
    """A request past one of the hub's limits: ``retry_after`` seconds, and why."""

    def __init__(self, reason, retry_after):
        super().__init__(reason)
        self.retry_after = max(1, math.ceil(retry_after))


def host_of(callback):
    return (urlsplit(callback).hostname or "")[:255]


def rate():
    """``(requests, seconds)`` of ``HUB_REQUESTS_PER_CLIENT``; ``None`` for no limit."""
    value = rate_setting("HUB_REQUESTS_PER_CLIENT")
    if value is None:
        return None
    count, period = value.split("/")
    return int(count), SECONDS[period[0]]


def _limit(key):
    value = getattr(app_settings, key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else (
        None if value is None else DEFAULTS[key])


def admit(client, mode, resource_set, capability, callback, lease_seconds, secret, token=None):
    """The :class:`~django_resourcesync.models.SubscriptionRequest` of a request that passed
    :func:`~.hub.parse_request`, written, for its verification to be queued; :class:`Limited`
    when it is past a limit (and then nothing is kept of it)."""
    now = timezone.now()
    per_client = rate()
    # What no limit counts any more goes (the period of the rate; verifications long done).
    kept = max(per_client[1] if per_client else 0, 3600)
    SubscriptionRequest.objects.filter(
        Q(done__isnull=False, created__lt=now - timedelta(seconds=kept)) | Q(claim=ADMITTING_CLAIM, created__lt=now - ADMITTING)
    ).delete()
    row = SubscriptionRequest.objects.create(
        mode=mode, resource_set=resource_set, capability=capability, callback=callback, host=host_of(callback),
        lease_seconds=lease_seconds, secret=secret, token=token, client=client, created=now, claim=ADMITTING_CLAIM,
        claimed_until=now + ADMITTING,
    )
    try:
        _check(row, per_client, now)
    except Limited:
        row.delete()
        raise
    SubscriptionRequest.objects.filter(pk=row.pk).update(claim="", claimed_until=None)
    return row


def _check(row, per_client, now):
    before = SubscriptionRequest.objects.filter(pk__lte=row.pk)
    pending_cap = _limit("HUB_PENDING_VERIFICATIONS")
    if pending_cap is not None and before.filter(done__isnull=True).count() > pending_cap:
        raise Limited(f"the hub is verifying {pending_cap} requests already; ask again later",
                      app_settings.HUB_TIMEOUT)
    if per_client is not None:
        allowed, seconds = per_client
        window = before.filter(client=row.client, created__gt=now - timedelta(seconds=seconds))
        if window.count() > allowed:
            oldest = window.aggregate(first=Min("created"))["first"]
            raise Limited(f"more than {allowed} requests from {row.client} in {_period(seconds)}",
                          (oldest + timedelta(seconds=seconds) - now).total_seconds())
    host_cap = _limit("HUB_SUBSCRIPTIONS_PER_HOST")
    if host_cap is None or row.mode != "subscribe":
        return
    mine = {"resource_set": row.resource_set_id, "capability": row.capability, "callback": row.callback}
    if Subscription.objects.filter(**mine).exists():
        return  # a renewal: it adds none
    made = Subscription.objects.filter(host=row.host, expires__gt=now)
    waiting = before.filter(host=row.host, mode="subscribe", done__isnull=True).exclude(**mine).exclude(pk=row.pk)
    # Both counted in one statement: a verification that ends meanwhile is counted once.
    counts = SubscriptionRequest.objects.filter(pk=row.pk).annotate(made=_count(made), waiting=_count(waiting))
    if sum(counts.values_list("made", "waiting").get()) >= host_cap:
        ends = made.aggregate(first=Min("expires"))["first"]
        wait = app_settings.HUB_TIMEOUT if waiting.exists() or ends is None else (ends - now).total_seconds()
        raise Limited(f"{host_cap} subscriptions have callbacks on {row.host} already", wait)


def _count(queryset):
    """The number of rows of ``queryset``, as a subquery."""
    return Coalesce(Subquery(queryset.order_by().annotate(rows=Func(F("pk"), function="COUNT")).values("rows")), 0)


def _period(seconds):
    return {1: "a second", 60: "a minute", 3600: "an hour", 86400: "a day"}[seconds]
