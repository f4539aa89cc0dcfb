"""How often a client may call the API: ``RESOURCESYNC["API_ANON_RATE"]`` for clients that are
not logged in, ``RESOURCESYNC["AUTH_FAILURE_RATE"]`` for failed authentications.

The rate is the app's own setting rather than DRF's ``DEFAULT_THROTTLE_RATES["anon"]``, so that
a site which configures no DRF throttling still has the API limited (and does not get DRF's
``ImproperlyConfigured`` for a missing rate). The throttles a site configures for its DRF views
(``DEFAULT_THROTTLE_CLASSES``) apply to the API's views as well, after this one.

A client is counted by :func:`django_resourcesync.clients.client_key`: its address, not what
``X-Forwarded-For`` says unless the request comes from a proxy in ``TRUSTED_PROXIES`` (DRF's
own rule believes the header of anyone while ``NUM_PROXIES`` is unset).
"""

from django.utils.translation import gettext as _
from rest_framework.exceptions import AuthenticationFailed, Throttled
from rest_framework.settings import api_settings
from rest_framework.throttling import AnonRateThrottle

from ..clients import authentication_failed, authentication_wait, client_key
from ..conf import rate_setting


class AnonymousRateThrottle(AnonRateThrottle):
    """Requests of clients that are not logged in, counted per client in the default cache."""

    scope = "resourcesync_anon"

    def get_rate(self):
        # A rate that is not one is reported by the system check resourcesync.E026; meanwhile
        # the default limit holds, rather than none, and the request is answered (never a 500).
        return rate_setting("API_ANON_RATE")

    def get_ident(self, request):
        return client_key(request)


def throttles():
    """The throttles of every view of the API: the app's, then the site's defaults."""
    return [AnonymousRateThrottle(), *(throttle() for throttle in api_settings.DEFAULT_THROTTLE_CLASSES)]


class ThrottledView:
    """What every view of the API mixes in: the app's throttles, and authentication that counts
    failures against ``AUTH_FAILURE_RATE``: a client past it gets a 429 with ``Retry-After`` for
    any request with credentials (``Authorization``), before they are checked."""

    def get_throttles(self):
        return throttles()

    def perform_authentication(self, request):
        if "HTTP_AUTHORIZATION" in request.META:
            wait = authentication_wait(request)
            if wait is not None:
                raise Throttled(wait, _("Too many failed authentications from your address."))
        try:
            request.user  # authenticates
        except AuthenticationFailed:
            authentication_failed(request)
            raise
