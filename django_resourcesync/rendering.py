"""Render a page of the site in process, to learn the exact bytes a Destination will fetch."""

import threading
from http.cookies import SimpleCookie
from urllib.parse import urlsplit

from django.core.signals import setting_changed
from django.dispatch import receiver
from django.test.client import Client

from .conf import app_settings
from .sources import UnpublishableResource

_clients = threading.local()
_middleware_generation = [0]


@receiver(setting_changed)
def _middleware_changed(setting, **kwargs):
    if setting == "MIDDLEWARE":
        _middleware_generation[0] += 1


def _client(host, port):
    """A test client of this thread for ``host:port`` (building one loads the middleware)."""
    key = (host, port)
    cached = getattr(_clients, "by_host", None)
    if cached is None or getattr(_clients, "generation", None) != _middleware_generation[0]:
        cached = _clients.by_host = {}
        _clients.generation = _middleware_generation[0]
    if key not in cached:
        cached[key] = Client(raise_request_exception=False, SERVER_NAME=host, SERVER_PORT=port)
    client = cached[key]
    client.cookies = SimpleCookie()  # every request is a first visit: no session, no CSRF cookie
    return client


def render_location(location):
    """GET ``location`` (a path, or a URI under BASE_URL) through the whole request handling.

    The request passes through the middleware and URLconf as an anonymous visitor's would, with
    the host and scheme of ``BASE_URL``. Returns ``(body, content_type)`` for a 200 answer;
    raises :class:`~django_resourcesync.sources.UnpublishableResource` for any other.
    """
    parts = urlsplit(str(location))
    base = urlsplit(app_settings.BASE_URL or "http://localhost")
    secure = base.scheme == "https"
    client = _client(base.hostname or "localhost", str(base.port or (443 if secure else 80)))
    path = parts.path or "/"
    response = client.get(path, QUERY_STRING=parts.query, secure=secure)
    if response.status_code != 200:
        raise UnpublishableResource(f"{location} answered {response.status_code}")
    body = b"".join(response.streaming_content) if response.streaming else response.content
    return body, response.get("Content-Type")
