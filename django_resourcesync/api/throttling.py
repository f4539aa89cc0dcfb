"""How often an anonymous client may call the API: ``RESOURCESYNC["API_ANON_RATE"]``.

The rate is the app's own setting rather than DRF's ``DEFAULT_THROTTLE_RATES["anon"]``, so that
a site which configures no DRF throttling still has the API limited (and does not get DRF's
``ImproperlyConfigured`` for a missing rate). The throttles a site configures for its DRF views
(``DEFAULT_THROTTLE_CLASSES``) apply to the API's views as well, after this one.

A client is counted by :func:`django_resourcesync.clients.client_key`: its address, not what
``X-Forwarded-For`` says unless the request comes from a proxy in ``TRUSTED_PROXIES`` (DRF's
own rule believes the header of anyone while ``NUM_PROXIES`` is unset).
"""

import logging

from rest_framework.settings import api_settings
from rest_framework.throttling import AnonRateThrottle

from ..clients import client_key
from ..conf import DEFAULTS, app_settings, is_rate

logger = logging.getLogger(__name__)


class AnonymousRateThrottle(AnonRateThrottle):
    """Requests of clients that are not logged in, counted per client in the default cache."""

    scope = "resourcesync_anon"

    def get_rate(self):
        rate = app_settings.API_ANON_RATE
        if rate is None or is_rate(rate):
            return rate
        # Reported by the system check resourcesync.E026; meanwhile the default limit holds,
        # rather than none, and the request is answered (never a 500).
        logger.warning("RESOURCESYNC['API_ANON_RATE'] = %r is not a rate; using %s", rate, DEFAULTS["API_ANON_RATE"])
        return DEFAULTS["API_ANON_RATE"]

    def get_ident(self, request):
        return client_key(request)


def throttles():
    """The throttles of every view of the API: the app's, then the site's defaults."""
    return [AnonymousRateThrottle(), *(throttle() for throttle in api_settings.DEFAULT_THROTTLE_CLASSES)]
