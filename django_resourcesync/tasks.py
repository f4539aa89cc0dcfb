"""Celery tasks. The app defines no schedule: see docs/schedules for a beat snippet.

Task names are stable (``resourcesync.*``) so that schedules stored in django-celery-beat keep
working across releases.
"""

from celery import shared_task

from .models import ResourceSet
from .rebuild import rebuild_set


def _summary(builds):
    return [{"build": b.pk, "capability": b.capability, "status": b.status, "entries": b.entries} for b in builds]


@shared_task(name="resourcesync.rebuild_set")
def rebuild_set_task(set_id, only=None):
    """Rebuild one set's documents; returns a summary of the builds."""
    try:
        resource_set = ResourceSet.objects.get(pk=set_id, enabled=True)
    except ResourceSet.DoesNotExist:
        return []
    return _summary(rebuild_set(resource_set, only=only))


@shared_task(name="resourcesync.rebuild_all")
def rebuild_all_task(only=None):
    """Rebuild every enabled set, one after the other."""
    summary = []
    for resource_set in ResourceSet.objects.filter(enabled=True):
        summary += _summary(rebuild_set(resource_set, only=only))
    return summary
