"""How long builds are kept: ``KEEP_BUILDS`` generations, or what a set's archive of them keeps
(``ARCHIVE_RETENTION``; see :mod:`~django_resourcesync.builders.archive`)."""

import datetime

from django.utils import timezone

from .. import capabilities
from ..conf import app_settings, archive_retention
from ..models import Build

ARCHIVED = capabilities.ARCHIVES


def archive_of(capability):
    """The archive capability of ``capability`` (``resourcelist`` -> ``resourcelist-archive``), or ``None``."""
    return next((archive for archive, archived in ARCHIVED.items() if archived == capability), None)


def stale_builds(resource_set, capability, now=None):
    """The retired builds of ``capability`` the set no longer keeps: past ``KEEP_BUILDS``, and,
    if the set offers the capability's archive, past its retention too."""
    retired = list(
        Build.objects.filter(resource_set=resource_set, capability=capability, status=Build.Status.RETIRED)
        .order_by("-pk").values_list("pk", "at")
    )
    archive = archive_of(capability)
    if archive is None or not resource_set.has_capability(archive):
        return [pk for pk, _at in retired[app_settings.KEEP_BUILDS :]]
    count, age = archive_retention(capability)
    cutoff = (now or timezone.now()) - datetime.timedelta(seconds=age) if age is not None else None
    stale = []
    for position, (pk, at) in enumerate(retired):
        if position < app_settings.KEEP_BUILDS:
            continue  # kept for Destinations that fetched an index just before a switch-over
        # ``count`` includes the published build.
        if (count is not None and position + 1 >= count) or (cutoff is not None and at < cutoff):
            stale.append(pk)
    return stale
