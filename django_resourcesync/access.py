"""Restricted sets: what partners read with a bearer token (RFC 6750).

A set whose ``access`` is ``"token"`` serves its documents (Capability List, lists, dumps,
archives, prior versions, notification channels) only to requests that carry, in
``Authorization: Bearer <token>``, a token issued for that set. Without a token, or with one that
is unknown, expired or revoked, the answer is 401 with ``WWW-Authenticate: Bearer``; with a valid
token for other sets only, 403. A client that sent ``AUTH_FAILURE_RATE`` tokens that are not
valid gets 429 with ``Retry-After`` for any token until the period ends (see
:mod:`django_resourcesync.clients`). The public Source Description does not list such a set
(unless ``LIST_TOKEN_SETS``), nor do discovery links, robots.txt or the REST API's public
answers.

Tokens are issued per Destination (:func:`issue`: the admin, the REST API and ``manage.py
resourcesync_token`` call it). Only a SHA-256 digest of a token is kept: the token is shown once.
Every request looks its token up, so a revocation (:func:`revoke`) holds at once, and every use is
logged (logger ``django_resourcesync.access``, INFO) with the Destination's name.

The site's own views of the resources accept the same tokens: :func:`token_access` (a decorator)
and :class:`TokenAccessMixin` set ``request.resourcesync_partner`` to the token of a request that
may read the sets named, so that a view can show such a request what it shows nobody else.
Whatever a token opens is sent with ``Cache-Control: private`` and ``Vary: Authorization``: no
shared cache hands it to the next visitor.
"""

import functools
import hashlib
import logging
import secrets
from datetime import timedelta

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404, HttpResponse
from django.urls import get_resolver, get_urlconf
from django.utils import timezone
from django.utils.cache import patch_cache_control, patch_vary_headers

from . import clients
from .models import AccessToken, ResourceSet, Subscription

logger = logging.getLogger(__name__)

PUBLIC, TOKEN = "public", "token"
#: Tokens begin with it: a leaked one is recognised for what it is (secret scanners, logs).
TOKEN_PREFIX = "rs_"
#: Characters of a token kept in clear, to tell tokens apart in lists.
SHOWN = 10
REALM = "resourcesync"
#: ``last_used`` is written at most this often per token: not a database write per request.
LAST_USED_EVERY = timedelta(minutes=1)
MAX_TOKEN_LENGTH = 200


def digest(token):
    """What is kept of a token: its SHA-256 (a token has 256 random bits: no slow hash needed)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token():
    """``(token, what of it is kept)``: a new token, and the fields of its record (its digest
    and its first characters)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return token, {"digest": digest(token), "prefix": token[:SHOWN]}


def issue(name, sets, *, expires=None):
    """Issue a token to the Destination ``name`` for the resource sets ``sets``, valid until
    ``expires`` (``None``: until revoked). Returns ``(record, token)``: the token itself exists
    nowhere else, so show it once and forget it."""
    token, kept = new_token()
    with transaction.atomic():
        record = AccessToken.objects.create(name=name, expires=expires, **kept)
        record.sets.set(sets)
    logger.info("Token %s… issued to %s for %s", record.prefix, name, ", ".join(s.slug for s in record.sets.all()) or "no set")
    return record, token


def revoke(tokens):
    """Revoke the tokens of the queryset ``tokens`` now, and end the subscriptions they made;
    returns how many were valid."""
    now = timezone.now()
    with transaction.atomic():
        ids = list(tokens.filter(revoked__isnull=True).values_list("pk", flat=True))
        AccessToken.objects.filter(pk__in=ids).update(revoked=now)
        Subscription.objects.filter(token_id__in=ids).delete()
    for record in AccessToken.objects.filter(pk__in=ids):
        logger.info("Token %s… of %s revoked", record.prefix, record.name)
    return len(ids)


class Denied(Exception):
    """A request the token rules refuse: 401 (no valid token), 403 (not for this set) or 429
    (too many failed tokens from its client: ``retry_after`` seconds to wait)."""

    def __init__(self, status, message, error=None, *, retry_after=None):
        super().__init__(message)
        self.status, self.message, self.error, self.retry_after = status, message, error, retry_after

    def response(self):
        response = HttpResponse(self.message + "\n", status=self.status, content_type="text/plain; charset=utf-8")
        if self.retry_after is not None:
            response["Retry-After"] = str(self.retry_after)
        else:
            challenge = f'Bearer realm="{REALM}"'
            if self.error:
                challenge += f', error="{self.error}", error_description="{self.message}"'
            response["WWW-Authenticate"] = challenge
        return private(response)


def private(response):
    """Mark a response that depends on the request's token: no shared cache may keep it."""
    patch_cache_control(response, private=True)
    patch_vary_headers(response, ["Authorization"])
    return response


def _bearer_value(request):
    """What follows ``Bearer`` in the request's ``Authorization`` header; ``None`` for another
    scheme (Basic, say, is not this app's) or none."""
    scheme, _space, value = request.headers.get("Authorization", "").strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def bearer(request):
    """The token of the request's ``Authorization: Bearer`` header; ``None`` without one."""
    value = _bearer_value(request)
    if value is None:
        return None
    if not value or len(value) > MAX_TOKEN_LENGTH or any(not 33 <= ord(char) <= 126 for char in value):
        raise Denied(401, "The bearer token is malformed.", "invalid_token")
    return value


_UNSET = object()


def token_of(request):
    """The valid :class:`~django_resourcesync.models.AccessToken` the request carries, ``None``
    if it carries none; :class:`Denied` for an unknown, expired or revoked one. Looked up once
    per request. A client that sent ``AUTH_FAILURE_RATE`` tokens that are not valid is refused
    any token, a valid one included, until the period ends (:class:`Denied`, 429)."""
    found = getattr(request, "_resourcesync_token", _UNSET)
    if found is _UNSET:
        try:
            found = _counted_look_up(request)
        except Denied as denied:
            found = denied
        request._resourcesync_token = found
    if isinstance(found, Denied):
        raise found
    return found


def _counted_look_up(request):
    if _bearer_value(request) is None:
        return None
    wait = clients.authentication_wait(request)
    if wait is not None:
        raise Denied(429, f"Too many tokens that are not valid came from your address: try again in {wait} s.",
                     retry_after=wait)
    try:
        return _look_up(bearer(request))
    except Denied:
        clients.authentication_failed(request)
        raise


def _look_up(value):
    if value is None:
        return None
    record = AccessToken.objects.filter(digest=digest(value)).first()
    if record is None:
        raise Denied(401, "The bearer token is not one this Source issued.", "invalid_token")
    state = record.state()
    if state != "valid":
        raise Denied(401, f"The bearer token is {state}.", "invalid_token")
    record.set_ids = frozenset(record.sets.values_list("pk", flat=True))
    return record


def check(request, resource_set):
    """Whether the request may read ``resource_set``'s documents: returns the token it read them
    with (``None`` for a public set), or raises :class:`Denied`."""
    if resource_set.is_public:
        return None
    request._resourcesync_private = True
    record = token_of(request)
    if record is None:
        raise Denied(401, f"The set {resource_set.slug} is for partners: send a token issued for it "
                          "(Authorization: Bearer).")
    if resource_set.pk not in record.set_ids:
        raise Denied(403, f"This token is not for the set {resource_set.slug}.", "insufficient_scope")
    used(request, record, resource_set.slug)
    return record


def used(request, record, where):
    """Log a use of a token, with its Destination's name, and note when it was last used."""
    logger.info("%s read %s %s with token %s… (%s)", record.name, request.method, request.get_full_path()[:500],
                record.prefix, where)
    now = timezone.now()
    if record.last_used is None or now - record.last_used >= LAST_USED_EVERY:
        AccessToken.objects.filter(pk=record.pk).update(last_used=now)
        record.last_used = now


def guarded(view):
    """A view of the app's own documents: :class:`Denied` becomes its 401 or 403, and a
    response a token opened is marked private."""

    @functools.wraps(view)
    def wrapped(request, *args, **kwargs):
        try:
            response = _answer(view, request, *args, **kwargs)
        except Denied as denied:
            return denied.response()
        if getattr(request, "_resourcesync_private", False):
            private(response)
        return response

    return wrapped


def _answer(view, request, *args, **kwargs):
    """The view's response; a 404 or 403 it raises is made here, as the site's handler makes it,
    so that it can be marked too (no cache may hand one token's 404 to another request)."""
    try:
        return view(request, *args, **kwargs)
    except (Http404, PermissionDenied) as exc:
        status = 404 if isinstance(exc, Http404) else 403
        handler = get_resolver(get_urlconf()).resolve_error_handler(status)
        return handler(request, exception=exc)


def partner(request, slugs):
    """The token of a request to a site's view of resources listed by the restricted sets
    ``slugs`` (any restricted set, if empty), if it may read one of them; ``None`` for a request
    without a token, or with a token for other sets (a Destination sends its token with every
    request: the view answers it as it answers anyone); :class:`Denied` (401) for an unknown,
    expired or revoked token."""
    record = token_of(request)
    if record is None:
        return None
    sets = ResourceSet.objects.filter(pk__in=record.set_ids, enabled=True).exclude(access=PUBLIC)
    allowed = sorted((sets.filter(slug__in=slugs) if slugs else sets).values_list("slug", flat=True))
    if not allowed:
        return None
    used(request, record, ", ".join(allowed))
    return record


def token_access(*slugs):
    """Decorate a site's view of resources that the restricted sets ``slugs`` list (all of them,
    without slugs). A request with a token for one of them has ``request.resourcesync_partner``
    set to it (``None`` otherwise): the view may then show what it shows partners only. A request
    with an invalid token gets 401, with a token for other sets 403. Every answer varies by
    ``Authorization`` and those a token opened are private::

        @token_access("all-records")
        def record(request, pk):
            items = Item.objects.all() if request.resourcesync_partner else Item.objects.filter(is_public=True)
            ...
    """

    def decorator(view):
        @functools.wraps(view)
        def wrapped(request, *args, **kwargs):
            try:
                request.resourcesync_partner = partner(request, slugs)
            except Denied as denied:
                return denied.response()
            return _varied(request, _answer(view, request, *args, **kwargs))

        return wrapped

    return decorator


class TokenAccessMixin:
    """:func:`token_access` for a class-based view: ``token_sets`` names the restricted sets."""

    token_sets = ()

    def dispatch(self, request, *args, **kwargs):
        try:
            request.resourcesync_partner = partner(request, tuple(self.token_sets))
        except Denied as denied:
            return denied.response()
        return _varied(request, _answer(super().dispatch, request, *args, **kwargs))


def _varied(request, response):
    if request.resourcesync_partner is not None:
        return private(response)
    patch_vary_headers(response, ["Authorization"])
    return response


def _forget_subscriptions_outside(sender, instance, action, reverse, **kwargs):
    """A token's sets changed: the subscriptions it made to the channels of sets it no longer
    opens end (a set's tokens changed: those of its subscriptions whose token no longer opens it)."""
    if action not in ("post_remove", "post_clear"):
        return
    if reverse:  # instance is a set
        Subscription.objects.filter(resource_set=instance, token__isnull=False).exclude(token__sets=instance).delete()
    else:
        Subscription.objects.filter(token=instance).exclude(resource_set__in=instance.sets.all()).delete()


def connect():
    """Wire the receivers (called when the app is ready)."""
    from django.db.models.signals import m2m_changed

    m2m_changed.connect(_forget_subscriptions_outside, sender=AccessToken.sets.through,
                        dispatch_uid="resourcesync_token_sets_changed")
