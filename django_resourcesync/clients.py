"""Who a client is, by its address, and how often it failed to authenticate.

:func:`client_address` is the address of the client that sent a request: ``REMOTE_ADDR``, the
peer of the connection, unless that peer is one of the proxies the site declares in
``RESOURCESYNC["TRUSTED_PROXIES"]`` (addresses or networks, ``"unix"`` for a proxy on a Unix
socket). Then ``X-Forwarded-For`` is read from the right, each hop a trusted proxy added being
skipped: the first address that is not a trusted proxy's is the client's. What a client writes
into the header itself is further left, so it is never reached; without declared proxies the
header is not read at all.

:func:`client_key` is what limits per client count by: the address, or for IPv6 its ``/64``
network (one subscriber of IPv6 holds a whole ``/64``, and could otherwise take a new address
for every request).

:func:`authentication_wait` and :func:`authentication_failed` count failed authentications (a
wrong password, an unknown token) per client key against ``RESOURCESYNC["AUTH_FAILURE_RATE"]``
in the default cache, as DRF's throttles count requests: a client past the rate is refused every
authentication, a right password included, until the period it failed in ends.
"""

import ipaddress
import logging
import math
import time
from functools import lru_cache

from django.core.cache import cache

from .conf import app_settings, rate_setting

logger = logging.getLogger(__name__)

#: The entry of ``TRUSTED_PROXIES`` that trusts a peer without an IP address: a proxy on the same
#: machine that talks to the site over a Unix socket (``REMOTE_ADDR`` is then empty or unset).
UNIX = "unix"
#: The client key of a local peer without an IP address (no address can be written so).
LOCAL = "local"
#: The prefix length of the IPv6 networks counted as one client.
IPV6_CLIENT_PREFIX = 64
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_proxies(value):
    """``(networks, unix, refused)`` of a ``TRUSTED_PROXIES`` value: the networks it trusts,
    whether it trusts a Unix socket's peer, and the entries it cannot use, each with the
    reason. A value that is not a list or tuple trusts nothing."""
    if not isinstance(value, (list, tuple)):
        return (), False, [(value, "is not a list or tuple")]
    networks, unix, refused = [], False, []
    for entry in value:
        if entry == UNIX:
            unix = True
            continue
        try:
            network = ipaddress.ip_network(entry, strict=False) if isinstance(entry, str) else None
        except ValueError:
            network = None
        if network is None:
            refused.append((entry, "is not an IP address or network"))
        elif network.prefixlen == 0:
            # Every hop would be skipped to the leftmost: the one the client writes itself.
            refused.append((entry, "covers every address (any client could name its own)"))
        else:
            networks.append(network)
    return tuple(networks), unix, refused


@lru_cache(maxsize=8)
def _trusted(value):
    networks, unix, _refused = parse_proxies(list(value))
    return networks, unix


def _trusted_proxies():
    value = app_settings.TRUSTED_PROXIES
    # A value the system check resourcesync.E032 reports trusts nothing, or its usable entries only.
    entries = tuple(entry for entry in value if isinstance(entry, str)) if isinstance(value, (list, tuple)) else ()
    return _trusted(entries)


def _address(text):
    """The IP address written in ``text`` (an X-Forwarded-For hop or ``REMOTE_ADDR``: ``1.2.3.4``,
    ``1.2.3.4:5678``, ``2001:db8::1``, ``[2001:db8::1]:443``), an IPv4-mapped one as IPv4; ``None``
    for anything else."""
    text = (text or "").strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]  # IPv4 with a port
    try:
        address = ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return None
    if address.version == 6 and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def _peer(request):
    """The IP address of the client: see the module's docstring; ``None`` for a local peer without one."""
    networks, unix = _trusted_proxies()

    def trusted(address):
        return unix if address is None else any(address in network for network in networks)

    client = _address(request.META.get("REMOTE_ADDR"))
    if not trusted(client):
        return client
    hops = request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:
            # Not an address (empty, "unknown"): the trusted hop on its right is as far as the
            # client can be told.
            break
        client = address
        if not trusted(address):
            break
    return client


def client_address(request):
    """The address of the client that sent ``request``, as text (``"203.0.113.7"``,
    ``"2001:db8::1"``): ``REMOTE_ADDR``, or behind declared proxies the address they forwarded
    for; ``"local"`` for a peer on a Unix socket without a trusted proxy's header."""
    address = _peer(request)
    return LOCAL if address is None else str(address)


def client_key(request):
    """What limits per client count ``request`` by: :func:`client_address`, or for IPv6 its
    ``/64`` network (``"2001:db8::/64"``)."""
    address = _peer(request)
    if address is None:
        return LOCAL
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/{IPV6_CLIENT_PREFIX}", strict=False))
    return str(address)


def _window(request):
    """``(cache key, requests allowed, seconds left)`` of the period of ``AUTH_FAILURE_RATE``
    the request falls in; ``None`` without a limit."""
    rate = rate_setting("AUTH_FAILURE_RATE")
    if rate is None:
        return None
    count, period = rate.split("/")
    seconds = SECONDS[period[0]]
    now = time.time()
    window = int(now // seconds)
    left = max(1, math.ceil((window + 1) * seconds - now))
    return f"resourcesync:auth-failures:{seconds}:{client_key(request)}:{window}", int(count), left


def authentication_wait(request):
    """Seconds the request's client must wait before it may authenticate again (it failed
    ``AUTH_FAILURE_RATE`` times in the current period); ``None`` if it may now."""
    window = _window(request)
    if window is None:
        return None
    key, allowed, left = window
    return left if (cache.get(key) or 0) >= allowed else None


def authentication_failed(request):
    """Count a failed authentication of the request's client (atomically where the cache is
    shared: Redis, Memcached)."""
    window = _window(request)
    if window is None:
        return
    key, _allowed, left = window
    cache.add(key, 0, left + 1)
    try:
        failures = cache.incr(key)
    except ValueError:  # the period ended between the two calls
        cache.set(key, 1, left + 1)
        failures = 1
    logger.info("Failed authentication %d from %s (%s %s)", failures, client_address(request), request.method,
                request.path[:200])
