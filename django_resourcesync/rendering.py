"""Render a page of the site in process, to learn the exact bytes a Destination will fetch."""

import logging
from urllib.parse import unquote, urlsplit

from django.test.client import RequestFactory
from django.urls import Resolver404, resolve

from .conf import app_settings

logger = logging.getLogger(__name__)


def render_location(location):
    """GET ``location`` (a path, or a URI under BASE_URL) through the URLconf.

    Returns ``(body, content_type)`` for a 200 response, else ``None``.
    """
    parts = urlsplit(str(location))
    base = urlsplit(app_settings.BASE_URL or "http://localhost")
    path = unquote(parts.path or "/")
    try:
        match = resolve(path)
    except Resolver404:
        logger.warning("No view answers %s", location)
        return None
    secure = base.scheme == "https"
    factory = RequestFactory(SERVER_NAME=base.hostname or "localhost", SERVER_PORT=str(base.port or (443 if secure else 80)))
    request = factory.get(path, data=None, secure=secure, QUERY_STRING=parts.query)
    response = match.func(request, *match.args, **match.kwargs)
    if hasattr(response, "render") and callable(response.render):
        response = response.render()
    if response.status_code != 200:
        logger.warning("%s answered %s", location, response.status_code)
        return None
    body = b"".join(response.streaming_content) if response.streaming else response.content
    return body, response.get("Content-Type")
