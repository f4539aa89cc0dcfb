"""Render a page of the site in process, to learn the exact bytes a Destination will fetch."""

from urllib.parse import urlsplit

from django.test.client import Client

from .conf import app_settings
from .sources import UnpublishableResource


def render_location(location):
    """GET ``location`` (a path, or a URI under BASE_URL) through the whole request handling.

    The request passes through the middleware and URLconf as an anonymous visitor's would, with
    the host and scheme of ``BASE_URL``. Returns ``(body, content_type)`` for a 200 answer;
    raises :class:`~django_resourcesync.sources.UnpublishableResource` for any other.
    """
    parts = urlsplit(str(location))
    base = urlsplit(app_settings.BASE_URL or "http://localhost")
    secure = base.scheme == "https"
    client = Client(raise_request_exception=False, SERVER_NAME=base.hostname or "localhost", SERVER_PORT=str(base.port or (443 if secure else 80)))
    path = parts.path or "/"
    response = client.get(path, QUERY_STRING=parts.query, secure=secure)
    if response.status_code != 200:
        raise UnpublishableResource(f"{location} answered {response.status_code}")
    body = b"".join(response.streaming_content) if response.streaming else response.content
    return body, response.get("Content-Type")
