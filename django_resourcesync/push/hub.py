"""The hub: WebSub subscriptions (W3C WebSub, sections 5.1 to 5.3) and the delivery of
notifications (section 7), to subscribers of the built-in hub or to an external hub.

- A subscription request is checked at once (a 4xx with the reason when it is malformed, names
  no channel of this Source, or gives a callback the site refuses) and answered 202; the intent
  is then verified by a GET of the callback with ``hub.challenge`` (``resourcesync.verify_subscription``),
  and only a callback that echoes it is subscribed (or unsubscribed).
- A delivery POSTs the payload with ``Link`` headers (``self``, ``hub``, ``resourcesync``) and,
  for a subscription with a secret, ``X-Hub-Signature: sha256=<HMAC of the body>``. Anything but
  a 2xx is retried with growing pauses until the subscription's lease ends (an external hub's:
  ``HUB_GIVE_UP_SECONDS``); then the delivery is marked failed, for the admin to show.
- Callbacks on loopback, private, link-local and reserved addresses, or on IPv6 addresses that
  carry one (NAT64, 6to4), are refused, at subscription and at each request (connected to the
  address that was checked, so a name that resolves elsewhere the second time gains nothing),
  unless ``HUB_ALLOW_PRIVATE_CALLBACKS``; redirects are not followed.
"""

import hashlib
import hmac
import http.client
import ipaddress
import logging
import secrets
import socket
import ssl
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from urllib.parse import urlencode, urlsplit

from django.db import close_old_connections, transaction
from django.db.models import Count, Q
from django.urls import Resolver404, resolve
from django.utils import timezone

from .. import uris
from ..builders import channel as channels
from ..conf import app_settings
from ..models import AccessToken, Delivery, Notification, ResourceSet, Subscription, SubscriptionRequest
from . import DELIVER, VERIFY, announce, limits, queue

logger = logging.getLogger(__name__)

#: WebSub 5.1: "hub.secret ... MUST be less than 200 bytes".
MAX_SECRET_BYTES = 199
MIN_LEASE_SECONDS = 60
#: Bytes of a callback's answer read (a challenge is short).
MAX_ANSWER = 64 * 1024
#: The longest pause between two attempts of a delivery.
MAX_BACKOFF = 3600
SIGNATURE = "sha256"


class BadRequest(ValueError):
    """A subscription request the hub refuses; the message says why."""


class Refused(ValueError):
    """A callback on an address the site refuses."""


# --- requests ------------------------------------------------------------------------------


def parse_request(data):
    """``(mode, resource_set, capability, callback, lease_seconds, secret)`` of a subscription
    request (a POST's form), or :class:`BadRequest`."""
    mode = data.get("hub.mode")
    if mode not in ("subscribe", "unsubscribe"):
        raise BadRequest("hub.mode must be subscribe or unsubscribe" + ("" if mode != "publish" else
                         " (this Source publishes its own notifications)"))
    topic, callback = data.get("hub.topic", ""), data.get("hub.callback", "")
    if not topic:
        raise BadRequest("hub.topic is missing")
    if not callback:
        raise BadRequest("hub.callback is missing")
    resource_set, capability = topic_of(topic)
    check_callback(callback)
    lease = data.get("hub.lease_seconds")
    if lease in (None, ""):
        lease = min(app_settings.HUB_LEASE_SECONDS, app_settings.HUB_MAX_LEASE_SECONDS)
    else:
        try:
            lease = int(lease)
        except ValueError:
            raise BadRequest("hub.lease_seconds must be a whole number of seconds") from None
        if lease <= 0:
            raise BadRequest("hub.lease_seconds must be positive")
        lease = min(max(lease, MIN_LEASE_SECONDS), app_settings.HUB_MAX_LEASE_SECONDS)
    secret = data.get("hub.secret", "")
    if len(secret.encode()) > MAX_SECRET_BYTES:
        raise BadRequest("hub.secret must be less than 200 bytes")
    return mode, resource_set, capability, callback, lease, secret


def set_of_topic(topic):
    """The enabled set whose route ``topic`` names, whatever its channels; ``None`` for none."""
    try:
        match = resolve(urlsplit(topic).path)
    except (Resolver404, ValueError):
        return None
    slug = match.kwargs.get("slug")
    return ResourceSet.objects.filter(slug=slug, enabled=True).first() if isinstance(slug, str) else None


def topic_of(topic):
    """``(resource_set, capability)`` of a topic URI of this Source, or :class:`BadRequest`."""
    unknown = BadRequest("hub.topic is not a channel of this Source")
    try:
        match = resolve(urlsplit(topic).path)
    except (Resolver404, ValueError):
        raise unknown from None
    capability = match.kwargs.get("capability")
    if not capability or uris.topic_capability(match.kwargs.get("name")) != capability:
        raise unknown
    resource_set = ResourceSet.objects.filter(slug=match.kwargs.get("slug"), enabled=True).first()
    if resource_set is None or not resource_set.has_capability(capability) or uris.topic_uri(resource_set, capability) != topic:
        raise unknown
    return resource_set, capability


def check_callback(callback):
    """Refuse a callback that is not an http(s) URL or whose host the site refuses."""
    if len(callback) > 2048:
        raise BadRequest("hub.callback is longer than 2048 characters")
    try:
        parts = urlsplit(callback)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        raise BadRequest("hub.callback is not a URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequest("hub.callback must be an http or https URL")
    if any(ord(char) < 33 or ord(char) == 127 for char in callback):
        raise BadRequest("hub.callback must not contain spaces or control characters")
    try:
        address_of(parts)
    except Refused as exc:
        raise BadRequest(f"hub.callback refused: {exc}") from None


def address_of(parts, vetted=True):
    """The address to connect to for a URL's host; :class:`Refused` if there is none the site
    accepts (``vetted``: loopback, private and reserved ranges are refused unless allowed)."""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        found = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise Refused(f"its host does not resolve ({exc})") from None
    addresses = [info[4][0] for info in found]
    if not vetted or app_settings.HUB_ALLOW_PRIVATE_CALLBACKS:
        return addresses[0]
    for address in addresses:
        if acceptable(ipaddress.ip_address(address.split("%")[0])):
            return address
    raise Refused("its host is on a loopback, private or reserved address, or an IPv6 address that carries one "
                  "(see HUB_ALLOW_PRIVATE_CALLBACKS)")


#: IPv6 ranges no callback on the Internet is on, though they may reach IPv4 hosts where they are
#: routed: local-use NAT64 (RFC 8215, the site's own translator), IPv4-compatible (deprecated,
#: RFC 4291), IPv4-translated (SIIT, RFC 2765), Teredo (RFC 4380) and 6to4 (deprecated, RFC 7526;
#: Python 3.13 and later count it private whatever it carries, earlier ones global) addresses.
REFUSED_IPV6 = tuple(
    ipaddress.ip_network(net) for net in ("64:ff9b:1::/48", "::/96", "::ffff:0:0:0/96", "2001::/32", "2002::/16")
)
#: The well-known NAT64 prefix (RFC 6052): the last 32 bits are the IPv4 address it reaches.
NAT64 = ipaddress.ip_network("64:ff9b::/96")


def acceptable(ip):
    """Whether the hub may connect to ``ip``: a global unicast address, and, for an IPv6 address
    that carries an IPv4 one (IPv4-mapped, NAT64), one whose IPv4 address is too."""
    if ip.version == 6 and any(ip in network for network in REFUSED_IPV6):
        return False
    if not ip.is_global or ip.is_multicast:
        return False
    if ip.version == 4:
        return True
    carried = [ip.ipv4_mapped, ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in NAT64 else None]
    return all(acceptable(inner) for inner in carried if inner is not None)


# --- HTTP ----------------------------------------------------------------------------------


class _Connection(http.client.HTTPConnection):
    """Connects to the address checked, whatever the name resolves to now."""

    def __init__(self, host, port, address, **kwargs):
        super().__init__(host, port, **kwargs)
        self._address = address

    def connect(self):
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _SecureConnection(http.client.HTTPSConnection):
    def __init__(self, host, port, address, **kwargs):
        super().__init__(host, port, context=ssl.create_default_context(), **kwargs)
        self._address = address

    def connect(self):
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def request(method, url, *, body=None, headers=None, vetted=True):
    """``(status, first bytes of the answer)`` of one request (no redirect followed)."""
    parts = urlsplit(url)
    address = address_of(parts, vetted)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    kind = _SecureConnection if parts.scheme == "https" else _Connection
    connection = kind(parts.hostname, port, address, timeout=app_settings.HUB_TIMEOUT)
    # The socket's timeout bounds each read; this bounds the whole exchange (a callback that
    # answers a byte at a time must not hold the attempt, and its claim, for ever).
    deadline = threading.Timer(app_settings.HUB_TIMEOUT, _cut, [connection])
    deadline.start()
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        connection.request(method, target, body=body, headers={"User-Agent": "django-resourcesync hub", **(headers or {})})
        response = connection.getresponse()
        return response.status, response.read(MAX_ANSWER)
    finally:
        deadline.cancel()
        connection.close()


def _cut(connection):
    sock = connection.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def with_query(url, params):
    return url + ("&" if urlsplit(url).query else "?") + urlencode(params)


# --- verification of intent ----------------------------------------------------------------


class _Arrivals:
    """What wakes :func:`verify_pending` in this process: a request queued, a verification ended."""

    def __init__(self):
        self.changed = threading.Condition()
        self.count = 0

    def tell(self, *args):
        with self.changed:
            self.count += 1
            self.changed.notify_all()


_arrivals = _Arrivals()
#: Seconds between two looks for requests taken by other processes while verifications run here.
LOOK_AGAIN = 1.0


def subscribe_later(subscription_request):
    """Queue the verification of a request that :func:`~.limits.admit` took (a
    :class:`~django_resourcesync.models.SubscriptionRequest`), once its transaction commits."""

    def send():
        queue(VERIFY, request_id=subscription_request.pk)
        _arrivals.tell()

    transaction.on_commit(send)


def verify_pending():
    """Verify the requests waiting, oldest first, ``HUB_VERIFY_THREADS`` at a time (a thread
    each, at most half of them for the requests of one client), and those that arrive while any
    is under way: a callback that never answers holds one thread for ``HUB_TIMEOUT``, and no
    other request. Each is claimed for as long as its verification may last, so that two
    processes never verify it at once; one whose process died is verified once its claim runs
    out. Returns how many callbacks confirmed."""
    size = max(1, app_settings.HUB_VERIFY_THREADS)
    confirmed, under_way = 0, set()
    with ThreadPoolExecutor(size, thread_name_prefix="resourcesync-verify") as pool:
        while True:
            with _arrivals.changed:
                seen = _arrivals.count
            while len(under_way) < size and (row := _claim_request(size)) is not None:
                future = pool.submit(_in_thread, _verify_request, row)
                future.add_done_callback(_arrivals.tell)
                under_way.add(future)
            if not under_way:
                return confirmed
            with _arrivals.changed:
                if _arrivals.count == seen:
                    _arrivals.changed.wait(LOOK_AGAIN)
            for future in [future for future in under_way if future.done()]:
                under_way.discard(future)
                confirmed += future.result()


def stale_requests():
    """Whether a subscription request has waited a minute with no one verifying it (its
    process ended, or died, first)."""
    now = timezone.now()
    return SubscriptionRequest.objects.filter(
        _free(now), done__isnull=True, created__lte=now - timedelta(seconds=60),
    ).exclude(claim=limits.ADMITTING_CLAIM).exists()


def _claim_request(size):
    """The oldest request waiting that no one verifies, claimed, of a client that has fewer than
    half of ``size`` under way; ``None`` if there is none."""
    now = timezone.now()
    waiting = SubscriptionRequest.objects.filter(done__isnull=True)
    share = max(1, size // 2)
    busy = (waiting.filter(claimed_until__gt=now).exclude(claim=limits.ADMITTING_CLAIM).values("client")
            .annotate(under_way=Count("pk")).filter(under_way__gte=share).values_list("client", flat=True))
    free = waiting.filter(_free(now)).exclude(claim=limits.ADMITTING_CLAIM).exclude(client__in=list(busy))
    lease = timedelta(seconds=app_settings.HUB_TIMEOUT + 5)  # a verification's request ends by HUB_TIMEOUT
    for pk in free.order_by("pk").values_list("pk", flat=True)[:size]:
        token = uuid.uuid4().hex
        if waiting.filter(_free(now), pk=pk).update(claim=token, claimed_until=now + lease):
            return SubscriptionRequest.objects.get(pk=pk)
    return None


def _verify_request(row):
    """Verify one claimed request; it is done then, whatever came of it (in the transaction
    that applies it, if it is confirmed: the limit per host never counts it twice)."""

    def settle():
        SubscriptionRequest.objects.filter(pk=row.pk, claim=row.claim).update(
            done=timezone.now(), secret="", claim="", claimed_until=None,
        )

    try:
        return verify(row.mode, row.resource_set_id, row.capability, row.callback, row.lease_seconds, row.secret,
                      row.token_id, settle=settle)
    except Exception:
        logger.exception("The %s of %s could not be verified", row.mode, row.callback)
        return False
    finally:
        settle()  # (nothing left to do if it was applied)


def verify(mode, set_id, capability, callback, lease_seconds, secret="", token_id=None, settle=None):
    """Verify the intent of a (un)subscription by a GET of the callback; if it echoes the
    challenge, apply it (and call ``settle()`` in the same transaction). Returns whether it was
    verified. A subscription to a restricted set's channel is made only while the token it came
    with is valid for the set, and ends with it."""
    resource_set = ResourceSet.objects.filter(pk=set_id).first()
    if resource_set is None:
        return False
    token = AccessToken.objects.filter(pk=token_id).first() if token_id is not None else None
    if mode == "subscribe" and not resource_set.is_public and not _grants(token, resource_set):
        logger.info("Subscription of %s to %s not made: no valid token for the set", callback, resource_set.slug)
        return False
    challenge = secrets.token_urlsafe(24)
    params = {"hub.mode": mode, "hub.topic": uris.topic_uri(resource_set, capability), "hub.challenge": challenge}
    if mode == "subscribe":
        params["hub.lease_seconds"] = lease_seconds
    try:
        status, answer = request("GET", with_query(callback, params))
    except (OSError, http.client.HTTPException, Refused) as exc:
        logger.warning("Could not verify the %s of %s: %s", mode, callback, exc)
        return False
    if not 200 <= status < 300 or answer.strip() != challenge.encode():
        logger.info("%s of %s not verified (answer %s)", mode, callback, status)
        return False
    if mode == "unsubscribe":
        with transaction.atomic():
            Subscription.objects.filter(resource_set=resource_set, capability=capability, callback=callback).delete()
            if settle is not None:
                settle()
        return True
    if not announce.anyone_listens():
        # While nobody listened nothing was announced: the channels tell of what changed
        # meanwhile now, to no one, so that this subscriber hears of what changes from now on.
        announce.announce()
    now = timezone.now()
    expires = now + timedelta(seconds=lease_seconds)
    with transaction.atomic():
        subscription, _created = Subscription.objects.update_or_create(
            resource_set=resource_set, capability=capability, callback=callback,
            defaults={"secret": secret, "lease_seconds": lease_seconds, "expires": expires, "verified": now,
                      "token": token, "host": limits.host_of(callback)},
        )
        # A renewed lease: what waits for this callback is retried until the new end.
        Delivery.objects.filter(subscription=subscription, state=Delivery.State.PENDING).update(give_up=expires)
        if settle is not None:
            settle()
    return True


def _grants(token, resource_set):
    """Whether ``token`` (or ``None``) may read ``resource_set`` now."""
    return token is not None and token.state() == "valid" and token.sets.filter(pk=resource_set.pk).exists()


# --- delivery ------------------------------------------------------------------------------


def signature(secret, body):
    return f"{SIGNATURE}={hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()}"


class _Notification:
    """What the attempts at a notification's deliveries share, read once: the payload and the
    headers of its channel."""

    def __init__(self, notification):
        resource_set = notification.resource_set
        self.body = notification.payload.encode()
        self.headers = {"Content-Type": "application/xml", "Link": channels.link_header(resource_set, notification.capability)}
        self.topic = uris.topic_uri(resource_set, notification.capability)


def _attempt(delivery, notification):
    """``(status, error)`` of one attempt at a delivery."""
    body, headers = notification.body, dict(notification.headers)
    if delivery.to_hub and app_settings.HUB_PING == "thin":
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        body = urlencode({"hub.mode": "publish", "hub.url": notification.topic, "hub.topic": notification.topic}).encode()
    elif not delivery.to_hub:
        if delivery.subscription is None:
            return None, UNSUBSCRIBED  # ended (in the admin) while it waited: not sent
        subscription = delivery.subscription
        if not subscription.resource_set.is_public and (subscription.token is None or subscription.token.state() != "valid"):
            return None, UNSUBSCRIBED  # a restricted set's, whose token expired or went: not sent
        if delivery.subscription.secret:
            headers["X-Hub-Signature"] = signature(delivery.subscription.secret, body)
    try:
        status, _answer = request("POST", delivery.target, body=body, headers=headers, vetted=not delivery.to_hub)
    except Refused as exc:
        return None, f"refused: {exc}"
    except (OSError, http.client.HTTPException) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return status, "" if 200 <= status < 300 else f"answered {status}"


UNSUBSCRIBED = "unsubscribed"


def _free(now):
    return Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)


def stale_deliveries():
    """Whether a delivery has been due for a minute with no one attempting it."""
    now = timezone.now()
    return Delivery.objects.filter(
        _free(now), state=Delivery.State.PENDING, next_attempt__lte=now - timedelta(seconds=60),
    ).exists()


def deliver(ids=None, limit=1000):
    """Attempt the deliveries ``ids`` that are due (every due one, at most ``limit``, for
    ``None``), ``HUB_DELIVERY_THREADS`` at a time, and schedule another attempt of those that
    fail. Each group is claimed (one statement) just before its attempts, for as long as an
    attempt may last, and settled (one transaction) only where the claim is still the group's:
    a run that starts while another (or a dead process) holds a claim leaves that delivery
    alone, and looks again when the claim runs out. Returns ``(delivered, failed for good, to
    retry)``."""
    now = timezone.now()
    pending = Delivery.objects.filter(state=Delivery.State.PENDING)
    if ids is not None:
        pending = pending.filter(pk__in=ids)
    due = list(pending.filter(_free(now), next_attempt__lte=now).order_by("pk").values_list("pk", flat=True)[:limit])
    held = list(pending.exclude(pk__in=due).filter(claimed_until__gt=now).values_list("pk", "claimed_until")[:limit])
    if held:
        # Attempted elsewhere, or by a process that died: looked at again once the claims run out.
        until = max(end for _pk, end in held)
        queue(DELIVER, ids=None if ids is None else [pk for pk, _end in held],
              countdown=max((until - now).total_seconds(), 1))
    if not due:
        return 0, 0, 0
    shared = {}
    for notification in Notification.objects.filter(deliveries__pk__in=due).distinct().select_related("resource_set"):
        shared[notification.pk] = _Notification(notification)
    size = max(1, app_settings.HUB_DELIVERY_THREADS)
    counts, retry = [0, 0], {}
    with ThreadPoolExecutor(size) as pool:
        for start in range(0, len(due), size):
            for kind, pause, pk in _group(due[start : start + size], shared, pool):
                if kind == "retry":
                    retry.setdefault(pause, []).append(pk)
                else:
                    counts[kind == "failed"] += 1
    for pause, pks in retry.items():
        queue(DELIVER, ids=pks, countdown=pause)
    return counts[0], counts[1], sum(len(pks) for pks in retry.values())


def _in_thread(func, *args):
    try:
        return func(*args)
    finally:
        close_old_connections()


def _group(pks, shared, pool):
    """Claim, attempt and settle a group of deliveries; ``[(outcome, pause, pk)]`` of those
    that were this group's to attempt."""
    now = timezone.now()
    token = uuid.uuid4().hex
    lease = timedelta(seconds=app_settings.HUB_TIMEOUT + 5)  # an attempt ends by HUB_TIMEOUT (see request())
    Delivery.objects.filter(_free(now), pk__in=pks, state=Delivery.State.PENDING).update(claim=token, claimed_until=now + lease)
    deliveries = Delivery.objects.select_related("subscription__token", "subscription__resource_set")
    claimed = [d for d in deliveries.filter(claim=token) if d.notification_id in shared]
    if len(claimed) == 1:
        outcomes = [_attempt(claimed[0], shared[claimed[0].notification_id])]
    else:
        outcomes = list(pool.map(lambda d: _in_thread(_attempt, d, shared[d.notification_id]), claimed))
    now = timezone.now()
    settled = []
    with transaction.atomic():
        for delivery, (status, error) in zip(claimed, outcomes, strict=True):
            attempts = delivery.attempts + 1
            values = {"attempts": attempts, "last_status": status, "last_error": error[:2000], "claim": "",
                      "claimed_until": None}
            pause = None
            if not error:
                values.update(state=Delivery.State.DELIVERED, delivered=now)
                outcome = "delivered"
            else:
                pause = min(2 ** attempts, MAX_BACKOFF)
                values["next_attempt"] = now + timedelta(seconds=pause)
                if values["next_attempt"] > delivery.give_up or error == UNSUBSCRIBED:
                    values["state"] = Delivery.State.FAILED
                    outcome = "failed"
                    logger.warning("Notification %s to %s given up: %s", delivery.notification_id, delivery.target, error)
                else:
                    outcome = "retry"
            # Only while the claim is still this group's (a row deleted meanwhile is simply gone).
            if Delivery.objects.filter(pk=delivery.pk, claim=token).update(**values):
                settled.append((outcome, pause, delivery.pk))
    return settled
