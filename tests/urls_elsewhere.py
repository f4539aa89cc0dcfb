"""A second URLconf, for the tests of reverse() learnt per URLconf: the example's repository under
another path, a pattern written as a regular expression, one that starts with a parameter, and a
page that shows a path it writes."""

from django.http import HttpResponse
from django.urls import include, path, re_path

from example_project.repository.models import item_path

urlpatterns = [
    path("writes/<int:pk>/", lambda request, pk: HttpResponse(item_path(pk=pk)), name="elsewhere-writes"),
    path("elsewhere/", include("example_project.repository.urls")),
    re_path(r"^regex/(?P<pk>[0-9]+)/$", lambda request, pk: HttpResponse(pk), name="elsewhere-regex"),
    path("<path:name>", lambda request, name: HttpResponse(name), name="elsewhere-any"),
]
