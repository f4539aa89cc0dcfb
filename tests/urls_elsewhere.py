"""A second URLconf, for the tests of reverse() learnt per URLconf: the example's repository under
another path, a pattern written as a regular expression, and one that starts with a parameter."""

from django.http import HttpResponse
from django.urls import include, path, re_path

urlpatterns = [
    path("elsewhere/", include("example_project.repository.urls")),
    re_path(r"^regex/(?P<pk>[0-9]+)/$", lambda request, pk: HttpResponse(pk), name="elsewhere-regex"),
    path("<path:name>", lambda request, name: HttpResponse(name), name="elsewhere-any"),
]
