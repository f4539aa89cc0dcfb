"""Change Dump and its packages (spec sections 13.1 and 13.2).

Each package holds the bitstreams of the changes recorded in an interval, in log order: the
changes not yet in any package when it is cut (by ``resourcesync_rebuild`` or the beat task
``resourcesync.package_changes``). Its manifest lists every change oldest first, with ``change``
and ``datetime``, and ``path`` on all but deletions; a resource changed twice is in the package
twice. A change's bytes are those the resource has when the package is cut (a Source keeps no
older bytes), hashed as they are packed; a resource that has since left the set is left out of the
package, and its later deletion is in the log. The Change Dump lists the packages oldest first
with ``from`` and ``until`` each, and has no ``until`` itself: it is extended as packages follow.

URIs: ``changedump.xml``, ``changedump/<number>.zip`` and ``changedump/<number>-manifest.xml``.
"""

import hashlib
import io

from django.utils import timezone

from .. import capabilities, tracking, uris
from ..conf import app_settings
from ..models import ChangeDumpPackage, ChangeEvent, ChangeList, Resource
from ..xml.writer import DocumentWriter, url_element, w3c_datetime
from . import BuildContext
from .resourcedump import Packer, dump_entry

NAME = "changedump.xml"


def package_name(number):
    return f"changedump/{number}.zip"


def manifest_name(number):
    return f"changedump/{number}-manifest.xml"


def package_changes(resource_set, *, progress=None):
    """Cut a package of the changes recorded since the last one; ``None`` if there are none."""
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
        until = max(timezone.now(), events.order_by("-id").first().datetime)
        from_time = previous.until if previous is not None else start.from_time
    events = list(events.filter(id__lte=last).order_by("id")[: app_settings.MAX_ENTRIES_PER_DOCUMENT])
    if len(events) == app_settings.MAX_ENTRIES_PER_DOCUMENT:
        last, until = events[-1].id, events[-1].datetime
    number = previous.number + 1 if previous is not None else 1
    source = resource_set.get_source()
    # The packages are not a replaceable build; the build context only lends its file handling.
    context = BuildContext(resource_set, capabilities.CHANGEDUMP, at=from_time)
    packer = Packer(context, source, capability=capabilities.CHANGEDUMP, name_of=lambda n: package_name(number),
                    manifest_of=lambda n: manifest_name(number), progress=progress, split=False)
    try:
        keys = {event.object_pk for event in events if event.change != "deleted"}
        objects = {str(obj.pk): obj for obj in source.queryset(resource_set.lookups).filter(pk__in=list(keys))}
        # A change's bytes are the resource's current ones: check them against the current
        # record, not against the event (an earlier change of the resource had other bytes).
        records = {row.object_pk: row for row in Resource.objects.filter(resource_set=resource_set, object_pk__in=list(keys))}
        for event in events:
            md = {"change": event.change, "datetime": w3c_datetime(event.datetime)}
            if event.change != "deleted":
                record = records.get(event.object_pk)
                packed = packer.pack(event, objects.get(event.object_pk) if record else None, record)
                if packed is None:
                    continue
                md.update(packed)
            packer.add_entry(url_element(event.uri, lastmod=event.lastmod if event.change != "deleted" else None, md=md))
        packer.finish(md={"from": w3c_datetime(from_time), "until": w3c_datetime(until)})
    except BaseException as exc:
        packer.abort()
        context.fail(exc)
        raise
    context.discard_record()
    if not packer.packages:
        return None
    package_doc, manifest_doc, package_md = packer.packages[0]
    return ChangeDumpPackage.objects.create(
        resource_set=resource_set, number=number, from_time=from_time, until=until,
        first_event=events[0].id, last_event=last, entries=package_doc.entries,
        storage_name=package_doc.storage_name, size=package_doc.size, sha256=package_doc.sha256,
        manifest_storage_name=manifest_doc.storage_name, manifest_size=manifest_doc.size, manifest_sha256=manifest_doc.sha256,
    )


class _Doc:
    """The bits of a package :func:`dump_entry` needs, from a ChangeDumpPackage row."""

    def __init__(self, name, size, sha256):
        self.name, self.size, self.sha256 = name, size, sha256


def part_name(number):
    return f"changedump/dump-{number}.xml"


def _dump_document(resource_set, packages, *, extended, index):
    writer = DocumentWriter()
    for package in packages:
        writer.add(
            dump_entry(
                resource_set,
                _Doc(package_name(package.number), package.size, package.sha256),
                _Doc(manifest_name(package.number), package.manifest_size, package.manifest_sha256),
                {"from": w3c_datetime(package.from_time), "until": w3c_datetime(package.until)},
            )
        )
    md = {"capability": capabilities.CHANGEDUMP, "from": w3c_datetime(packages[0].from_time)}
    if not extended:
        md["until"] = w3c_datetime(packages[-1].until)
    links = [{"rel": "up", "href": uris.capability_list_uri(resource_set)}]
    if index:
        links.append({"rel": "index", "href": uris.document_uri(resource_set, NAME)})
    out = io.BytesIO()
    writer.finish(out, md=md, links=links)
    return out.getvalue()


def render(resource_set, name=NAME):
    """``(bytes, last_modified)`` of the Change Dump (``changedump.xml``: the dump, or a Change
    Dump Index past ``MAX_ENTRIES_PER_DOCUMENT`` packages) or of one of its parts; ``None`` if
    there is no such document (before the first package, say)."""
    packages = list(resource_set.changedump_packages.order_by("number"))
    if not packages:
        return None
    limit = app_settings.MAX_ENTRIES_PER_DOCUMENT
    parts = [packages[start : start + limit] for start in range(0, len(packages), limit)]
    last_modified = packages[-1].written
    if len(parts) == 1:
        return (_dump_document(resource_set, packages, extended=True, index=False), last_modified) if name == NAME else None
    if name == NAME:
        index = DocumentWriter(root="sitemapindex")
        for number, chunk in enumerate(parts, start=1):
            md = {"from": w3c_datetime(chunk[0].from_time)}
            if number < len(parts):
                md["until"] = w3c_datetime(chunk[-1].until)
            index.add(url_element(uris.document_uri(resource_set, part_name(number)), md=md, tag="sitemap"))
        out = io.BytesIO()
        index.finish(
            out,
            md={"capability": capabilities.CHANGEDUMP, "from": w3c_datetime(packages[0].from_time)},
            links=[{"rel": "up", "href": uris.capability_list_uri(resource_set)}],
        )
        return out.getvalue(), last_modified
    for number, chunk in enumerate(parts, start=1):
        if name == part_name(number):
            return _dump_document(resource_set, chunk, extended=number == len(parts), index=True), last_modified
    return None


def find(resource_set, name):
    """``(storage_name, size, sha256, media_type, written)`` of a package or manifest copy."""
    for package in resource_set.changedump_packages.all():
        if name == package_name(package.number):
            return package.storage_name, package.size, package.sha256, "application/zip", package.written
        if name == manifest_name(package.number):
            return package.manifest_storage_name, package.manifest_size, package.manifest_sha256, "application/xml", package.written
    return None


def etag(body):
    return hashlib.sha256(body).hexdigest()
