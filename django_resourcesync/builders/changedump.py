"""Change Dump and its packages (spec sections 13.1 and 13.2).

Each package holds the bitstreams of the changes recorded in an interval, in log order: the
changes not yet in any package when it is cut (by ``resourcesync_rebuild`` or the beat task
``resourcesync.package_changes``). Its manifest lists every change oldest first, with ``change``
and ``datetime``, and ``path`` on all but deletions; a resource changed twice is in the package
twice, with the bytes of each change, as the version store kept them when the change was
processed (:mod:`django_resourcesync.versions`): the manifest's hashes are the Change List's. A
change whose bytes were not kept (no longer to be had when it was processed, or the store is off)
is packed with the resource's current bytes if they are still that change's, else left out.
The bytes of a resource that has left the set are not packed (its deletion is in the log), and
its ``created`` and ``updated`` changes are left out of the manifest too: section 13.2 wants a
``path`` on every entry but a deletion's, so a change cannot be listed without its bitstream. A
deviation from section 13.2 ("bitstream for all resource changes that occurred during the
specified interval must be included"), kept for privacy and documented in docs/dumps.rst. The
Change Dump lists the packages oldest first with ``from`` and ``until`` each, and has no
``until`` itself: it is extended as packages follow.

URIs: ``changedump.xml``, ``changedump/<number>.zip`` and ``changedump/<number>-manifest.xml``.
"""

import bisect
import io
import logging

from django.db import transaction
from django.db.models import Case, Exists, Max, OuterRef, Subquery, When
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone
from django.utils.translation import ngettext

from .. import bulk, capabilities, heads, mementos, storage, tracking, uris, versions
from ..conf import app_settings
from ..entries import Representation
from ..exceptions import BuildAbandoned, UnpublishableResource
from ..models import Build, ChangeDumpPackage, ChangeEvent, ChangeList, Resource, Withdrawal
from ..served import GONE, Served
from ..xml.writer import DocumentWriter, url_element, w3c_datetime
from .context import BuildContext
from .resourcedump import Packer, dump_entry, manifest_entry_size

logger = logging.getLogger(__name__)

NAME = "changedump.xml"


def package_name(number):
    return f"changedump/{number}.zip"


def manifest_name(number):
    return f"changedump/{number}-manifest.xml"


def package_changes(resource_set):
    """Cut a package of the changes recorded since the last one; ``None`` if there are none.
    A package withdrawn since it was cut (it held the bytes of a resource that has left the set)
    is packed again first, without them. A set whose source gives no bytes has no packages."""
    if not resource_set.get_source().gives_bytes:
        return None
    # (An archived one is not packed again: it leaves the archive, see prune_archives.)
    withdrawn = resource_set.changedump_packages.filter(withdrawn__isnull=False, archived__isnull=True).order_by("number").first()
    if withdrawn is not None:
        events = ChangeEvent.objects.filter(
            resource_set=resource_set, id__gte=withdrawn.first_event, id__lte=withdrawn.last_event
        )
        if not events.exists():  # its changes are past retention: nothing to pack again
            withdrawn.delete()
            return package_changes(resource_set)
        return _cut(resource_set, withdrawn.number, list(events.order_by("id")), withdrawn.from_time, withdrawn.until,
                    replacing=withdrawn)
    with tracking.locked(resource_set):
        # Under the set's lock no change is being written: everything up to `until` is in.
        previous = resource_set.changedump_packages.order_by("-number").first()
        start = ChangeList.objects.filter(resource_set=resource_set).order_by("number").first()
        if start is None:
            return None
        events = ChangeEvent.objects.filter(resource_set=resource_set)
        if previous is not None:
            events = events.filter(id__gt=previous.last_event)
        last = events.order_by("-id").values_list("id", flat=True).first()
        if last is None:
            return None
        # Its last change's datetime: every later change is after it (the change log sees to it),
        # whichever clock stamps it, so the next package holds only changes after this until.
        until = events.order_by("-id").first().datetime
        from_time = previous.until if previous is not None else start.from_time
    limit = app_settings.MAX_ENTRIES_PER_DOCUMENT
    events = list(events.filter(id__lte=last).order_by("id")[: limit + 1])
    # The manifest (one document, a package is not split) within MAX_DOCUMENT_BYTES too.
    size = DocumentWriter.HEAD_ROOM
    for index, event in enumerate(events):
        size += manifest_entry_size(event)
        if index and size > app_settings.MAX_DOCUMENT_BYTES:
            limit = min(limit, index)
            break
    if len(events) > limit:
        # A full package ends between two datetimes, so that the next one holds only events
        # after its until (events of one datetime are not cut apart, unless they alone fill it).
        following = events[limit].datetime
        events = events[:limit]
        kept = [event for event in events if event.datetime < following]
        events = kept or events
        until = events[-1].datetime
    number = previous.number + 1 if previous is not None else 1
    return _cut(resource_set, number, events, from_time, until)


def _cut(resource_set, number, events, from_time, until, *, replacing=None):
    """Pack ``events`` as package ``number``; records it (or rewrites ``replacing``)."""
    source = resource_set.get_source()
    # The packages are not a replaceable build; the build context only lends its file handling.
    context = BuildContext(resource_set, capabilities.CHANGEDUMP, at=from_time)
    packer = Packer(context, source, capability=capabilities.CHANGEDUMP, name_of=lambda n: package_name(number),
                    manifest_of=lambda n: manifest_name(number), split=False)
    try:
        keys = {event.object_pk for event in events if event.change != "deleted"}
        # Only the bytes of resources still in the set: one that left it is withdrawn from
        # every package (its changes stay in the Change List, with its deletion). Its created
        # and updated changes are not listed either: an entry without a path is a deletion's.
        present = set(
            bulk.filter_in(Resource.objects.filter(resource_set=resource_set), "object_pk", keys)
            .values_list("object_pk", flat=True)
        )
        current = _Current(source, resource_set, present)
        linking = versions.publishes(resource_set)
        left_out = departed = 0
        for event in events:
            md = {"change": event.change, "datetime": w3c_datetime(event.datetime)}
            links = ()
            if event.change != "deleted":
                if event.object_pk not in present:
                    departed += 1
                    continue
                found = versions.open_bytes(event.sha256) if event.sha256 else None
                if found is not None and linking:  # a prior version: its memento, as the Change List links it
                    links = mementos.change_links(
                        resource_set, event.object_pk, event.datetime, lastmod=event.lastmod, md5=event.md5,
                        sha256=event.sha256, length=event.length, media_type=event.media_type,
                    )
                if found is None:
                    found = current.bytes_of(event)
                if found is None:
                    left_out += 1
                    continue
                md.update(packer.pack_bytes(event, *found))
            packer.add_entry(
                url_element(event.uri, lastmod=event.lastmod if event.change != "deleted" else None, md=md, links=links)
            )
        if left_out:
            logger.warning("%s Change Dump package %d: %d change(s) whose bytes are not kept are left out",
                           resource_set.slug, number, left_out)
        if departed:  # as it should be: no longer public
            logger.info("%s Change Dump package %d: %d change(s) of resources that have left the set are left out",
                        resource_set.slug, number, departed)
        if replacing is not None:
            packer.open()  # the package is there again, empty if nothing of it is left
        packer.finish(md={"from": w3c_datetime(from_time), "until": w3c_datetime(until)})
    except BaseException as exc:
        packer.abort()
        context.fail(exc)
        raise
    if not packer.packages:
        context.discard_record()
        return None
    package_doc, manifest_doc, _md = packer.packages[0]
    values = dict(
        from_time=from_time, until=until, first_event=events[0].id, last_event=events[-1].id, entries=package_doc.entries,
        storage_name=package_doc.storage_name, size=package_doc.size, sha256=package_doc.sha256,
        manifest_storage_name=manifest_doc.storage_name, manifest_size=manifest_doc.size, manifest_sha256=manifest_doc.sha256,
        written=timezone.now(), withdrawn=None,
    )
    with tracking.locked(resource_set):
        if not Build.objects.filter(pk=context.build.pk, status=Build.Status.RUNNING).exists():
            # Its lock was taken over (or the sweep found it abandoned): another cut owns the
            # package now, and this one may hold bytes a withdrawal could not see.
            storage.delete_quietly([package_doc.storage_name, manifest_doc.storage_name])
            raise BuildAbandoned(f"the Change Dump package {number} of {resource_set.slug} was cut by another process")
        context.discard_record()
        if replacing is not None:
            ChangeDumpPackage.objects.filter(pk=replacing.pk).update(**values)
            package = ChangeDumpPackage.objects.get(pk=replacing.pk)
        else:
            package = ChangeDumpPackage.objects.create(resource_set=resource_set, number=number, **values)
        # A resource that left the set while this was packed: the package is withdrawn at once
        # and packed again next time.
        leaving = {key for key, *_rest in Withdrawal.since(resource_set, context.build.started)}
        if leaving & keys:
            withdraw_packages(ChangeDumpPackage.objects.filter(pk=package.pk))
    return package


class _Current:
    """The bytes a resource has now, for a change whose own bytes the store does not hold (it
    was processed before the store was on, or with ``KEEP_VERSIONS`` off): packed only if they
    are that change's bytes, checked by their hash first (each resource read once)."""

    def __init__(self, source, resource_set, keys):
        self.source, self.resource_set, self.keys = source, resource_set, keys
        self.keeping = versions.keeps(resource_set)
        self._objects = None
        self._hashed = {}  # {object_pk: Representation of its current bytes, or None}

    def bytes_of(self, event):
        """``(chunks, length)`` of the event's bytes, or ``None``."""
        if not event.sha256:
            return None
        if self._objects is None:
            queryset = bulk.filter_in(self.source.queryset(self.resource_set.lookups), "pk", self.keys)
            self._objects = {str(obj.pk): obj for obj in queryset}
        obj = self._objects.get(event.object_pk)
        if obj is None:
            return None
        try:
            if event.object_pk not in self._hashed:
                self._hashed[event.object_pk] = self._hash(obj)
            found = self._hashed[event.object_pk]
            if found is None or found.sha256 != event.sha256:
                return None
            if self.keeping:
                versions.record({found.sha256: found.length})
                return versions.open_bytes(found.sha256)
            again = self.source.bitstream(obj)
            return (again[0], found.length) if again is not None else None
        except (UnpublishableResource, OSError) as exc:
            logger.warning("Left out of the package: %s (%s)", event.uri, exc)
            self._hashed[event.object_pk] = None
            return None

    def _hash(self, obj):
        """The current bytes' Representation (kept in the store on the way, if it keeps)."""
        found = self.source.bitstream(obj)
        if found is None:
            return None
        if self.keeping:
            return versions.keep(found[0])
        return Representation.of_chunks(found[0])


def published(resource_set):
    """When the set's Change Dump last changed; ``None`` before its first package."""
    return _last_modified(resource_set)


def published_expression():
    """:func:`published` as an expression of a set's row (see capabilities.with_published)."""
    # A package withdrawn, packed again or archived changes the document too: the newest of
    # those dates; None while it has no package (all of them may have gone to its archive).
    packages = ChangeDumpPackage.objects.filter(resource_set=OuterRef("pk")).order_by().values("resource_set")
    # (SQLite's GREATEST is NULL if any of its values is: an empty date counts as the writing's.)
    newest = Max(Greatest("written", Coalesce("withdrawn", "written"), Coalesce("archived", "written")))
    newest = Subquery(packages.annotate(newest=newest).values("newest"))
    return Case(When(Exists(packages.filter(archived__isnull=True)), then=newest))


def _last_modified(resource_set):
    return capabilities.published_value(resource_set, capabilities.CHANGEDUMP, published_expression)


def update(resource_set, *, progress=None, batch_size=None, parallel=False, lock=None):
    """The capability table's way in (see capabilities.py): package the changes not yet in a
    package (a backlog past ``MAX_ENTRIES_PER_DOCUMENT`` changes takes several); the Change Dump
    itself is rendered from the packages on request."""
    while package_changes(resource_set) is not None:
        pass
    return []


class _Doc:
    """The bits of a package :func:`dump_entry` needs, from a ChangeDumpPackage row."""

    def __init__(self, name, size, sha256):
        self.name, self.size, self.sha256 = name, size, sha256


def part_name(number):
    return f"changedump/dump-{number}.xml"


def package_entry(resource_set, package):
    """The ``<url>`` of a package in the Change Dump (and its archive)."""
    return dump_entry(
        resource_set,
        _Doc(package_name(package.number), package.size, package.sha256),
        _Doc(manifest_name(package.number), package.manifest_size, package.manifest_sha256),
        {"from": w3c_datetime(package.from_time), "until": w3c_datetime(package.until)},
    )


def _dump_document(resource_set, packages, from_time, *, extended, index):
    writer = DocumentWriter()
    for package in packages:
        writer.add(package_entry(resource_set, package))
    md, links = heads.head(resource_set, capabilities.CHANGEDUMP, from_=from_time,
                           until=None if extended else packages[-1].until, indexed_by=capabilities.CHANGEDUMP if index else None)
    out = io.BytesIO()
    writer.finish(out, md=md, links=links)
    return out.getvalue()


def archived_dump(resource_set, package):
    """``(bytes, last_modified)`` of the Change Dump of one package that has left
    ``changedump.xml`` for the Change Dump Archive: a ``<urlset>`` with the package's ``from``
    and ``until``, listing it with the entry ``changedump.xml`` gave it."""
    return _dump_document(resource_set, [package], package.from_time, extended=False, index=False), package.written


def current_from(resource_set):
    """The ``from`` of ``changedump.xml`` (that of its oldest package, withdrawn ones too);
    ``None`` while it has none (none cut yet, or all gone to the archive): it answers 404."""
    oldest = resource_set.changedump_packages.filter(archived__isnull=True).order_by("number").first()
    return None if oldest is None else oldest.from_time


def render(resource_set, name=NAME):
    """``(bytes, last_modified)`` of the Change Dump (``changedump.xml``: the dump, or a Change
    Dump Index past ``MAX_ENTRIES_PER_DOCUMENT`` packages) or of one of its parts; ``None`` if
    there is no such document (before the first package, say). A withdrawn package is left out
    until it is packed again (the dump is empty while its only packages are)."""
    every = list(resource_set.changedump_packages.filter(archived__isnull=True).order_by("number"))
    if not every:
        return None
    packages = [package for package in every if package.withdrawn is None]
    limit = app_settings.MAX_ENTRIES_PER_DOCUMENT
    parts = [packages[start : start + limit] for start in range(0, len(packages), limit)] or [[]]
    last_modified = _last_modified(resource_set)
    from_time = every[0].from_time
    if len(parts) == 1:
        if name != NAME:
            return None
        return _dump_document(resource_set, packages, from_time, extended=True, index=False), last_modified
    if name == NAME:
        index = DocumentWriter(root="sitemapindex")
        for number, chunk in enumerate(parts, start=1):
            md = {"from": w3c_datetime(chunk[0].from_time)}
            if number < len(parts):
                md["until"] = w3c_datetime(chunk[-1].until)
            index.add(url_element(uris.document_uri(resource_set, part_name(number)), md=md, tag="sitemap"))
        out = io.BytesIO()
        md, links = heads.head(resource_set, capabilities.CHANGEDUMP, from_=from_time)
        index.finish(out, md=md, links=links)
        return out.getvalue(), last_modified
    for number, chunk in enumerate(parts, start=1):
        if name == part_name(number):
            return (
                _dump_document(resource_set, chunk, chunk[0].from_time, extended=number == len(parts), index=True), last_modified
            )
    return None


def serve(resource_set, name):
    """The :class:`~django_resourcesync.served.Served` for the Change Dump (``changedump.xml``
    and its parts, rendered from the package rows), a package or a manifest copy; ``GONE`` for a
    withdrawn package, ``None`` for no such document."""
    if name.endswith(".xml") and not name.endswith("-manifest.xml"):
        rendered = render(resource_set, name)
        return None if rendered is None else Served.rendered(*rendered)
    for package in resource_set.changedump_packages.all():
        if name in (package_name(package.number), manifest_name(package.number)) and package.withdrawn is not None:
            return GONE
        if name == package_name(package.number):
            return Served(
                package.sha256, package.written, storage_name=package.storage_name, size=package.size,
                media_type="application/zip"
            )
        if name == manifest_name(package.number):
            return Served(
                package.manifest_sha256, package.written, storage_name=package.manifest_storage_name, size=package.manifest_size
            )
    return None




# -- withdrawal (see builders.withdrawal) ---------------------------------------------------


def withdraw_packages_holding(resource_set, keys, now=None):
    """Withdraw the set's packages that hold the bytes of a change of one of ``keys``."""
    # Archived packages by the keys they were archived with (their events may be gone).
    leaving = {str(key) for key in keys}
    archived = ChangeDumpPackage.objects.filter(resource_set=resource_set, withdrawn__isnull=True, archived__isnull=False)
    hit_archived = [pk for pk, held in archived.values_list("pk", "keys") if leaving.intersection(held or ())]
    if hit_archived:
        withdraw_packages(ChangeDumpPackage.objects.filter(pk__in=hit_archived), now)
    packages = list(
        ChangeDumpPackage.objects.filter(resource_set=resource_set, withdrawn__isnull=True, archived__isnull=True)
        .values_list("pk", "first_event", "last_event")
    )
    if not packages:
        return
    events = bulk.filter_in(
        ChangeEvent.objects.filter(resource_set=resource_set).exclude(change=ChangeEvent.Change.DELETED), "object_pk", keys
    )
    event_ids = sorted(events.values_list("id", flat=True))
    hit = [pk for pk, first, last in packages if _any_between(event_ids, first, last)]
    if hit:
        withdraw_packages(ChangeDumpPackage.objects.filter(pk__in=hit), now)


def withdraw_packages(packages, now=None):
    """Withdraw Change Dump packages: their files leave storage once this commits."""
    names = []
    for package in packages:
        names += [package.storage_name, package.manifest_storage_name]
        logger.info("%s held the bytes of a resource that left the set: withdrawn", package)
    packages.update(withdrawn=now or timezone.now())
    transaction.on_commit(lambda: storage.delete_quietly(names))


def _any_between(ordered, first, last):
    index = bisect.bisect_left(ordered, first)
    return index < len(ordered) and ordered[index] <= last


def describe(resource_set):
    """What the admin says of it."""
    packages = resource_set.changedump_packages.filter(archived__isnull=True).order_by("-number")
    if not packages:
        return None
    count = ngettext("%(n)d package", "%(n)d packages", len(packages)) % {"n": len(packages)}
    return f"{count}, the latest until {packages[0].until:%Y-%m-%d %H:%M:%S}Z"


def notice(resource_set):
    """What a framework notification tells of it (see push.announce): it changes with each
    package cut, withdrawn or packed again."""
    last_modified = _last_modified(resource_set)
    if last_modified is None:
        return None
    count = resource_set.changedump_packages.filter(archived__isnull=True).count()
    listed = resource_set.changedump_packages.filter(withdrawn__isnull=True, archived__isnull=True).count()
    parts = -(-listed // app_settings.MAX_ENTRIES_PER_DOCUMENT)
    main = uris.document_uri(resource_set, NAME)
    # Past one document, the dump is an index: the part that grows (the last) is told of.
    loc, index = (uris.document_uri(resource_set, part_name(parts)), main) if parts > 1 else (main, None)
    return {"marker": [count, w3c_datetime(last_modified)], "loc": loc, "index": index, "datetime": w3c_datetime(last_modified)}
