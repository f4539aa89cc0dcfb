"""URLs of the API, included by :mod:`django_resourcesync.urls` at ``resourcesync/api/``.

Any other path under it is a JSON 404: the slug ``api`` is reserved, so nothing under it is a
set's document.
"""

from django.urls import path, re_path

from . import schema, views
from .routes import router

app_name = "api"

urlpatterns = [
    path("schema/", schema.SchemaView.as_view(), name="schema"),
    path("schema/ui/", schema.SchemaPageView.as_view(), name="schema-ui"),
    *router.urls,
    re_path(r"^", views.not_found),
]
