"""Writing changes: compare objects with a set's record, write what differs and its change events."""

import datetime
import functools
import json
import logging
from dataclasses import dataclass, field

from django.db import DatabaseError, router
from django.db.models import QuerySet
from django.utils import timezone

from .. import bulk, rendering, versions
from ..entries import Representation
from ..exceptions import UnpublishableResource
from ..fingerprints import digested_form
from ..models import LeftOut, PreparedEntry, Resource
from ..signals import resources_left
from ..sources import ReadAhead
from ..versions import StoreUnavailable
from ..xml.writer import resource_entry
from .changelog import ChangeLog

logger = logging.getLogger(__name__)


RENDERED_FIELDS = ("uri", "lastmod", "changefreq", "md5", "sha256", "length", "media_type", "links", "encoding")
ENTRY_FIELDS = (*RENDERED_FIELDS, "fingerprint", "entry_xml")
# What a Destination fetches: a change of any of these is an "updated" event (of a resource
# whose bytes are known; one without bytes is updated whenever its entry or fingerprint changes).
REPRESENTATION_FIELDS = ("md5", "sha256", "length", "media_type", "encoding")


@dataclass
class ChangeCounts:
    created: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    skipped: int = 0
    failed_sets: int = 0

    def add(self, other):
        for name in ("created", "updated", "deleted", "unchanged", "skipped", "failed_sets"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def __str__(self):
        return (
            f"{self.created} created, {self.updated} updated, {self.deleted} deleted, "
            f"{self.unchanged} unchanged, {self.skipped} skipped"
            + (f", {self.failed_sets} set(s) failed" if self.failed_sets else "")
        )


# -- describing an object -------------------------------------------------------------------


def fingerprint_of(source, obj):
    return _stored(source.fingerprint(obj))


def _stored(fingerprint):
    return "" if fingerprint is None else str(fingerprint)[:512]


def fingerprints_of_rows(source, rows):
    """``{key: fingerprint}`` of ``values_list("pk", *source.fingerprint_fields)`` rows. Given
    as that queryset, the fingerprints are those the database makes, where it makes them
    (``source.fingerprints_in_database()``); rows already read are fingerprinted in Python by
    ``fingerprint_of_values()``, which is what a source gets where the database does not."""
    if isinstance(rows, QuerySet) and source.fingerprints_in_database(rows.db):
        return {key: _stored(fingerprint) for key, fingerprint in source.fingerprints_of_queryset(rows).items()}
    return {str(pk): _stored(source.fingerprint_of_values(values)) for pk, *values in rows}


def matching_fingerprints(resource_set, fingerprints):
    """The keys of ``{key: fingerprint}`` whose record in the set has that fingerprint."""
    recorded = bulk.filter_in(Resource.objects.filter(resource_set=resource_set), "object_pk", fingerprints)
    return _matching({row["object_pk"]: row for row in recorded.values("object_pk", "fingerprint")}, fingerprints)


def _matching(known, fingerprints):
    """The keys of ``{key: fingerprint}`` whose record in ``known`` (``{key: record}``, read
    with its fingerprint) has that fingerprint."""
    return {
        key for key, fingerprint in fingerprints.items()
        if fingerprint and key in known and known[key]["fingerprint"] == fingerprint
    }


def vouches(known, fingerprint):
    """Whether the record ``known`` (a dict, or ``None``) still gives the hashes of an object
    whose fingerprint is ``fingerprint``: the bytes need not be read. A record of the form
    fingerprints had before (a digest where SQLite now keeps a short text) vouches too: an
    upgrade rewrites such records without reading every object's bytes again."""
    if known is None or not fingerprint or not known["sha256"]:
        return False
    return known["fingerprint"] == fingerprint or known["fingerprint"] == digested_form(fingerprint)


def entry_values(source, obj, known=None, fingerprint=None, read=None):
    """Field values of the Resource row for ``obj``; reuses the hashes of ``known`` (its
    record, a dict) when its fingerprint did not change. ``read(obj)``, if given, reads and
    hashes the bytes otherwise (the version store keeps them on the way; or they were rendered
    with a batch's, ``contents()``). Raises UnpublishableResource when ``obj`` cannot be listed."""
    if fingerprint is None:
        fingerprint = fingerprint_of(source, obj)
    representation = None
    if vouches(known, fingerprint):
        representation = Representation(known["md5"], known["sha256"], known["length"], known["media_type"] or None)
    elif read is not None:
        representation = read(obj)
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
        "encoding": entry.encoding or "",
        "fingerprint": fingerprint,
    }
    values["entry_xml"] = rendered_entry(values)
    return values


def rendered_entry(values):
    """The ``<url>`` of a Resource List entry with the field values ``values``."""
    return resource_entry(**{name: values[name] for name in RENDERED_FIELDS})


def kept_lastmod(values, row):
    """``values`` with the ``lastmod`` of the record ``row`` (its entry rendered again if that
    differs): what is written for a change that makes no event. A resource's listed lastmod
    moves only with a change the Change List records (see docs/changes.rst)."""
    if values["lastmod"] == row["lastmod"]:
        return values
    values = {**values, "lastmod": row["lastmod"]}
    values["entry_xml"] = row["entry_xml"] if _same_entry(values, row) else rendered_entry(values)
    return values


def _same_entry(values, row):
    return all(values[name] == row[name] for name in RENDERED_FIELDS)


def described_ahead(resource_set, objects, fingerprints, *, record_events):
    """``{key: (fingerprint, values)}``: the objects ``objects`` (``{key: obj}``, ``None`` for
    one gone) described before the set's lock is taken, from the ``fingerprints`` read before
    them, for :meth:`SetWriter.apply` to use for those whose fingerprint is the same once it
    holds the lock. While one process describes, another writes: the lock is held for the
    writing alone. An object that cannot be described is left out, for ``apply`` to report.
    Nothing is described where the changes keep the bytes of their versions (``record_events``
    on a set that keeps them): those are kept as they are read, in the change's transaction."""
    if record_events and versions.keeps(resource_set):
        return {}
    writer = SetWriter(resource_set, record_events=False)
    if not writer.source.fingerprint_covers_entry:
        return {}
    known, stale = writer._differing([key for key, obj in objects.items() if obj is not None], fingerprints)
    described = writer._describe_ahead(stale, objects, known, fingerprints)
    return {key: (fingerprint, values) for key, fingerprint, values in described}


def describe_failure(exc):
    """Why an object could not be published, in a line an operator can act on."""
    if isinstance(exc, UnpublishableResource):
        return str(exc)[:2000]
    return f"{type(exc).__name__}: {exc}"[:2000]


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
    encoding: str = ""
    #: When it was made (``None``: now, for a change found by reconciling), and its place in
    #: the order of the pending changes (the log is written in that order).
    datetime: object = None
    seq: int = 0

    @classmethod
    def of(cls, key, change, values, **when):
        """A ``created`` or ``updated`` change with what ``values`` say of the resource (a
        ``deleted`` one says nothing of what was removed: ``Change(key, uri, "deleted")``)."""
        return cls(
            key, values["uri"], change, values["lastmod"], values["md5"], values["sha256"],
            values["length"], values["media_type"], values["links"], values["encoding"], **when
        )


def _made(change):
    """Where ``change`` goes in the order the changes were made: those found now (by a
    reconcile: no time, no place) first, as they come; the others by their time, then place."""
    if change.datetime is None:
        return (0,)
    return (1, change.datetime, change.seq)


@dataclass(slots=True)
class History:
    """What the pending changes of one object say of it: when the newest was made (``time``,
    ``seq``), and the saves it overtook, each ``(time, seq, state)``, oldest first: changes
    that were committed, and are published, though their state is gone."""

    time: object
    seq: int
    earlier: list = field(default_factory=list)

    def when(self):
        return {"datetime": self.time, "seq": self.seq}


RECORD_FIELDS = ("resource_set_id", "object_pk", *ENTRY_FIELDS, "recorded")


#: An object ``contents()`` gave no bytes for: they are read one by one.
NOT_RENDERED = object()

#: In what :meth:`SetWriter.apply` is given: an object among the set's items (its fingerprint
#: was read) that is read only if it must be described: one whose fingerprint matches its
#: record, or that a worker described ahead, is not.
UNREAD = object()

#: A batch of at least this many objects that all fail to be described fails as a whole.
SYSTEMIC_FAILURE = 20


class SourceUnavailable(RuntimeError):
    """Every object of a batch failed: the source (or its storage) is down, not the objects bad."""


class SetWriter:
    """Applies changes to one set inside a transaction that holds the set's row lock."""

    def __init__(self, resource_set, *, record_events):
        self.resource_set = resource_set
        self.source = resource_set.get_source()
        self.record_events = record_events
        self.log = ChangeLog(resource_set) if record_events else None
        self.counts = ChangeCounts()
        self.using = router.db_for_write(Resource)
        self._any_left_out = None
        self.keeping = record_events and versions.keeps(resource_set)
        self.kept = {}  # {sha256: length} kept in this batch

    def apply(self, objects, fingerprints=None, history=None, described=None):
        """``objects``: ``{object_pk: obj or None}``, ``None`` for an object that is not (or no
        longer) among the set's items, :data:`UNREAD` for one that is, not read yet (then
        ``fingerprints`` must be given). ``fingerprints``: those of the objects, read in the
        database (``fingerprint_fields``) before the objects were, else they are read here.
        ``history``: ``{object_pk: History}`` of pending changes; without, a change is made now.
        ``described``: what :func:`described_ahead` made of some of them, used for those whose
        fingerprint is still the one they were described with."""
        with rendering.batch():  # the pages it renders share what they read of the configuration
            self._apply(objects, fingerprints, history, described or {})

    def _apply(self, objects, fingerprints, history, described):
        history = history or {}
        fields = ("id", "object_pk", *ENTRY_FIELDS)
        if fingerprints is not None:
            # Objects whose fingerprint was read for them, most of them changed: their records
            # are read once, to tell which are unchanged and to compare the others with.
            known = self._records([key for key, obj in objects.items() if obj is not None], fields)
            keys, fingerprints = self._unvouched(objects, fingerprints, history, known)
        else:  # a reconcile's batch, most of it unchanged: the records of the others
            keys, fingerprints = self._unvouched(objects, None, history)
            known = self._records([key for key in keys if objects[key] is not None], fields)
        # Of an object that is gone, only what its deletion needs.
        known.update(self._records([key for key in keys if objects[key] is None], ("id", "object_pk", "uri")))
        writes, gone, changes = {}, [], []  # writes: {key: values} of rows to (re)write
        left_out = {}  # {key: reason} of objects that cannot be listed
        withdrawn = {}  # {key: record id} of resources that leave the set
        prepared = self._prepared([key for key in keys if objects[key] is not None], fingerprints, described)
        objects = self._read_unread(objects, [
            key for key in keys
            if objects[key] is UNREAD and (key not in prepared or (key in history and history[key].earlier))
        ])
        rendered = self._batch_contents([key for key in keys if key not in prepared], objects, known, fingerprints)
        for key in keys:
            obj, row = objects[key], known.get(key)
            past = history.get(key)
            when = past.when() if past else {}
            values = prepared.get(key)
            if obj is not None and values is None:
                read = self._reader(row, rendered.get(key, NOT_RENDERED))
                try:
                    values = entry_values(self.source, obj, row, fingerprints.get(key), read)
                except (DatabaseError, StoreUnavailable):
                    raise  # the transaction is broken, the store down: the batch fails, nothing is lost
                except Exception as exc:  # one bad object must not stop the set: it is left out
                    left_out[key] = describe_failure(exc)
                    self.counts.skipped += 1
            if values is None:
                if row is not None:
                    gone.append(row["id"])
                    changes.append(Change(key, row["uri"], "deleted", **when))
                    withdrawn[key] = row["id"]
                continue
            # The saves its last change overtook: each one a change of the resource.
            earlier = self._earlier(key, obj, row, values, past)
            changes.extend(earlier)
            if row is None:
                writes[key] = values
                changes.append(Change.of(key, "updated" if earlier else "created", values, **when))
                continue
            changed = [name for name, value in values.items() if row[name] != value]
            if not changed and not earlier:
                self.counts.unchanged += 1
                continue
            if "uri" in changed:
                # A resource that moves is, to a Destination, one deleted and one created.
                changes.append(Change(key, row["uri"], "deleted", **when))
                changes.append(Change.of(key, "created", values, **when))
            elif earlier or any(name in changed for name in REPRESENTATION_FIELDS) or not (values["sha256"] or row["sha256"]):
                # With bytes, a change of them; without (a source that knows none), a change of
                # its fingerprint or of anything its entry shows: the only changes it can tell.
                # After saves it overtook, the state it left.
                changes.append(Change.of(key, "updated", values, **when))
            else:
                # The same bytes, only lastmod, links or the like: no event. Once the set's
                # Change List is open, the listed lastmod stays the one its last event carried
                # (a Destination that follows the Change List has that one); the record takes
                # the rest, the fingerprint among it.
                self.counts.unchanged += 1
                if self.record_events:
                    values = kept_lastmod(values, row)
                    changed = [name for name, value in values.items() if row[name] != value]
            if changed:
                writes[key] = values
        present = sum(1 for key in keys if objects[key] is not None)
        if len(left_out) >= SYSTEMIC_FAILURE and len(left_out) == present:
            # Every object of the batch failed: the storage or the source is down, not the
            # objects bad. The batch fails (nothing is lost, it is tried again) rather than take
            # every resource out of the set.
            example = next(iter(left_out.values()))
            raise SourceUnavailable(f"all {present} objects of a batch of {self.resource_set.slug} failed, e.g.: {example}")
        refused = self._uri_clashes(writes, known)
        if refused:
            # A refused object keeps its record as it was, so none of its events stand.
            writes = {key: values for key, values in writes.items() if key not in refused}
            changes = [change for change in changes if change.object_pk not in refused]
        if gone:
            bulk.filter_in(Resource.objects.all(), "pk", gone).delete()
        self._note_left_out(left_out, [key for key in keys if key not in left_out])
        # Resources that move leave their old URIs, which the lists and dumps stop giving too.
        moved = {key: known[key]["id"] for key, values in writes.items() if key in known and known[key]["uri"] != values["uri"]}
        if withdrawn or moved:
            # What listed them or held their bytes stops serving them, in this transaction
            # (builders.withdrawal); bytes this batch's changes use (another object's) are not
            # theirs to forget.
            in_use = set(self.kept) | {change.sha256 for change in changes if change.sha256 and change.change != "deleted"}
            resources_left.send(sender=type(self.resource_set), resource_set=self.resource_set, leaving=withdrawn,
                                moved=moved, uris={key: known[key]["uri"] for key in (*withdrawn, *moved)}, in_use=in_use)
        now = timezone.now()
        set_id = self.resource_set.pk
        rewritten = {True: [], False: []}  # {moved: rows}
        for key, values in writes.items():
            if key in known:
                row = (known[key]["id"], set_id, key, *(values[name] for name in ENTRY_FIELDS), now)
                rewritten[known[key]["uri"] != values["uri"]].append(row)
        # A record written again keeps its key (builds plan their parts by key ranges); where
        # the database can, only the indexes of what changed are written: its URI's if it moved.
        for moved, rows in rewritten.items():
            same = ("resource_set_id", "object_pk") if moved else ("resource_set_id", "object_pk", "uri")
            bulk.rewrite(Resource, RECORD_FIELDS, rows, self.using, same=same)
        bulk.insert(Resource, RECORD_FIELDS, [
            (set_id, key, *(values[name] for name in ENTRY_FIELDS), now) for key, values in writes.items() if key not in known
        ], self.using)
        for change in changes:
            setattr(self.counts, change.change, getattr(self.counts, change.change) + 1)
        if self.record_events:
            if self.keeping:
                self._keep_missing(changes, objects)
            # In the order they were made (a stable sort: changes found now keep theirs).
            self.log.append(sorted(changes, key=_made))

    # -- the bytes of each change (the version store) ------------------------------------

    def _batch_contents(self, keys, objects, known, fingerprints):
        """``{key: content}`` of the objects of ``keys`` whose bytes must be read (no record
        whose fingerprint vouches for them), from one call of the source's ``contents()``; for
        the others, a :class:`~..sources.ReadAhead` where their files are read and hashed on
        threads meanwhile (``source.read_ahead()``; not where the version store keeps the
        bytes); the rest are read one by one (their files asked of the operating system first,
        several at a time: ``source.prefetch()``)."""
        wanted = [
            objects[key] for key in keys
            if objects[key] is not None and not vouches(known.get(key), fingerprints.get(key))
        ]
        if not wanted:
            return {}
        rendered = self.source.batch_contents(wanted)
        rest = [obj for obj in wanted if str(obj.pk) not in rendered]
        if not self.keeping:  # (the version store keeps the bytes as they are read)
            # Files read and hashed by a pool of threads while this one describes the objects.
            rendered.update(self.source.read_ahead(rest))
            rest = [obj for obj in rest if str(obj.pk) not in rendered]
        self.source.prefetch(rest)
        return rendered

    def _reader(self, row, content=NOT_RENDERED):
        """``entry_values``' ``read`` of an object whose record is ``row``: its bytes from
        ``content`` (what ``contents()`` gave for it) unless that is ``NOT_RENDERED``, else read
        by the source one by one (``None``: ``source.entry()`` reads them). The version store
        keeps them on the way, unless they are those of the record (no change)."""
        if isinstance(content, ReadAhead):
            return content.representation
        unless = row and row["sha256"]
        if content is NOT_RENDERED:
            return functools.partial(self._keep, unless=unless) if self.keeping else None
        # Made into chunks when it is read, in the object's own try: a bad value is that object's failure.
        if self.keeping:
            return lambda obj: self._keep(obj, unless, found=self.source.content_bitstream(content))
        return lambda obj: self.source.representation_of(obj, self.source.content_bitstream(content))

    def _keep(self, obj, unless=None, found=NOT_RENDERED):
        """Read, hash and keep the bytes of ``obj`` (``entry_values``' ``read``), or those of
        ``found``, its bitstream already had; bytes whose sha-256 is ``unless`` are not kept."""
        if found is NOT_RENDERED:
            found = self.source.bitstream(obj)
        if found is None:
            return None
        chunks, content_type = found
        media_type = self.source._declared_media_type(obj) or content_type
        representation = versions.keep(chunks, media_type, unless=unless)
        if representation.sha256 != unless:
            self.kept[representation.sha256] = representation.length
        return representation

    def _earlier(self, key, obj, row, values, past):
        """The changes of the saves ``past`` says the last change of ``obj`` overtook, with the
        bytes each left where they can still be had (see ``ResourceSource.saved_state``). A
        state that was not in the set (its item private then) is none of its changes. A
        resource that moved has none: to a Destination, it was deleted and created."""
        if past is None or not past.earlier or (row is not None and row["uri"] != values["uri"]):
            return []
        states = [state for _time, _seq, state in past.earlier]
        final = self.source.state_of_save(obj)
        changes = []
        for index, (time, seq, state) in enumerate(past.earlier):
            if self.resource_set.pk not in state.get("sets", ()):
                continue  # not in the set then (its item was private, say), or not known: nothing to tell
            representation = None
            later = [*states[index + 1 :], final]
            # Bytes under a name that a later state has too may have been overwritten since.
            if state.get("file") and all(state["file"] != other.get("file") for other in later):
                representation = self._state_bytes(obj, state)
            change = Change(key, values["uri"], "updated" if row is not None or changes else "created", datetime=time, seq=seq)
            if representation is not None:
                change.md5, change.sha256, change.length = representation.md5, representation.sha256, representation.length
                change.media_type = representation.media_type or ""
            changes.append(change)
        return changes

    def _state_bytes(self, obj, state):
        try:
            found = self.source.state_bitstream(obj, state)
            if found is None:
                return None
            chunks, media_type = found
            if not self.keeping:
                return Representation.of_chunks(chunks, media_type)
            representation = versions.keep(chunks, media_type)
        except (DatabaseError, StoreUnavailable):
            raise  # the batch fails, nothing is lost
        except Exception as exc:  # gone, refused, whatever the storage says: no hash rather than a wrong one
            logger.info("Set %s: an earlier state of %r cannot be read (%s); its change has no hash",
                        self.resource_set.slug, obj, exc)
            return None
        self.kept[representation.sha256] = representation.length
        return representation

    def _keep_missing(self, changes, objects):
        """Keep the bytes of the changes that reused hashes known before (their fingerprint
        did not change) unless the store has them already; note every kept one as used."""
        wanted = {change.sha256 for change in changes if change.sha256 and change.change != "deleted"} - set(self.kept)
        missing = wanted - versions.stored(wanted)
        for change in changes:
            obj = objects.get(change.object_pk)
            if change.sha256 in missing and obj is not None:
                missing.discard(change.sha256)
                try:
                    self._keep(obj)
                except UnpublishableResource:
                    pass  # its package leaves it out, and says so
        versions.record(self.kept)
        self.kept = {}

    def _note_left_out(self, left_out, others):
        """Record the objects that could not be listed (reported by builds and the admin) and
        forget those that were described, or left the set, since."""
        if left_out:
            now = timezone.now()
            known = set(
                bulk.filter_in(LeftOut.objects.filter(resource_set=self.resource_set), "object_pk", left_out)
                .values_list("object_pk", flat=True)
            )
            for key, reason in left_out.items():
                if key not in known:
                    logger.error("Set %s: object %s is left out, it cannot be published: %s", self.resource_set.slug, key, reason)
            bulk.filter_in(LeftOut.objects.filter(resource_set=self.resource_set), "object_pk", known).update(last_seen=now)
            LeftOut.objects.bulk_create(
                [LeftOut(resource_set=self.resource_set, object_pk=key, reason=reason, first_seen=now, last_seen=now)
                 for key, reason in left_out.items() if key not in known]
            )
        if others and self._has_left_out():
            bulk.filter_in(LeftOut.objects.filter(resource_set=self.resource_set), "object_pk", others).delete()

    def _has_left_out(self):
        if self._any_left_out is None:
            self._any_left_out = LeftOut.objects.filter(resource_set=self.resource_set).exists()
        return self._any_left_out

    def _read_unread(self, objects, keys):
        """``objects`` with those of ``keys`` read, in one query; one that has left the set's
        items since its fingerprint was read is ``None``, gone."""
        if not keys:
            return objects
        found = self.read_objects(keys)
        return {**objects, **{key: found.get(key) for key in keys}}

    def read_objects(self, keys):
        """``{key: obj}`` of those of ``keys`` that are among the set's items, in one query."""
        return {str(obj.pk): obj for obj in bulk.filter_in(self.source.queryset(self.resource_set.lookups), "pk", keys)}

    def _records(self, keys, fields):
        """``{object_pk: {field: value}}`` of the set's records of ``keys``."""
        if not keys:
            return {}
        recorded = bulk.filter_in(Resource.objects.filter(resource_set=self.resource_set), "object_pk", keys)
        return {row["object_pk"]: row for row in recorded.values(*fields)}

    def _unvouched(self, objects, fingerprints=None, history=None, known=None):
        """The keys of ``objects`` to describe and compare with their record (``known``, if
        read), and the fingerprints computed on the way. When the source's fingerprint covers
        its entries, an object whose fingerprint matches its record's is left out, unchanged,
        unread (unless it has saves in ``history`` that a later one overtook: those are
        changes)."""
        present = {key: obj for key, obj in objects.items() if obj is not None}
        if fingerprints is None:
            fingerprints = self._fingerprints(present)
        else:  # one that joined the items since they were read has none yet: described, "" kept
            fingerprints = {key: fingerprints.get(key, "") for key in present}
        if not self.source.fingerprint_covers_entry:
            return list(objects), fingerprints
        unchanged = matching_fingerprints(self.resource_set, fingerprints) if known is None else _matching(known, fingerprints)
        if history:
            unchanged = {key for key in unchanged if key not in history or not history[key].earlier}
        self.counts.unchanged += len(unchanged)
        return [key for key in objects if key not in unchanged], fingerprints

    # -- objects described ahead (processing.prepare_in_parts) ----------------------------

    def prepare(self, keys):
        """Describe the objects ``keys`` whose fingerprint differs from their record, and keep
        what was described (:class:`~..models.PreparedEntry`) for :meth:`apply` to use while
        their fingerprint stays the same. Objects that cannot be described are left for
        :meth:`apply` to report. Returns how many were kept."""
        fingerprints = self.read_fingerprints(keys)  # first, as everywhere
        known, stale = self._differing(list(fingerprints), fingerprints)
        if not stale:
            return 0
        objects = self.read_objects(stale)
        stale = [key for key in stale if key in objects]
        kept = self._describe_ahead(stale, objects, known, fingerprints)
        # COPY on PostgreSQL: each value, the entry's XML among them, goes as it is (an INSERT
        # of the ORM has psycopg escape each one, most of the time of a part).
        now = timezone.now()
        rows = []
        for key, fingerprint, values in kept:
            lastmod = values["lastmod"] and values["lastmod"].isoformat()
            rows.append((self.resource_set.pk, key, fingerprint, json.dumps({**values, "lastmod": lastmod}), now))
        bulk.insert(PreparedEntry, ("resource_set_id", "object_pk", "fingerprint", "values", "created"), rows,
                    router.db_for_write(PreparedEntry))
        return len(kept)

    def _differing(self, keys, fingerprints):
        """``(known, stale)``: the records of ``keys`` as far as they tell whether the fingerprint
        changed (an older form of it still matches) and the hashes it vouches for if not, and
        those of ``keys`` with a fingerprint their record's does not match."""
        known = self._records(keys, ("object_pk", "fingerprint", *REPRESENTATION_FIELDS))
        unchanged = _matching(known, fingerprints)
        return known, [key for key in keys if fingerprints.get(key) and key not in unchanged]

    def _describe_ahead(self, stale, objects, known, fingerprints):
        """``[(key, fingerprint, values)]`` of the objects ``stale`` that could be described."""
        kept = []
        with rendering.batch():
            rendered = self._batch_contents(stale, objects, known, fingerprints)
            for key in stale:
                row = known.get(key)
                try:
                    values = entry_values(self.source, objects[key], row, fingerprints[key],
                                          self._reader(row, rendered.get(key, NOT_RENDERED)))
                except DatabaseError:
                    raise
                except Exception:  # reported when its change is written
                    continue
                kept.append((key, fingerprints[key], values))
        return kept

    def _prepared(self, keys, fingerprints, described):
        """``{key: values}`` of the objects ``keys`` described ahead from the fingerprint they
        have now (read before the objects): in ``described`` (see :func:`described_ahead`), or
        else kept in the database by :meth:`prepare`."""
        if not keys or not self.source.fingerprint_covers_entry or self.keeping:
            return {}
        ready = {
            key: described[key][1] for key in keys
            if key in described and described[key][0] and described[key][0] == fingerprints.get(key)
        }
        keys = [key for key in keys if key not in ready]
        if not keys:
            return ready
        # From the database they were written to (a replica may not have them yet).
        entries = PreparedEntry.objects.using(router.db_for_write(PreparedEntry)).filter(resource_set=self.resource_set)
        prepared = ready
        found = bulk.filter_in(entries, "object_pk", keys).values_list("object_pk", "fingerprint", "values")
        for key, fingerprint, text in found:
            if fingerprint and fingerprints.get(key) == fingerprint:
                values = json.loads(text)
                lastmod = values["lastmod"]
                prepared[key] = {**values, "lastmod": lastmod and datetime.datetime.fromisoformat(lastmod)}
        return prepared

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
            except DatabaseError:
                raise
            except Exception:
                pass  # described below, where it is reported
        return fingerprints

    def _uri_clashes(self, writes, known):
        """Keys of objects whose URI another object of the set already publishes: left out.
        An object that keeps the URI of its record (``known``) is the one that publishes it (a
        set's URIs are unique): only new and moved URIs are looked for."""
        if not writes:
            return set()
        looked_for = [values["uri"] for key, values in writes.items() if key not in known or known[key]["uri"] != values["uri"]]
        found = bulk.filter_in(Resource.objects.filter(resource_set=self.resource_set), "uri", looked_for)
        taken = dict(found.values_list("uri", "object_pk")) if looked_for else {}
        refused = set()
        for key, values in writes.items():
            owner = taken.get(values["uri"])
            if owner is not None and owner != key:
                logger.warning(
                    "Set %s: object %s has the URI %s of object %s; not published",
                    self.resource_set.slug, key, values["uri"], owner
                )
                refused.add(key)
                self.counts.skipped += 1
            else:
                taken[values["uri"]] = key
        return refused
