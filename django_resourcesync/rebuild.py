"""One entry point for bringing a set's documents up to date, shared by tasks and commands."""

from django.utils import timezone

from . import capabilities, tracking
from .builders import BuildContext, build_lock
from .builders import changedump, changelist
from .builders.resourcedump import build_resourcedump
from .builders.resourcelist import build_resourcelist


def rebuild_set(resource_set, *, only=None, progress=None, batch_size=None, parallel=False, refresh=True):
    """Bring every enabled capability of the set (or those in ``only``) up to date.

    The set's record is brought in line with the site first (pending changes, then a reconcile,
    which records any change that bypassed the signals; not with ``refresh=False``); then the
    Resource List and Resource Dump are built and published, an open Change List whose period is
    over is closed (the open list itself is served live and needs no build), and the changes not
    yet in a Change Dump package are packaged. Returns the builds (Resource List, Resource Dump).

    With ``parallel`` (a Celery worker runs this), a Resource List past one document, and a
    Resource Dump of more than one package, are rendered in parts by Celery tasks: their builds
    are returned running, and are published by the task that completes each (see
    :mod:`~django_resourcesync.builders.parts`).
    """
    wanted = [c for c, _label in capabilities.CAPABILITY_CHOICES if resource_set.has_capability(c) and (not only or c in only)]
    if not wanted:
        return []
    try:
        if refresh:
            tracking.process_pending([resource_set.source], batch_size=batch_size)
            tracking.reconcile(resource_set, progress=progress, batch_size=batch_size)
    except Exception as exc:
        # Recorded on the builds it stopped, so the admin shows why nothing was published.
        for capability in (capabilities.RESOURCELIST, capabilities.RESOURCEDUMP):
            if capability in wanted:
                BuildContext(resource_set, capability, at=timezone.now()).fail(exc)
        raise
    builds = []
    if capabilities.RESOURCELIST in wanted:
        with build_lock(resource_set, capabilities.RESOURCELIST) as lock:
            builds.append(build_resourcelist(resource_set, refresh=False, progress=lock.renewing(progress), batch_size=batch_size,
                                             parallel=parallel, lock=lock))
    if capabilities.RESOURCEDUMP in wanted:
        with build_lock(resource_set, capabilities.RESOURCEDUMP) as lock:
            builds.append(build_resourcedump(resource_set, refresh=False, progress=lock.renewing(progress), batch_size=batch_size,
                                             parallel=parallel, lock=lock))
    if capabilities.CHANGELIST in wanted:
        with tracking.locked(resource_set):
            changelist.close_due(resource_set)
    if capabilities.CHANGEDUMP in wanted:
        with build_lock(resource_set, capabilities.CHANGEDUMP):
            while changedump.package_changes(resource_set, progress=progress) is not None:
                pass  # a backlog past MAX_ENTRIES_PER_DOCUMENT changes takes several packages
    return builds

