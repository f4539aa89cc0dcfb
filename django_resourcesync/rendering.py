"""Render a page of the site in process, to learn the exact bytes a Destination will fetch."""

import contextlib
import threading
from urllib.parse import urlsplit

from django.core.handlers.base import BaseHandler
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.test.client import RequestFactory
from django.urls import set_urlconf

from . import uris
from .conf import app_settings
from .exceptions import UnpublishableResource

_local = threading.local()
_middleware_generation = [0]


@receiver(setting_changed)
def _middleware_changed(setting, **kwargs):
    if setting == "MIDDLEWARE":
        _middleware_generation[0] += 1


def _handler():
    """This thread's request handler, with the site's middleware loaded once."""
    if getattr(_local, "generation", None) != _middleware_generation[0]:
        handler = BaseHandler()
        handler.load_middleware()
        _local.handler, _local.generation, _local.factories = handler, _middleware_generation[0], {}
    return _local.handler


@contextlib.contextmanager
def batch():
    """Pages rendered inside share what they read of the app's configuration (the sets a
    discovery link names, say): a batch of changes renders many pages in a moment, each of
    which would otherwise read it again. The objects described inside have their paths written
    for the URLconf and script prefix of the batch's start (:func:`~.uris.urls_fixed`)."""
    outer = getattr(_local, "shared", None)
    _local.shared = {} if outer is None else outer
    try:
        with uris.urls_fixed():
            yield
    finally:
        _local.shared = outer


def shared(key, load):
    """``load()``, once per :func:`batch` for ``key`` (every time outside one)."""
    found = getattr(_local, "shared", None)
    if found is None:
        return load()
    if key not in found:
        found[key] = load()
    return found[key]


def _factory(host, port):
    factories = _local.factories
    if (host, port) not in factories:
        factories[host, port] = RequestFactory(SERVER_NAME=host, SERVER_PORT=port)
    return factories[host, port]


def render_location(location):
    """GET ``location`` (a path, or a URI under BASE_URL) through the whole request handling.

    The request passes through the middleware and URLconf as an anonymous visitor's would (no
    cookies: no session, no CSRF cookie), with the host and scheme of ``BASE_URL``. Returns
    ``(body, content_type)`` for a 200 answer; raises
    :class:`~django_resourcesync.exceptions.UnpublishableResource` for any other.

    The handler is called directly, as a WSGI server's would be, but without the request
    signals: their receivers close the database connections of the thread between requests,
    and a page is often rendered inside a transaction of change tracking.
    """
    parts = urlsplit(str(location))
    base = urlsplit(app_settings.BASE_URL or "http://localhost")
    secure = base.scheme == "https"
    handler = _handler()
    request = _factory(base.hostname or "localhost", str(base.port or (443 if secure else 80))).get(
        parts.path or "/", QUERY_STRING=parts.query, secure=secure
    )
    request._resourcesync_rendering = True  # no discovery lookup: its headers go nowhere
    # The request's URLconf, whatever a middleware chooses, for the paths its page writes.
    with uris.urls_fixed(False), contextlib.ExitStack() as reset:
        reset.callback(set_urlconf, None)  # forget the URLconf chosen, as after a request
        response = handler.get_response(request)
        try:
            if response.status_code != 200:
                raise UnpublishableResource(f"{location} answered {response.status_code}")
            body = b"".join(response.streaming_content) if response.streaming else response.content
            return body, response.get("Content-Type")
        finally:
            # What response.close() does, but its request_finished signal: the files and the
            # request are closed.
            for close in getattr(response, "_resource_closers", ()):
                close()
