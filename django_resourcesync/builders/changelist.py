"""Change Lists and the Change List Index (spec sections 12.1 and 12.2).

A set's change log is cut into Change Lists. The newest is open: it has no ``until``, and it is
rendered from the database on every request, so a committed change shows as soon as it is
processed, with no rebuild. A list closes when it reaches ``MAX_ENTRIES_PER_DOCUMENT`` entries or
when its period (``CHANGELIST_PERIOD``, aligned on the epoch: whole hours, whole days) is over;
closing writes it once into storage, immutable, with ``until``, and opens the next list from that
datetime. Once there is more than one list, ``changelist.xml`` is a Change List Index, listing
them oldest first, and every list links to it with ``rel="index"``. Closed lists older than
``CHANGELIST_RETENTION`` are dropped; the index's ``from`` then tells a Destination how far back
the log reaches.

URIs: ``changelist.xml`` (the open list, or the index) and ``changelist/<number>.xml``.
"""

import datetime
import hashlib
import io
import tempfile

from django.db import router
from django.utils import timezone

from .. import bulk, capabilities, storage, uris
from ..conf import app_settings
from ..models import ChangeEvent, ChangeList
from ..xml.writer import DocumentWriter, change_entry, url_element, w3c_datetime

NAME = "changelist.xml"
# Periods are counted from a Monday midnight (UTC), so weeks start on Mondays, days at midnight.
EPOCH = datetime.datetime(1970, 1, 5, tzinfo=datetime.timezone.utc)
PERIODS = {"hourly": 3600, "daily": 86400, "weekly": 7 * 86400}


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
        order. Datetimes never go backwards, whatever the clock."""
        now = timezone.now()
        done = 0
        while done < len(changes):
            # Every event of a call has the same datetime (the clock's, or the last event's if
            # the clock went back), so a list can only close before the first one, or when full.
            moment = max(now, self.open.last_datetime or self.open.from_time)
            until = self._closing_point(moment)
            if until is not None:
                self._close(until)
                moment = max(moment, self.open.from_time)
            batch = changes[done : done + app_settings.MAX_ENTRIES_PER_DOCUMENT - self.open.entries]
            stamp = w3c_datetime(moment)
            set_id, list_id = self.resource_set.pk, self.open.pk
            self._insert([
                (
                    set_id, list_id, change.object_pk, change.uri, change.change, moment,
                    change.lastmod, change.md5, change.sha256, change.length, change.media_type,
                    change_entry(
                        change.uri, change.change, stamp, change.lastmod, change.md5, change.sha256, change.length, change.media_type, change.links
                    ),
                )
                for change in batch
            ])
            self.open.entries += len(batch)
            self.open.last_datetime = moment
            done += len(batch)
        if changes:
            self.open.save(update_fields=["entries", "last_datetime"])

    EVENT_FIELDS = (
        "resource_set_id", "changelist_id", "object_pk", "uri", "change", "datetime",
        "lastmod", "md5", "sha256", "length", "media_type", "entry_xml",
    )

    def _insert(self, rows):
        bulk.insert(ChangeEvent, self.EVENT_FIELDS, rows, router.db_for_write(ChangeEvent))

    def _closing_point(self, moment):
        """``until`` for the open list if an event at ``moment`` may not join it, else ``None``."""
        current = self.open
        if not current.entries:
            return None
        if current.entries >= app_settings.MAX_ENTRIES_PER_DOCUMENT:
            return current.last_datetime
        boundary = period_end(current.last_datetime)
        return boundary if boundary <= moment else None

    def _close(self, until):
        self.open.save(update_fields=["entries", "last_datetime"])
        close(self.open, until)
        self.open = ChangeList.objects.create(resource_set=self.resource_set, number=self.open.number + 1, from_time=until)


def close(changelist, until):
    """Close a list at ``until``: write it into storage for good."""
    changelist.until = until
    with tempfile.TemporaryFile() as tmp:
        writer = render_list(changelist, tmp, has_index=True)
        changelist.storage_name = storage.save(
            storage.storage_name(changelist.resource_set.slug, "changelists", f"changelist-{changelist.number:06d}.xml"), tmp
        )
    changelist.size, changelist.sha256 = writer.size, writer.sha256
    changelist.save(update_fields=["until", "storage_name", "size", "sha256"])


def close_due(resource_set, now=None):
    """Close the open list if its period is over; drop closed lists past retention. For beat."""
    now = now or timezone.now()
    current = ChangeList.objects.filter(resource_set=resource_set, until__isnull=True).first()
    if current is not None and current.entries and period_end(current.last_datetime) <= now:
        ChangeLog(resource_set)._close(period_end(current.last_datetime))
    retention = app_settings.CHANGELIST_RETENTION
    if retention:
        cutoff = now - datetime.timedelta(seconds=retention)
        # Deleting a list deletes its events, and its file once the deletion commits; the same
        # goes for Change Dump packages.
        for old in ChangeList.objects.filter(resource_set=resource_set, until__lt=cutoff):
            old.delete()
        for old in resource_set.changedump_packages.filter(until__lt=cutoff):
            old.delete()


def render_list(changelist, fileobj, *, has_index):
    """Write one Change List into ``fileobj``; returns the finished writer."""
    resource_set = changelist.resource_set
    writer = DocumentWriter()
    entries = changelist.changes.order_by("id").values_list("entry_xml", flat=True)
    for entry in entries.iterator(chunk_size=app_settings.BATCH_SIZE):
        writer.add(entry)
    md = {"capability": capabilities.CHANGELIST, "from": w3c_datetime(changelist.from_time)}
    if changelist.until is not None:
        md["until"] = w3c_datetime(changelist.until)
    links = [{"rel": "up", "href": uris.capability_list_uri(resource_set)}]
    if has_index:
        links.append({"rel": "index", "href": uris.document_uri(resource_set, NAME)})
    return writer.finish(fileobj, md=md, links=links)


def render_index(resource_set, lists):
    writer = DocumentWriter(root="sitemapindex")
    for changelist in lists:
        md = {"from": w3c_datetime(changelist.from_time)}
        if changelist.until is not None:
            md["until"] = w3c_datetime(changelist.until)
        writer.add(url_element(uris.document_uri(resource_set, part_name(changelist.number)), md=md, tag="sitemap"))
    out = io.BytesIO()
    md = {"capability": capabilities.CHANGELIST, "from": w3c_datetime(lists[0].from_time)}
    if all(changelist.until is not None for changelist in lists):
        md["until"] = w3c_datetime(lists[-1].until)
    writer.finish(out, md=md, links=[{"rel": "up", "href": uris.capability_list_uri(resource_set)}])
    return out.getvalue()


class Served:
    """What a view needs to answer for a Change List document."""

    def __init__(self, etag, last_modified, body=None, storage_name=None, size=None):
        self.etag, self.last_modified = etag, last_modified
        self.body, self.storage_name, self.size = body, storage_name, size


def _live(changelist, has_index):
    """The open list: its ETag comes from the database, the body is rendered on demand."""
    etag = hashlib.sha256(f"{changelist.pk}:{changelist.entries}:{changelist.last_datetime}:{has_index}".encode()).hexdigest()

    def body():
        out = io.BytesIO()
        render_list(changelist, out, has_index=has_index)
        return out.getvalue()

    return Served(etag, changelist.last_datetime or changelist.from_time, body=body)


def _stored(changelist):
    return Served(changelist.sha256, changelist.until, storage_name=changelist.storage_name, size=changelist.size)


def serve(resource_set, name):
    """The :class:`Served` for ``changelist.xml`` or ``changelist/<number>.xml``, or ``None``."""
    lists = list(resource_set.changelists.order_by("number"))
    if not lists:
        return None
    has_index = len(lists) > 1
    if name == NAME:
        if not has_index:
            return _live(lists[0], has_index=False)
        body = render_index(resource_set, lists)
        return Served(hashlib.sha256(body).hexdigest(), max(c.last_datetime or c.from_time for c in lists), body=lambda: body)
    for changelist in lists:
        if name == part_name(changelist.number):
            return _live(changelist, has_index) if changelist.is_open else _stored(changelist)
    return None
