"""The change log: events appended to a set's open Change List, lists closed into storage.

A set's change log is cut into Change Lists (spec section 12.1). The newest is open: it has no
``until``, and it takes every event as it is written. A list closes when it reaches
``MAX_ENTRIES_PER_DOCUMENT`` entries or when its period (``CHANGELIST_PERIOD``, aligned on the
epoch: whole hours, whole days) is over; closing writes it once into storage, immutable, with
``until``, and opens the next list from that datetime. Closed lists older than
``CHANGELIST_RETENTION`` are dropped, with the Change Dump packages of their events. Serving the
lists and their index is :mod:`django_resourcesync.builders.changelist`'s.
"""

import datetime

from django.db import router
from django.db.models import F, Max, Min, Q
from django.utils import timezone

from .. import bulk, capabilities, heads, mementos, storage, versions
from ..conf import app_settings, archive_retention
from ..models import Build, ChangeEvent, ChangeList, PendingChange
from ..xml.writer import DocumentWriter, change_entry, w3c_datetime

NAME = "changelist.xml"
# Periods are counted from a Monday midnight (UTC), so weeks start on Mondays, days at midnight.
EPOCH = datetime.datetime(1970, 1, 5, tzinfo=datetime.timezone.utc)
PERIODS = {"hourly": 3600, "daily": 86400, "weekly": 7 * 86400}
#: The capabilities whose documents are snapshots of the set taken at their ``at``.
SNAPSHOTS = (capabilities.RESOURCELIST, capabilities.RESOURCEDUMP)
#: The smallest step of a datetime: an event after a list closed at ``until`` is at least this later.
TICK = datetime.timedelta(microseconds=1)


def period_seconds():
    value = app_settings.CHANGELIST_PERIOD
    return PERIODS.get(value, value)


def period_end(moment):
    """The first period boundary strictly after ``moment``."""
    period = period_seconds()
    elapsed = (moment - EPOCH).total_seconds()
    return EPOCH + datetime.timedelta(seconds=(int(elapsed // period) + 1) * period)


def part_name(number):
    return f"changelist/{number}.xml"


def start_log(resource_set, moment=None):
    """Open the set's first Change List (from ``moment``, default now) unless it has one."""
    if not resource_set.changelists.exists():
        ChangeList.objects.create(resource_set=resource_set, number=1, from_time=moment or timezone.now())


class ChangeLog:
    """Appends change events to a set's open Change List. Use it only while holding the set's
    row lock (:func:`django_resourcesync.tracking.locked`)."""

    def __init__(self, resource_set):
        self.resource_set = resource_set
        self.mementos = versions.publishes(resource_set)
        self.open = ChangeList.objects.filter(resource_set=resource_set, until__isnull=True).first()
        if self.open is None:
            last = resource_set.changelists.order_by("-number").first()
            self.open = ChangeList.objects.create(
                resource_set=resource_set,
                number=last.number + 1 if last else 1,
                from_time=last.until if last else timezone.now(),
            )

    def append(self, changes):
        """Write :class:`~django_resourcesync.tracking.Change` objects as change events, in
        order, each at its ``datetime`` (now, for a change without one). Datetimes never go
        backwards, whatever the clocks, and never fall before a snapshot already taken (a
        Resource List's ``at``): a change processed late is dated after the events, and the
        snapshots, that went before it."""
        if not changes:
            return
        now = timezone.now()
        floor = self._floor()
        rows = []
        set_id = self.resource_set.pk
        for change in changes:
            moment = max(change.datetime or now, self._earliest(), floor)
            entry = self._entry(change, moment)
            until = self._closing_point(moment, len(entry))
            if until is not None:
                self._insert(rows)
                rows = []
                self._close(until)
                # Strictly after the closed list's until: a Destination that goes on from a
                # closed list with the events after its until misses none.
                if moment <= until:
                    moment = until + TICK
                    entry = self._entry(change, moment)
            rows.append((
                set_id, self.open.pk, change.object_pk, change.uri, change.change, moment,
                change.lastmod, change.md5, change.sha256, change.length, change.media_type, change.encoding, entry,
            ))
            self.open.entries += 1
            self.open.size += len(entry)
            self.open.last_datetime = moment
        self._insert(rows)
        self.open.save(update_fields=["entries", "last_datetime", "size"])

    def _floor(self):
        """The earliest datetime of an event written now: after the newest snapshot of the set
        (taken under its lock, so none is being taken now), which shows every change before it."""
        taken = Q(status__in=[Build.Status.PUBLISHED, Build.Status.RETIRED]) | Q(status=Build.Status.RUNNING, at__gt=F("started"))
        # (A running build's at is its start until the snapshot is taken, after its refresh.)
        newest = (
            Build.objects.filter(taken, resource_set=self.resource_set, capability__in=SNAPSHOTS)
            .aggregate(newest=Max("at"))["newest"]
        )
        return newest + TICK if newest else self.open.from_time

    def _earliest(self):
        """The earliest datetime the next event may have: after the open list's last event, or
        after the ``until`` of the list it follows (its ``from``), whatever the clocks say."""
        if self.open.last_datetime is not None:
            return self.open.last_datetime + TICK
        return self.open.from_time + TICK if self.open.number > 1 else self.open.from_time

    def _entry(self, change, moment):
        links = change.links
        if self.mementos and change.change != "deleted" and change.sha256:
            # The state it left is a prior version from now on (its bytes are in the store).
            links = [*links, *mementos.change_links(
                self.resource_set, change.object_pk, moment, lastmod=change.lastmod, md5=change.md5,
                sha256=change.sha256, length=change.length, media_type=change.media_type,
            )]
        return change_entry(
            change.uri, change.change, w3c_datetime(moment), change.lastmod, change.md5, change.sha256,
            change.length, change.media_type, links, change.encoding
        )

    EVENT_FIELDS = (
        "resource_set_id", "changelist_id", "object_pk", "uri", "change", "datetime",
        "lastmod", "md5", "sha256", "length", "media_type", "encoding", "entry_xml",
    )

    def _insert(self, rows):
        if rows:
            bulk.insert(ChangeEvent, self.EVENT_FIELDS, rows, router.db_for_write(ChangeEvent))

    def _closing_point(self, moment, entry_size):
        """``until`` for the open list if an event at ``moment`` (its entry ``entry_size``
        bytes) may not join it, else ``None``. The list's ``size`` counts its entries' bytes
        while it is open: the document stays within ``MAX_DOCUMENT_BYTES``, as Resource Lists do."""
        current = self.open
        if not current.entries:
            return None
        full = current.entries >= app_settings.MAX_ENTRIES_PER_DOCUMENT
        if full or DocumentWriter.HEAD_ROOM + current.size + entry_size > app_settings.MAX_DOCUMENT_BYTES:
            return current.last_datetime
        boundary = period_end(current.last_datetime)
        return boundary if boundary <= moment else None

    def _close(self, until):
        self.open.save(update_fields=["entries", "last_datetime", "size"])
        close(self.open, until)
        self.open = ChangeList.objects.create(resource_set=self.resource_set, number=self.open.number + 1, from_time=until)


def close(changelist, until):
    """Close a list at ``until``: write it into storage for good."""
    changelist.until = until
    with storage.scratch_file() as tmp:
        writer = render_list(changelist, tmp, has_index=True)
        changelist.storage_name = storage.save_or_remove(
            storage.storage_name(changelist.resource_set.slug, "changelists", f"changelist-{changelist.number:06d}.xml"), tmp
        )
    changelist.size, changelist.sha256 = writer.size, writer.sha256
    changelist.save(update_fields=["until", "storage_name", "size", "sha256"])


def close_due(resource_set, now=None):
    """Close the open list if its period is over; drop closed lists past retention. For beat."""
    now = now or timezone.now()
    current = ChangeList.objects.filter(resource_set=resource_set, until__isnull=True).first()
    if current is not None and current.entries and period_end(current.last_datetime) <= now:
        until = period_end(current.last_datetime)
        # Not while a change made before its until waits to be processed (a worker outage):
        # it belongs in this list, which then closes as its processing goes past the until.
        waiting = PendingChange.objects.filter(source=resource_set.source, recorded__lt=until).filter(
            Q(resource_set__isnull=True) | Q(resource_set=resource_set)
        )
        if not waiting.exists():
            ChangeLog(resource_set)._close(until)
    retention = app_settings.CHANGELIST_RETENTION
    if retention:
        cutoff = now - datetime.timedelta(seconds=retention)
        # Deleting a list deletes its events, and its file once the deletion commits; the same
        # goes for Change Dump packages. A package goes with the oldest events it holds: once
        # they are gone, nothing could find it to withdraw it when a resource in it leaves.
        # A set that offers the list's or the package's archive keeps it there instead (see
        # builders.archive); an archived list keeps its events, which its entries' mementos
        # (and withdrawals) need, until it leaves the archive.
        old_lists = ChangeList.objects.filter(resource_set=resource_set, until__lt=cutoff, archived__isnull=True)
        last_event = ChangeEvent.objects.filter(changelist__in=old_lists).order_by("-id").values_list("id", flat=True).first()
        live = resource_set.changedump_packages.filter(archived__isnull=True)
        old_packages = live.filter(until__lt=cutoff)
        if last_event is not None:
            old_packages = old_packages | live.filter(first_event__lte=last_event)
        keep_packages = resource_set.has_capability(capabilities.CHANGEDUMP_ARCHIVE)
        for old in old_packages:
            if keep_packages and old.withdrawn is None:
                archive_package(old, now)
            else:
                old.delete()
        # Kept for the Change List Archive, or for the mementos the archived packages' manifests link.
        keep_lists = resource_set.has_capability(capabilities.CHANGELIST_ARCHIVE) or keep_packages
        for old in old_lists:
            if keep_lists and old.storage_name:
                old.archived = now
                old.save(update_fields=["archived"])
            else:
                old.delete()
    prune_archives(resource_set, now)


def archive_package(package, now):
    """Keep a Change Dump package whose changes leave the log in the Change Dump Archive: with
    the keys of the objects whose bytes it holds, which its events told until now."""
    events = ChangeEvent.objects.filter(
        resource_set_id=package.resource_set_id, id__gte=package.first_event, id__lte=package.last_event
    ).exclude(change=ChangeEvent.Change.DELETED)
    package.keys = sorted(set(events.values_list("object_pk", flat=True)))
    package.archived = now
    package.save(update_fields=["keys", "archived"])


def prune_archives(resource_set, now):
    """Drop what leaves the Change Dump and Change List Archives (``ARCHIVE_RETENTION``: how
    many, the live ones included, and how old), and all of an archive the set no longer offers;
    their files leave storage once this commits. A list whose events a kept package refers to
    (the mementos its manifest links) stays until that package goes."""
    packages = resource_set.changedump_packages
    archived = packages.filter(archived__isnull=False)
    archived.filter(withdrawn__isnull=False).delete()  # it held what is no longer public: it leaves
    for old in archived.filter(pk__in=_doomed(resource_set, capabilities.CHANGEDUMP_ARCHIVE, packages, now)):
        old.delete()
    lists = resource_set.changelists
    doomed = set(_doomed(resource_set, capabilities.CHANGELIST_ARCHIVE, lists, now))
    kept = list(packages.filter(withdrawn__isnull=True).values_list("first_event", "last_event"))
    for old in lists.filter(pk__in=doomed).annotate(first=Min("changes__id"), last=Max("changes__id")):
        if old.first is not None and any(first <= old.last and last >= old.first for first, last in kept):
            continue
        old.delete()


def _doomed(resource_set, archive, rows, now):
    """Keys of the archived ``rows`` past the archive's retention; all of them if the set does
    not offer the archive."""
    archived = rows.filter(archived__isnull=False)
    if not resource_set.has_capability(archive):
        return list(archived.values_list("pk", flat=True))
    count, age = archive_retention(capabilities.ARCHIVES[archive])
    doomed = set()
    if age is not None:
        doomed.update(archived.filter(until__lt=now - datetime.timedelta(seconds=age)).values_list("pk", flat=True))
    if count is not None:
        excess = rows.count() - count
        if excess > 0:
            doomed.update(archived.order_by("number").values_list("pk", flat=True)[:excess])
    return sorted(doomed)


def render_list(changelist, fileobj, *, has_index):
    """Write one Change List into ``fileobj``; returns the finished writer."""
    resource_set = changelist.resource_set
    writer = DocumentWriter()
    entries = changelist.changes.order_by("id").values_list("entry_xml", flat=True)
    for entry in entries.iterator(chunk_size=app_settings.BATCH_SIZE):
        writer.add(entry)
    md, links = heads.head(resource_set, capabilities.CHANGELIST, from_=changelist.from_time, until=changelist.until,
                           indexed_by=capabilities.CHANGELIST if has_index else None)
    return writer.finish(fileobj, md=md, links=links)
