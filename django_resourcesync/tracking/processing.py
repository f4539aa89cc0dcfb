"""Processing pending changes: turn the outbox's rows into change events, set by set."""

import logging
from typing import NamedTuple

from django.apps import apps
from django.db import router, transaction
from django.db.models import Q

from .. import bulk, sharing, versions
from ..conf import app_settings
from ..models import PendingChange, PreparedEntry, ResourceSet
from ..sources import registry
from . import outbox
from .locks import is_tracked
from .writer import UNREAD, ChangeCounts, History, SetWriter

logger = logging.getLogger(__name__)


def _unique_keys(keys):
    return dict.fromkeys(str(key) for key in keys if key is not None)


def process_pending(source_names=None, *, batch_size=None, parallel=False):
    """Turn pending changes into change events, each at the time it was made, in the order
    they were made; returns the counts. Safe to run concurrently.

    With ``parallel`` (a Celery worker runs this), the objects of a large batch of changes are
    described ahead by every free worker (see :func:`prepare_in_parts`) while the events are
    written here, in order, from what they prepared: each batch is written as soon as the parts
    that describe its objects are done (those no other worker took, this process does itself).

    Every save recorded is a change of its object (saves of one object in one transaction are
    one change): when an object was saved several times before its changes were processed (a
    worker outage), each save is an event, the overtaken ones with the bytes they left where
    they can still be had (:meth:`~django_resourcesync.sources.ResourceSource.saved_state`).
    A change of a related object is a change of the objects it affects if their entries differ.
    """
    batch_size = batch_size or app_settings.BATCH_SIZE
    counts = ChangeCounts()
    names = source_names or list(PendingChange.objects.values_list("source", flat=True).distinct())
    for name in names:
        if name not in registry:
            logger.warning("Pending changes for the unregistered source %r are left waiting", name)
            continue
        source = registry.get(name)
        # A disabled set publishes nothing and is reconciled by its first rebuild once enabled:
        # its changes are not written meanwhile, and a broken disabled set holds up no one.
        sets = list(ResourceSet.objects.filter(source=name, enabled=True).order_by("pk"))
        enabled = {resource_set.pk for resource_set in sets}
        ahead = prepare_in_parts(source, sets) if parallel else Ahead()
        broken = set()  # sets whose changes could not be written in this run
        rows = PendingChange.objects.filter(Q(resource_set__isnull=True) | Q(resource_set__in=enabled), source=name)
        held = outbox.dispatcher.held_since(name)
        if held is not None:
            # Saves of this process whose rows the dispatcher is about to write were made
            # before the rows recorded since: those wait for the round that writes them, so
            # that the changes are written in the order they were made.
            rows = rows.filter(recorded__lt=held)
        try:
            _write_batches(name, source, sets, rows, batch_size, ahead, broken, counts)
        finally:
            ahead.end()
        counts.failed_sets += len(broken)
        if parallel:
            PreparedEntry.objects.filter(resource_set__in=sets).delete()
    return counts


def _write_batches(name, source, sets, rows, batch_size, ahead, broken, counts):
    """Write the pending changes ``rows`` of the source ``name`` into ``sets``, a batch at a
    time in the order they were made; a set that fails is added to ``broken``."""
    after = 0  # rows up to this id are done with in this run
    while True:
        # Before the batch's transaction (its claims must show to the other workers at once):
        # the parts that describe the objects of the coming batch, done.
        if ahead.jobs:
            ahead.ready(rows.filter(id__gt=after, related="").order_by("id").values_list("object_pk", flat=True)[:batch_size])
        with transaction.atomic():
            # Lock the sets first (in pk order, as every writer does), then take the batch:
            # a concurrent run waits here and then finds the rows already processed.
            for resource_set in sets:
                ResourceSet.objects.lock(resource_set.pk)
            pending = [Pending(*row) for row in rows.filter(id__gt=after).order_by("id").values_list(*FIELDS)[:batch_size]]
            if not pending:
                break
            last = pending[-1].id
            if len(pending) == batch_size:
                # An object's saves are never cut apart: the last one of a batch would be
                # described by the state a later save left. Its later saves join the batch.
                keys = {row.object_pk for row in pending if not row.related}
                later = bulk.filter_in(rows.filter(id__gt=last, related=""), "object_pk", keys)
                pending += [Pending(*row) for row in later.order_by("id").values_list(*FIELDS)]
            for resource_set in sets:
                if resource_set.pk in broken:
                    continue
                mine = [row for row in pending if row.resource_set_id in (None, resource_set.pk)]
                if not mine:
                    continue
                try:
                    with transaction.atomic():  # a savepoint: a broken set spoils only its own part
                        _apply(resource_set, source, mine, batch_size, counts)
                except Exception:
                    # The other sets go on; this one is not tried again in this run.
                    logger.exception(
                        "Set %s: pending changes could not be applied; they wait for the next run", resource_set.slug
                    )
                    broken.add(resource_set.pk)
            _settle(name, pending, broken)
            after = last


PREPARE = "prepare"
#: Objects a part of :func:`prepare_in_parts` describes.
PREPARE_PART = 1_000


def prepares(resource_set, source):
    """Whether what a set records of its source's objects may be described ahead of the
    processing of their changes: the source's fingerprints, read in the database, cover its
    entries (a prepared entry stands for its fingerprint), and the set keeps no bytes of
    versions (they are kept as changes are written)."""
    return (
        bool(source.fingerprint_fields) and source.fingerprint_covers_entry
        and not (is_tracked(resource_set) and versions.keeps(resource_set))
    )


def prepare_in_parts(source, sets):
    """Offer the free workers to describe the objects the pending changes of ``source`` name
    (not those of related objects), ``PREPARE_PART`` objects a part, for each set of ``sets``
    that :func:`prepares`, when there are at least two parts' worth: rendering a record through
    the site's view is what costs, and the workers do it side by side (see :mod:`..sharing`)
    while this process writes. Returns the :class:`Ahead` of the jobs. A set whose preparation
    another process runs is helped with it first. A failure only costs the time (what is not
    prepared is described as its change is written)."""
    ahead = Ahead()
    sets = [resource_set for resource_set in sets if prepares(resource_set, source)]
    if not sets:
        return ahead
    rows = PendingChange.objects.filter(source=source.name, related="")
    if rows[: 2 * PREPARE_PART].count() < 2 * PREPARE_PART:
        return ahead
    keys = list(dict.fromkeys(rows.order_by("id").values_list("object_pk", flat=True).iterator(chunk_size=10_000)))
    if len(keys) < 2 * PREPARE_PART:
        return ahead
    parts = [{"keys": keys[start : start + PREPARE_PART]} for start in range(0, len(keys), PREPARE_PART)]
    ahead.part_of = {key: number for number, part in enumerate(parts, 1) for key in part["keys"]}
    for resource_set in sets:
        job = sharing.running(resource_set, PREPARE)
        if job is not None:
            try:
                sharing.join(job)
            except sharing.JobFailed as exc:
                ahead.failed(resource_set, exc)
            continue
        # As many tasks as parts but one: this process takes the parts of each batch it is to
        # write that no worker took yet.
        ahead.jobs[resource_set.pk] = (resource_set, sharing.offer(resource_set, PREPARE, parts, helpers=len(parts) - 1))
    return ahead


class Ahead:
    """The jobs describing ahead the objects of pending changes, one per set (``jobs``:
    ``{set pk: (set, job)}``), and the part that describes each key (``part_of``)."""

    def __init__(self):
        self.jobs = {}
        self.part_of = {}

    def ready(self, keys):
        """Have the parts that describe ``keys`` done, for every set."""
        numbers = {self.part_of[key] for key in keys if key in self.part_of}
        for resource_set, job in list(self.jobs.values()):
            failed = sharing.ready(job, numbers)
            if failed:
                self.failed(resource_set, f"parts {failed} failed")

    def failed(self, resource_set, why):
        logger.warning("Set %s: the objects of its changes could not all be described ahead (%s); "
                       "they are described as their changes are written", resource_set.slug, why)

    def end(self):
        for _resource_set, job in self.jobs.values():
            sharing.end(job)
        self.jobs = {}


@sharing.kind(PREPARE)
def _prepare_part(resource_set, options, beat):
    """A part of :func:`prepare_in_parts`: describe the objects ``options["keys"]`` for the set
    and keep what was described as :class:`~..models.PreparedEntry` rows."""
    writer = SetWriter(resource_set, record_events=False)
    return {"prepared": writer.prepare(options["keys"])}


class Pending(NamedTuple):
    """One pending change, as processing reads it."""

    id: int
    object_pk: str
    related: str
    recorded: object
    transaction: int
    state: object
    sets: object
    noted: object
    resource_set_id: int


FIELDS = Pending._fields


def _settle(source_name, pending, broken):
    """Done with a batch: its rows go, except that each set that failed on them keeps its own
    copy (the other sets wrote theirs), which its next run (or reconcile, once it is fixed)
    writes."""
    bulk.filter_in(PendingChange.objects.all(), "pk", [row.id for row in pending if row.resource_set_id not in broken]).delete()
    copies = [
        (source_name, row.object_pk, row.related, row.state, row.sets, row.noted, row.recorded, row.transaction, set_id)
        for set_id in sorted(broken) for row in pending if row.resource_set_id is None
    ]
    fields = ("source", "object_pk", "related", "state", "sets", "noted", "recorded", "transaction", "resource_set_id")
    bulk.insert(PendingChange, fields, copies, router.db_for_write(PendingChange))


def histories(source, pending):
    """``{object_pk: History}`` of the source's objects that pending changes name, those of
    related objects resolved to the source's objects they affect (as they are now), in the
    order of their newest change."""
    changes = []  # (row id, object_pk, row)
    related = {}
    for row in pending:
        if row.related:
            related.setdefault(row.related, []).append(row)
        else:
            changes.append((row.id, row.object_pk, row))
    for label, rows in related.items():
        try:
            model = apps.get_model(label)
        except LookupError:
            logger.warning("Pending changes of the unknown model %r are dropped", label)
            continue
        affected = source.affected_by_each(model, _unique_keys(row.object_pk for row in rows))
        changes.extend((row.id, str(key), row) for row in rows for key in affected.get(row.object_pk, ()))
    # In the order they were made: a save in autocommit is written a little after its commit
    # (by the dispatcher thread), so a change made after it may have a lower key.
    changes.sort(key=lambda change: (change[2].recorded, change[0]))
    found, last = {}, {}
    for _id, key, row in changes:
        history, before = found.get(key), last.get(key)
        last[key] = row
        if history is None:
            found[key] = History(row.recorded, row.id)
            continue
        # Saves of one object in one transaction are one change: its last state.
        same_transaction = row.transaction is not None and row.transaction == before.transaction
        if before.state is not None and not same_transaction:
            # With the sets it is published by: those that listed its object when they were
            # noted, if that was before the object's next change (else they may tell of that
            # change: none, as when they are not known).
            known = before.sets is not None and before.noted is not None and before.noted < row.recorded
            history.earlier.append((before.recorded, before.id, {**before.state, "sets": before.sets if known else []}))
        history.time, history.seq = row.recorded, row.id
    return dict(sorted(found.items(), key=lambda item: (item[1].time, item[1].seq)))


def _apply(resource_set, source, pending, batch_size, counts):
    """Write the changes ``pending`` rows record into one set."""
    history = histories(source, pending)
    keys = list(history)
    writer = SetWriter(resource_set, record_events=is_tracked(resource_set))
    for start in range(0, len(keys), batch_size):
        batch = keys[start : start + batch_size]
        if source.fingerprint_fields:
            # The fingerprints say which objects are among the set's items; the writer reads
            # those it must describe (not those described ahead, nor the unchanged).
            fingerprints = writer.read_fingerprints(batch)
            writer.apply({key: UNREAD if key in fingerprints else None for key in batch}, fingerprints, history)
            continue
        present = {str(obj.pk): obj for obj in bulk.filter_in(source.queryset(resource_set.lookups), "pk", batch)}
        writer.apply({key: present.get(key) for key in batch}, None, history)
    counts.add(writer.counts)
