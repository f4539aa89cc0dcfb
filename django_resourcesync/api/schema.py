"""The API's OpenAPI 3 schema, and the page that shows it (Swagger UI).

The schema describes the API's own routes only, whatever else the site routes to DRF views, so
that it is the same document in every site, and its generation gives no warning. The page's
scripts and styles are drf-spectacular-sidecar's, served by the site itself (``static``): never
from a CDN, whatever ``SPECTACULAR_SETTINGS`` say, so the page works offline and sends its
readers to no other host.

The schema names the app, its version and what the API is for (:data:`OWN_INFO`) where the
site's ``SPECTACULAR_SETTINGS`` leave them out: a site that sets its own title, version or
description keeps them.
"""

import json

from django.apps import apps
from django.conf import settings
from django.templatetags.static import static
from django.urls import include, path, reverse
from django.utils.translation import gettext as _
from drf_spectacular.settings import spectacular_settings
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.exceptions import APIException
from rest_framework.permissions import AllowAny
from rest_framework.renderers import JSONRenderer

from .. import __version__
from .openapi import ApiSchema, described
from .routes import router
from .throttling import ThrottledView

#: What the schema says of the API where the site's ``SPECTACULAR_SETTINGS`` say nothing.
OWN_INFO = {
    "TITLE": "django-resourcesync API",
    "VERSION": __version__,
    "DESCRIPTION": (
        "The REST API of a ResourceSync Source (ANSI/NISO Z39.99-2017) made with django-resourcesync: "
        "anyone reads the public resource sets and what they publish (builds, documents, changes); "
        "staff with the app's permissions manage the sets, rebuild them, and see the pending changes, "
        "the hub's subscriptions and the access tokens of partners."
    ),
}


class SchemaViewBase(ThrottledView):
    """The app's throttles; errors in JSON (not YAML, not an HTML page), as everywhere in the API."""

    schema = ApiSchema()
    permission_classes = [AllowAny]

    def handle_exception(self, exc):
        self.request.accepted_renderer, self.request.accepted_media_type = JSONRenderer(), "application/json"
        return super().handle_exception(exc)


class SchemaView(SchemaViewBase, SpectacularAPIView):
    """``/resourcesync/api/schema/``: YAML, or JSON with ``?format=json``."""

    @described(exclude=True)
    def get(self, request, *args, **kwargs):
        # The router's routes under the prefix they are served at (the site may include the
        # app's URLs under one of its own).
        prefix = reverse("resourcesync:api:api-root").lstrip("/")
        self.patterns = [path(prefix, include(router.urls))]
        # Read now (drf-spectacular reads the site's settings once, when it is first imported).
        configured = getattr(settings, "SPECTACULAR_SETTINGS", None) or {}
        self.custom_settings = {key: configured.get(key, value) for key, value in OWN_INFO.items()}
        return super().get(request, *args, **kwargs)


class SchemaPageUnavailable(APIException):
    status_code = 503
    default_code = "schema_page_unavailable"


class SchemaPageView(SchemaViewBase, SpectacularSwaggerView):
    """``/resourcesync/api/schema/ui/``: the schema, readable and tried out in a browser."""

    url_name = "resourcesync:api:schema"
    title = OWN_INFO["TITLE"]

    @described(exclude=True)
    def get(self, request, *args, **kwargs):
        missing = [app for app in ("drf_spectacular", "drf_spectacular_sidecar") if not apps.is_installed(app)]
        if missing:  # its template or its assets would be missing (check resourcesync.W010 says so)
            raise SchemaPageUnavailable(
                _("The schema page needs %(apps)s in INSTALLED_APPS; the schema itself is at %(schema)s.")
                % {"apps": ", ".join(missing), "schema": reverse(self.url_name)}
            )
        response = super().get(request, *args, **kwargs)
        ui_settings = spectacular_settings.SWAGGER_UI_SETTINGS
        if isinstance(ui_settings, dict):
            # Swagger UI would otherwise send the schema's URL to its public validator.
            response.data["settings"] = json.dumps({"validatorUrl": None, **ui_settings}, indent=2)
        return response

    @staticmethod
    def _swagger_ui_resource(filename):
        return static(f"drf_spectacular_sidecar/swagger-ui-dist/{filename}")

    @staticmethod
    def _swagger_ui_favicon():
        return static("drf_spectacular_sidecar/swagger-ui-dist/favicon-32x32.png")
