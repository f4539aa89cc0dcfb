"""Change tracking: keep each set's record (:class:`~.models.Resource`) and change log in step.

Three paths lead here, and all end in :meth:`SetWriter.apply`, which compares objects with the
record of a set and writes what differs, with a :class:`~.models.ChangeEvent` for every change a
Destination must learn about:

- **signals** (:mod:`.receivers`): a save or delete of a tracked model inserts a
  :class:`~.models.PendingChange` row in the same transaction, and the commit queues
  :func:`process_pending` (the Celery task ``resourcesync.process_changes``);
- **the bulk API** (:func:`changed`, :func:`paused`): for ``bulk_create``, ``queryset.update()``,
  raw SQL and other paths that send no signal;
- **reconciliation** (:func:`reconcile`): compares a whole set with the site's data, the safety net
  that makes every path converge.

Change events are written by one writer per set at a time (the set's row is locked), so their
sequence (the ``id``) is also their commit order, and their datetimes never go backwards even if
the server clock does. An event records a change of what a Destination fetches: a resource that
enters the set is ``created``, one that leaves it (deleted, made private, filtered out) is
``deleted``, and one whose bytes or media type change is ``updated``; a save that changes none of
that records nothing.
"""

import contextlib
import threading

from ..models import Resource
from ..sources import registry
from . import outbox
from .locks import is_tracked, locked
from .processing import _unique_keys, process_pending
from .reconcile import reconcile
from .writer import ChangeCounts, SetWriter, entry_values, fingerprint_of, fingerprints_of_rows

__all__ = [
    "ChangeCounts", "SetWriter", "changed", "entry_values", "fingerprint_of", "fingerprints_of_rows", "is_enabled", "is_tracked",
    "locked", "paused", "process_pending", "recheck", "reconcile", "record", "refresh",
]

_state = threading.local()


def is_enabled():
    return not getattr(_state, "paused", 0)


@contextlib.contextmanager
def paused():
    """Turn the signal handlers off in this thread, e.g. around a data import; call
    :func:`changed` or run ``resourcesync_reconcile`` afterwards."""
    _state.paused = getattr(_state, "paused", 0) + 1
    try:
        yield
    finally:
        _state.paused -= 1


def refresh(resource_set, *, progress=None, batch_size=None, parallel=False):
    """Bring the set's record in line with the site: its source's pending changes first, then a
    reconcile, which records any change that bypassed the signals (in parts that free workers
    share, with ``parallel``). Returns the reconcile's counts."""
    process_pending([resource_set.source], batch_size=batch_size, parallel=parallel)
    return reconcile(resource_set, progress=progress, batch_size=batch_size, parallel=parallel)


def recheck(source, keys):
    """Have the objects ``keys`` of a source read again, whatever their fingerprints say (a dump
    found their bytes changed since they were hashed, or unreadable)."""
    Resource.objects.filter(object_pk__in=[str(key) for key in keys], resource_set__source=source.name).update(fingerprint="")
    record(source.name, keys)


def record(source_name, keys, *, using=None):
    """Record that the objects ``keys`` of a source may have changed; they are processed after
    the commit (see :mod:`.outbox`)."""
    outbox.record([(source_name, key, "") for key in _unique_keys(keys)], using=using)


def changed(objects=None, *, model=None, pks=None):
    """The bulk API: record that objects changed (or were deleted) without sending signals.

    Pass a queryset or iterable of instances, or ``model`` and ``pks`` (which may name objects
    that no longer exist)::

        Item.objects.filter(collection=c).update(title=...)
        tracking.changed(Item.objects.filter(collection=c))

        Item.objects.filter(pk__in=gone).delete()        # signals do this one
        tracking.changed(model=Item, pks=gone)            # raw SQL: say so yourself

    Every source that tracks the model is told, related models included (the objects a change
    of a related object affects are looked up when the changes are processed). Processing
    happens after the commit, like that of signals. Returns the number of pending changes
    recorded.
    """
    if objects is not None:
        if hasattr(objects, "values_list"):  # a queryset: its keys suffice
            model = objects.model
            pks = list(objects.values_list("pk", flat=True))
            objects = None
        else:
            objects = list(objects)
            if not objects:
                return 0
            model = type(objects[0])
    elif model is None or pks is None:
        raise TypeError("changed() takes objects, or model= and pks=")
    if objects is not None:
        pks = [obj.pk for obj in objects]
    keys = list(_unique_keys(pks))
    rows = [(source.name, key, source.related_label(model)) for source in registry.sources_tracking(model) for key in keys]
    outbox.record(rows)
    return len(rows)
