"""Absolute URIs of the documents the Source publishes."""

from django.urls import reverse

from .conf import app_settings


def _absolute(path):
    return app_settings.BASE_URL + path


def source_description_uri():
    return _absolute(reverse("resourcesync:source-description"))


def capability_list_uri(resource_set):
    return _absolute(reverse("resourcesync:capability-list", kwargs={"slug": resource_set.slug}))


def document_uri(resource_set, name):
    return _absolute(reverse("resourcesync:document", kwargs={"slug": resource_set.slug, "name": name}))
