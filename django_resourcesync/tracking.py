"""Change tracking: keep each set's record (:class:`~.models.Resource`) and change log in step.

Three paths lead here, and all end in :meth:`SetWriter.apply`, which compares objects with the
record of a set and writes what differs, with a :class:`~.models.ChangeEvent` for every change a
Destination must learn about:

- **signals** (:mod:`.signals`): a save or delete of a tracked model inserts a
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
import logging
import threading
from dataclasses import dataclass, field

from django.apps import apps
from django.db import models, router, transaction
from django.db.models import Case, Exists, OuterRef, When
from django.db.models.functions import Cast
from django.utils import timezone

from . import bulk, outbox
from .builders import changelist
from .conf import app_settings
from .models import PendingChange, Resource, ResourceSet
from .sources import Representation, UnpublishableResource, registry
from .xml.writer import resource_entry

logger = logging.getLogger(__name__)

RENDERED_FIELDS = ("uri", "lastmod", "changefreq", "md5", "sha256", "length", "media_type", "links")
ENTRY_FIELDS = (*RENDERED_FIELDS, "fingerprint", "entry_xml")
# What a Destination fetches: a change of any of these is an "updated" event.
REPRESENTATION_FIELDS = ("md5", "sha256", "length", "media_type")


@dataclass
class ChangeCounts:
    created: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    skipped: int = 0

    def add(self, other):
        for name in ("created", "updated", "deleted", "unchanged", "skipped"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def __str__(self):
        return (
            f"{self.created} created, {self.updated} updated, {self.deleted} deleted, "
            f"{self.unchanged} unchanged, {self.skipped} skipped"
        )


# -- describing an object -------------------------------------------------------------------


def fingerprint_of(source, obj):
    return _stored(source.fingerprint(obj))


def _stored(fingerprint):
    return "" if fingerprint is None else str(fingerprint)[:512]


def fingerprints_of_rows(source, rows):
    """``{key: fingerprint}`` of ``values_list("pk", *source.fingerprint_fields)`` rows."""
    return {str(pk): _stored(source.fingerprint_of_values(values)) for pk, *values in rows}


def matching_fingerprints(resource_set, fingerprints):
    """The keys of ``{key: fingerprint}`` whose record in the set has that fingerprint."""
    recorded = bulk.filter_in(Resource.objects.filter(resource_set=resource_set), "object_pk", fingerprints)
    return {key for key, fingerprint in recorded.values_list("object_pk", "fingerprint") if fingerprint and fingerprints[key] == fingerprint}


def entry_values(source, obj, known=None, fingerprint=None):
    """Field values of the Resource row for ``obj``; reuses the hashes of ``known`` (its
    record, a dict) when its fingerprint did not change. Raises UnpublishableResource when
    ``obj`` cannot be listed."""
    if fingerprint is None:
        fingerprint = fingerprint_of(source, obj)
    representation = None
    if known is not None and fingerprint and known["fingerprint"] == fingerprint and known["sha256"]:
        representation = Representation(known["md5"], known["sha256"], known["length"], known["media_type"] or None)
    entry = source.entry(obj, known=representation)
    values = {
        "uri": entry.uri,
        "lastmod": entry.lastmod,
        "changefreq": entry.changefreq or "",
        "md5": entry.md5,
        "sha256": entry.sha256,
        "length": entry.length,
        "media_type": entry.media_type or "",
        "links": entry.links,
        "fingerprint": fingerprint,
    }
    values["entry_xml"] = resource_entry(**{name: values[name] for name in RENDERED_FIELDS})
    return values


# -- writing changes ------------------------------------------------------------------------


@dataclass(slots=True)
class Change:
    """A change a Destination must learn about, on its way into the set's change log."""

    object_pk: str
    uri: str
    change: str
    lastmod: object = None
    md5: str = ""
    sha256: str = ""
    length: int = None
    media_type: str = ""
    links: list = field(default_factory=list)

    @classmethod
    def of(cls, key, change, values):
        """A ``created`` or ``updated`` change with what ``values`` say of the resource (a
        ``deleted`` one says nothing of what was removed: ``Change(key, uri, "deleted")``)."""
        return cls(
            key, values["uri"], change, values["lastmod"], values["md5"], values["sha256"], values["length"], values["media_type"], values["links"]
        )


RECORD_FIELDS = ("resource_set_id", "object_pk", *ENTRY_FIELDS, "recorded")


class SetWriter:
    """Applies changes to one set inside a transaction that holds the set's row lock."""

    def __init__(self, resource_set, *, record_events):
        self.resource_set = resource_set
        self.source = resource_set.get_source()
        self.record_events = record_events
        self.log = changelist.ChangeLog(resource_set) if record_events else None
        self.counts = ChangeCounts()
        self.using = router.db_for_write(Resource)

    def apply(self, objects, fingerprints=None):
        """``objects``: ``{object_pk: obj or None}``, ``None`` for an object that is not (or no
        longer) among the set's items. ``fingerprints``: those of the objects, read in the
        database (``fingerprint_fields``) before the objects were, else they are read here."""
        keys, fingerprints = self._unvouched(objects, fingerprints)
        known = self._records([key for key in keys if objects[key] is not None], ("id", "object_pk", *ENTRY_FIELDS))
        # Of an object that is gone, only what its deletion needs.
        known.update(self._records([key for key in keys if objects[key] is None], ("id", "object_pk", "uri")))
        writes, gone, changes = {}, [], []  # writes: {key: values} of rows to (re)write
        for key in keys:
            obj, row = objects[key], known.get(key)
            values = None
            if obj is not None:
                try:
                    values = entry_values(self.source, obj, row, fingerprints.get(key))
                except UnpublishableResource as exc:
                    logger.warning("Set %s: %r is not published: %s", self.resource_set.slug, obj, exc)
                    self.counts.skipped += 1
            if values is None:
                if row is not None:
                    gone.append(row["id"])
                    changes.append(Change(key, row["uri"], "deleted"))
                continue
            if row is None:
                writes[key] = values
                changes.append(Change.of(key, "created", values))
                continue
            changed = [name for name, value in values.items() if row[name] != value]
            if not changed:
                self.counts.unchanged += 1
                continue
            if "uri" in changed:
                # A resource that moves is, to a Destination, one deleted and one created.
                changes.append(Change(key, row["uri"], "deleted"))
                changes.append(Change.of(key, "created", values))
            elif any(name in changed for name in REPRESENTATION_FIELDS):
                changes.append(Change.of(key, "updated", values))
            else:
                self.counts.unchanged += 1  # only lastmod, links or the like: no event
            writes[key] = values
            gone.append(row["id"])  # rewritten below: cheaper than an UPDATE per row
        refused = self._uri_clashes(writes)
        if refused:
            # A refused object keeps its record as it was, so none of its events stand.
            writes = {key: values for key, values in writes.items() if key not in refused}
            kept = {known[key]["id"] for key in refused if key in known}
            gone = [row_id for row_id in gone if row_id not in kept]
            changes = [change for change in changes if change.object_pk not in refused]
        if gone:
            bulk.filter_in(Resource.objects.all(), "pk", gone).delete()
        now = timezone.now()
        set_id = self.resource_set.pk
        rows = {key: (set_id, key, *(values[name] for name in ENTRY_FIELDS), now) for key, values in writes.items()}
        # A rewritten record keeps its key: builds plan their parts by key ranges.
        bulk.insert(Resource, ("id", *RECORD_FIELDS), [(known[key]["id"], *row) for key, row in rows.items() if key in known], self.using)
        bulk.insert(Resource, RECORD_FIELDS, [row for key, row in rows.items() if key not in known], self.using)
        for change in changes:
            setattr(self.counts, change.change, getattr(self.counts, change.change) + 1)
        if self.record_events:
            self.log.append(changes)

    def _records(self, keys, fields):
        """``{object_pk: {field: value}}`` of the set's records of ``keys``."""
        if not keys:
            return {}
        recorded = bulk.filter_in(Resource.objects.filter(resource_set=self.resource_set), "object_pk", keys)
        return {row["object_pk"]: row for row in recorded.values(*fields)}

    def _unvouched(self, objects, fingerprints=None):
        """The keys of ``objects`` to describe and compare with their record, and the
        fingerprints computed on the way. When the source's fingerprint covers its entries, an
        object whose fingerprint matches its record's is left out, unchanged, unread."""
        present = {key: obj for key, obj in objects.items() if obj is not None}
        if fingerprints is None:
            fingerprints = self._fingerprints(present)
        else:  # one that joined the items since they were read has none yet: described, "" kept
            fingerprints = {key: fingerprints.get(key, "") for key in present}
        if not self.source.fingerprint_covers_entry:
            return list(objects), fingerprints
        unchanged = matching_fingerprints(self.resource_set, fingerprints)
        self.counts.unchanged += len(unchanged)
        return [key for key in objects if key not in unchanged], fingerprints

    def read_fingerprints(self, pks):
        """``{key: fingerprint}`` of the objects ``pks`` that are among the set's items, read in
        the database (``fingerprint_fields``) in one query. Read them before the objects: a
        fingerprint newer than the object it is stored with would hide that object's change."""
        if not pks:
            return {}
        queryset = bulk.filter_in(self.source.queryset(self.resource_set.lookups), "pk", pks)
        return fingerprints_of_rows(self.source, queryset.values_list("pk", *self.source.fingerprint_fields))

    def _fingerprints(self, objects):
        if self.source.fingerprint_fields:
            return self.read_fingerprints([obj.pk for obj in objects.values()])
        fingerprints = {}
        for key, obj in objects.items():
            try:
                fingerprints[key] = fingerprint_of(self.source, obj)
            except UnpublishableResource:
                pass  # described below, where it is reported
        return fingerprints

    def _uri_clashes(self, writes):
        """Keys of objects whose URI another object of the set already publishes: left out."""
        if not writes:
            return set()
        found = bulk.filter_in(Resource.objects.filter(resource_set=self.resource_set), "uri", [values["uri"] for values in writes.values()])
        taken = dict(found.values_list("uri", "object_pk"))
        refused = set()
        for key, values in writes.items():
            owner = taken.get(values["uri"])
            if owner is not None and owner != key:
                logger.warning("Set %s: object %s has the URI %s of object %s; not published", self.resource_set.slug, key, values["uri"], owner)
                refused.add(key)
                self.counts.skipped += 1
            else:
                taken[values["uri"]] = key
        return refused


@contextlib.contextmanager
def locked(resource_set):
    """A transaction holding the set's row lock: one writer of its record and log at a time."""
    with transaction.atomic(using=router.db_for_write(ResourceSet)):
        ResourceSet.objects.select_for_update().filter(pk=resource_set.pk).first()
        yield


def is_tracked(resource_set):
    """Whether the set's change log has started (its first reconcile opened a Change List)."""
    return resource_set.changelists.exists()


# -- reconciliation -------------------------------------------------------------------------


def _batches(queryset, batch_size):
    """Yield lists of objects (or of ``values_list`` rows starting with the key) in primary-key
    order, by keyset pagination."""
    last = None
    while True:
        page = queryset.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        batch = list(page[:batch_size])
        if not batch:
            return
        yield batch
        last = batch[-1][0] if isinstance(batch[-1], tuple) else batch[-1].pk


def reconcile(resource_set, *, batch_size=None, progress=None):
    """Compare the set's source with its record and write what differs, with change events.

    The first reconcile of a set records its resources silently and opens its first Change List:
    Destinations start from a Resource List, not from a flood of ``created`` events.
    """
    batch_size = batch_size or app_settings.BATCH_SIZE
    source = resource_set.get_source()
    queryset = source.queryset(resource_set.lookups)
    record_events = is_tracked(resource_set)
    counts = ChangeCounts()
    total = queryset.count() if progress else None
    seen = 0
    # With fingerprints read in the database that cover the entries, only the objects whose
    # fingerprint changed are built and compared; the others are unchanged.
    vouching = bool(source.fingerprint_fields) and source.fingerprint_covers_entry
    rows = queryset.values_list("pk", *source.fingerprint_fields) if vouching else queryset
    for batch in _batches(rows, batch_size):
        if vouching:
            fingerprints = fingerprints_of_rows(source, batch)
            unchanged = matching_fingerprints(resource_set, fingerprints)
            counts.unchanged += len(unchanged)
            stale = {str(row[0]): row[0] for row in batch if str(row[0]) not in unchanged}
            found = {str(obj.pk): obj for obj in bulk.filter_in(queryset, "pk", stale.values())} if stale else {}
            objects = {key: found.get(key) for key in stale}  # None: gone since it was read
        else:
            objects, fingerprints = {str(obj.pk): obj for obj in batch}, None
        if objects:
            _apply_batch(resource_set, objects, record_events, counts, fingerprints)
        seen += len(batch)
        if progress:
            progress("reconcile", seen, total)
    # Rows whose object left the source: deleted, made private, filtered out.
    for keys in _gone_keys(resource_set, queryset, batch_size):
        _apply_batch(resource_set, dict.fromkeys(keys), record_events, counts)
    if not record_events:
        changelist.start_log(resource_set)
    return counts


def _gone_keys(resource_set, queryset, batch_size):
    """Yield lists of the keys of the set's records whose object is not in ``queryset``. With
    integer keys, one anti-join in the database finds them; other keys are looked up a batch of
    records at a time (their text form in the database may not be ``str(pk)``)."""
    records = Resource.objects.filter(resource_set=resource_set)
    if isinstance(queryset.model._meta.pk, models.IntegerField) and queryset.db == records.db:  # auto fields too
        # NOT EXISTS, which databases run as an anti-join whatever the sizes (NOT IN may not);
        # the record's key is cast, not the object's, so the lookup can use the primary key's
        # index. A key that is not an integer as str() writes it (left by an earlier source of
        # the set, say) is never cast: it has no object, and is gone.
        key = Case(
            When(object_pk__regex=r"^(0|-?[1-9][0-9]{0,17})$", then=Cast("object_pk", models.BigIntegerField())),
            default=None,
            output_field=models.BigIntegerField(),
        )
        present = queryset.order_by().filter(pk=OuterRef("key"))
        gone = list(records.annotate(key=key).filter(~Exists(present)).values_list("object_pk", flat=True))
        for start in range(0, len(gone), batch_size):
            yield gone[start : start + batch_size]
        return
    for batch in _batches(records.values_list("pk", "object_pk"), batch_size):
        keys = [key for _pk, key in batch]
        present = {str(pk) for pk in queryset.filter(pk__in=keys).values_list("pk", flat=True)}
        gone = [key for key in keys if key not in present]
        if gone:
            yield gone


def _apply_batch(resource_set, objects, record_events, counts, fingerprints=None):
    with locked(resource_set):
        writer = SetWriter(resource_set, record_events=record_events)
        writer.apply(objects, fingerprints)
    counts.add(writer.counts)


# -- pending changes (signals and the bulk API) ---------------------------------------------

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


def record(source_name, keys, *, using=None):
    """Record that the objects ``keys`` of a source may have changed; they are processed after
    the commit (see :mod:`.outbox`)."""
    outbox.record([(source_name, key, "") for key in _unique_keys(keys)], using=using)


def _unique_keys(keys):
    return dict.fromkeys(str(key) for key in keys if key is not None)


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


def process_pending(source_names=None, *, batch_size=None):
    """Turn pending changes into change events; returns the counts. Safe to run concurrently."""
    batch_size = batch_size or app_settings.BATCH_SIZE
    counts = ChangeCounts()
    names = source_names or list(PendingChange.objects.values_list("source", flat=True).distinct())
    for name in names:
        if name not in registry:
            logger.warning("Pending changes for the unregistered source %r are left waiting", name)
            continue
        source = registry.get(name)
        sets = list(ResourceSet.objects.filter(source=name).order_by("pk"))
        while True:
            with transaction.atomic():
                # Lock the sets first (in pk order, as every writer does), then take the batch:
                # a concurrent run waits here and then finds the rows already processed.
                for resource_set in sets:
                    ResourceSet.objects.select_for_update().filter(pk=resource_set.pk).first()
                pending = list(PendingChange.objects.filter(source=name).order_by("id").values_list("id", "object_pk", "related")[:batch_size])
                if not pending:
                    break
                keys = _keys_of(source, pending)
                for resource_set in sets:
                    try:
                        with transaction.atomic():  # a savepoint: a broken set spoils only its own part
                            _apply_keys(resource_set, source, keys, batch_size, counts)
                    except Exception:
                        # Its reconcile catches up once the set is fixed; the other sets go on.
                        logger.exception("Set %s: pending changes could not be applied", resource_set.slug)
                bulk.filter_in(PendingChange.objects.all(), "pk", [row_id for row_id, _key, _related in pending]).delete()
    return counts


def _keys_of(source, pending):
    """The keys of the source's objects that pending changes name, those of related objects
    resolved to the source's objects they affect (as they are now)."""
    keys, related = {}, {}
    for _id, key, related_label in pending:
        if related_label:
            related.setdefault(related_label, []).append(key)
        else:
            keys[key] = None
    for label, pks in related.items():
        try:
            model = apps.get_model(label)
        except LookupError:
            logger.warning("Pending changes of the unknown model %r are dropped", label)
            continue
        keys.update(dict.fromkeys(_unique_keys(source.affected_by(model, pks))))
    return list(keys)


def _apply_keys(resource_set, source, keys, batch_size, counts):
    writer = SetWriter(resource_set, record_events=is_tracked(resource_set))
    for start in range(0, len(keys), batch_size):
        batch = keys[start : start + batch_size]
        fingerprints = writer.read_fingerprints(batch) if source.fingerprint_fields else None  # first
        present = {str(obj.pk): obj for obj in bulk.filter_in(source.queryset(resource_set.lookups), "pk", batch)}
        writer.apply({key: present.get(key) for key in batch}, fingerprints)
    counts.add(writer.counts)
