"""A second URLconf, for the tests of reverse() learnt per URLconf: the example's repository under
another path, and a pattern written as a regular expression."""

from django.http import HttpResponse
from django.urls import include, path, re_path

urlpatterns = [
    path("elsewhere/", include("example_project.repository.urls")),
    re_path(r"^regex/(?P<pk>[0-9]+)/$", lambda request, pk: HttpResponse(pk), name="elsewhere-regex"),
]
