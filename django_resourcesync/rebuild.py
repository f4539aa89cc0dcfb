"""One entry point for bringing a set's documents up to date, shared by tasks and commands."""

import logging

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from . import capabilities, tracking
from .builders.context import BuildContext
from .builders.locks import build_lock
from .exceptions import BuildInProgress
from .sources import registry

logger = logging.getLogger(__name__)


def _readable_source(resource_set):
    """Refuse a set whose source could not say what it publishes when the app started
    (check ``resourcesync.E029``): its changes are not tracked, so it is left unpublished."""
    failure = registry.failures.get(resource_set.source)
    if failure is not None:
        raise ImproperlyConfigured(
            f"The source {resource_set.source!r} cannot say what it publishes ({type(failure).__name__}: {failure}); "
            "see check resourcesync.E029"
        )


def rebuild_set(resource_set, *, only=None, progress=None, batch_size=None, parallel=False, refresh=True):
    """Bring every enabled capability of the set (or those in ``only``) up to date.

    The set's record is brought in line with the site first (pending changes, then a reconcile,
    which records any change that bypassed the signals; not with ``refresh=False``); then the
    builder of each capability (see :mod:`.capabilities`) brings its documents up to date, in the
    table's order, under the set's build lock for it: the Resource List and Resource Dump are built
    and published, an open Change List whose period is over is closed (the open list itself is
    served live and needs no build), and the changes not yet in a Change Dump package are
    packaged. Returns the builds made (Resource List, Resource Dump). A capability whose build
    lock another build holds is left to that build; the others are built all the same, then
    :class:`~django_resourcesync.exceptions.BuildInProgress` says which were left.

    With ``parallel`` (a Celery worker runs this), the reconcile is shared with the free workers
    (see :mod:`.sharing`), and a Resource List past one document, and a
    Resource Dump of more than one package, are rendered in parts by Celery tasks: their builds
    are returned running, and are published by the task that completes each (see
    :mod:`~django_resourcesync.builders.parts`).
    """
    wanted = [
        capability
        for capability in capabilities.TABLE
        if resource_set.has_capability(capability.name) and (not only or capability.name in only)
    ]
    if not wanted:
        return []
    try:
        _readable_source(resource_set)
        if refresh:
            tracking.refresh(resource_set, progress=progress, batch_size=batch_size, parallel=parallel)
    except Exception as exc:
        # Recorded on the builds it stopped, so the admin shows why nothing was published.
        for capability in wanted:
            if capability.lists_resources:
                BuildContext(resource_set, capability.name, at=timezone.now()).fail(exc)
        raise
    if not resource_set.get_source().gives_bytes:
        # A dump of resources without bytes would be empty (check resourcesync.W008 says so).
        skipped = [capability.name for capability in wanted if capability.needs_bytes]
        if skipped:
            logger.warning("Set %s: its source gives no bytes; %s not built", resource_set.slug, ", ".join(skipped))
        wanted = [capability for capability in wanted if not capability.needs_bytes]
    builds, busy = [], []
    for capability in wanted:
        options = {"progress": progress, "batch_size": batch_size, "parallel": parallel}
        if capability.build_lock:
            # A capability whose build is still running (its parts on the workers, say) does not
            # hold up the others: a rebuild delivered again after its worker died goes on to
            # the builds that worker left half planned, and takes their dead holder's lock over.
            try:
                with build_lock(resource_set, capability.name) as lock:
                    builds += capability.builder.update(resource_set, lock=lock, **options)
            except BuildInProgress as exc:
                busy.append(exc)
        else:
            builds += capability.builder.update(resource_set, **options)
    if busy:
        raise BuildInProgress("; ".join(str(exc) for exc in busy))
    return builds
