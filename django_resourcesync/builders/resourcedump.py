"""Resource Dump and its packages (spec sections 11.1 and 11.2).

The dump packs what the set's Resource List lists, in the same order (by key), into ZIP packages
of at most ``DUMP_PACKAGE_BYTES`` bytes of bitstreams and ``MAX_ENTRIES_PER_DOCUMENT``
bitstreams. Each package carries ``manifest.xml`` at its top level, and an identical copy is
published beside it for the Resource Dump's ``rs:ln rel="contents"``. Every bitstream is hashed
again as it is packed: a file that changed since it was hashed is packed with its new hashes in
the manifest, counted in the build's report and handed to change tracking, so lists and log catch
up; a file that cannot be read any more is left out of its package and manifest, and reported the
same way.

The packages are planned before any is written, as parts (see
:mod:`~django_resourcesync.builders.parts`): ranges of the set's rows by key, each as many rows
as one package takes by their recorded lengths. Run by a worker, a dump of more than one part is
packed by Celery tasks, a part each, at the same time. A part's packer closes a package by the
sizes it finds, too: a record that is wrong (a file that grew) makes the part two packages
(``part-NNNNN.zip`` and ``part-NNNNN-2.zip``), never one too large.

URIs: ``resourcedump.xml`` (a Resource Dump, or a Resource Dump Index past the entry limit) and
``resourcedump/<build>/part-NNNNN.zip`` with ``…-manifest.xml``.
"""

import logging
import re
import tempfile
import zipfile
from xml.sax.saxutils import unescape

from django.db import transaction
from django.db.models import F, Sum
from django.utils import timezone

from .. import capabilities, heads, storage, tracking, uris
from ..conf import app_settings
from ..exceptions import UnpublishableResource
from ..models import Build, Document, Resource, Withdrawal
from ..packaging import CHUNK, MANIFEST, ZIP_MEDIA_TYPE, MemberNames, PackageWriter
from ..xml.writer import DocumentWriter, hash_value, url_element, w3c_datetime
from . import parts
from .context import BuildContext, build_notice, describe_build, published_at, published_at_expression

logger = logging.getLogger(__name__)

NAME = "resourcedump.xml"
FETCH = 200  # resources whose objects are fetched from the site in one query


def _stem(build, number, package):
    return f"resourcedump/{build.pk}/part-{number:05d}" + (f"-{package}" if package > 1 else "")


def revised(name):
    """The name of a package (or manifest) packed again: ``-rN`` after its stem, N from 2."""
    match = _PART_FILE.match(name)
    revision = int(match["revision"] or 1) + 1
    return name[: match.start("kind")].removesuffix(f"-r{match['revision']}") + f"-r{revision}" + match["kind"]


def manifest_of(package):
    """The manifest of the package ``package`` (a name)."""
    return package.removesuffix(".zip") + "-manifest.xml"


def manifest_entry_size(row):
    """About the bytes of the manifest entry of ``row`` (a Resource or a ChangeEvent): its list
    entry, and the ``path`` attribute (at most the URI's length) and ``change``/``datetime``."""
    return len(row.entry_xml or "") + len(row.uri) + 96


def package_name(build, number, package=1):
    """Package ``package`` of part ``number`` (the first has no suffix)."""
    return f"{_stem(build, number, package)}.zip"


def manifest_name(build, number, package=1):
    return f"{_stem(build, number, package)}-manifest.xml"


_PART_FILE = re.compile(
    r"^resourcedump/[0-9]+/part-(?P<part>[0-9]+)(?:-(?P<package>[0-9]+))?(?:-r(?P<revision>[0-9]+))?"
    r"(?P<kind>\.zip|-manifest\.xml)$"
)


def part_number(name):
    """The part a package or manifest of a build belongs to, by its name; ``None`` for others."""
    match = _PART_FILE.match(name)
    return int(match["part"]) if match else None


def _package_order(name):
    match = _PART_FILE.match(name)
    return int(match["part"]), int(match["package"] or 1)


class Packer:
    """Fills packages one after the other for a build; shared by Resource and Change Dumps."""

    REPORT = ("changed_since_hashed", "unreadable", "gone")

    def __init__(self, context, source, *, capability, name_of, manifest_of, split=True, replace=False):
        self.context, self.source = context, source
        self.split = split
        self.replace = replace  # write over files of an earlier attempt at the same names
        self.capability = capability
        self.name_of, self.manifest_of = name_of, manifest_of
        self.packages = []  # (package Document, manifest Document, md dict) per finished package
        self.report = dict.fromkeys(self.REPORT, 0)
        self.package = None
        self.started = None
        self.bytes_done = 0

    def _start(self):
        number = len(self.packages) + 1
        self.package = PackageWriter(self.context.storage_name(self.name_of(number)))
        self.manifest = DocumentWriter()
        self.names = MemberNames()
        self.started = timezone.now()

    def fits(self, size_hint, entry_hint=0):
        """Whether a bitstream of ``size_hint`` bytes, whose manifest entry is about
        ``entry_hint`` bytes, goes into the open package: its bitstreams within
        ``DUMP_PACKAGE_BYTES``, its manifest within ``MAX_ENTRIES_PER_DOCUMENT`` and
        ``MAX_DOCUMENT_BYTES``."""
        if self.package is None or not self.split:
            return True
        full = not self.manifest.fits(entry_hint, app_settings.MAX_ENTRIES_PER_DOCUMENT, app_settings.MAX_DOCUMENT_BYTES)
        big = self.package.members and self.package.bitstream_bytes + (size_hint or 0) > app_settings.DUMP_PACKAGE_BYTES
        return not (full or big)

    def pack(self, row, obj, recorded=None):
        """Pack the bitstream of ``obj`` for ``row`` (a Resource or a ChangeEvent); returns the
        manifest ``rs:md`` values (hash, length, type, path), or ``None`` if it is left out.
        ``recorded`` is the Resource record to check the bytes against (default: ``row``)."""
        recorded = row if recorded is None else recorded
        if obj is None:
            self.report["gone"] += 1
            return None
        try:
            found = self.source.bitstream(obj)
        except UnpublishableResource as exc:
            logger.warning("Left out of the package: %s (%s)", row.uri, exc)
            self.report["unreadable"] += 1
            self._recheck(obj)
            return None
        if found is None:
            return None
        # The size the file has now decides, so a record that is wrong never overfills a package.
        size = self._current_size(obj, row.length)
        if not self.fits(size, manifest_entry_size(row)):
            self.finish()
        if self.package is None:
            self._start()
        member = self.names.name(row.uri)
        chunks, _content_type = found
        # Bytes with a record are checked with sha-256 and length: when both match, the
        # recorded md5 is theirs too, and only a file that changed is read again for its md5.
        checking = bool(recorded.sha256 and recorded.md5)
        # A failure half-way through a member loses the package: the build fails, and the
        # dump published before stays.
        found, length = self.package.add(
            member, chunks, size_hint=size, modified=row.lastmod, algorithms=("sha256",) if checking else ("md5", "sha256")
        )
        self.bytes_done += length
        sha256 = found["sha256"]
        md5 = found.get("md5") or (recorded.md5 if (sha256, length) == (recorded.sha256, recorded.length) else None)
        if (sha256, length) != (recorded.sha256, recorded.length):
            logger.warning("%s changed since it was hashed; packed with its new hashes", row.uri)
            self.report["changed_since_hashed"] += 1
            self._recheck(obj)
        if md5 is None:
            md5 = self._md5_of(obj, sha256)
        return {
            "hash": hash_value(md5, sha256), "length": length, "type": row.media_type or None,
            "encoding": row.encoding or None, "path": "/" + member,
        }

    def pack_bytes(self, row, chunks, length):
        """Pack ``chunks``, the bytes of the change ``row`` (a ChangeEvent) kept by the version
        store; returns the manifest ``rs:md`` values. Its hashes are the change's, checked as
        the bytes are packed."""
        if not self.fits(length, manifest_entry_size(row)):
            self.finish()
        if self.package is None:
            self._start()
        member = self.names.name(row.uri)
        found, written = self.package.add(member, chunks, size_hint=length, modified=row.lastmod, algorithms=("sha256",))
        self.bytes_done += written
        md5 = row.md5
        if (found["sha256"], written) != (row.sha256, row.length):
            logger.error("The version store gave other bytes for %s than its change's; packed with their own hash", row.uri)
            self.report["changed_since_hashed"] += 1
            md5 = None
        return {
            "hash": hash_value(md5, found["sha256"]), "length": written, "type": row.media_type or None,
            "encoding": row.encoding or None, "path": "/" + member,
        }

    def _current_size(self, obj, recorded):
        """The file's size now (it may have grown past what was recorded), else the record's."""
        f = self.source._get("file", obj)
        try:
            return f.size if f else recorded
        except (OSError, ValueError):
            return recorded

    def _md5_of(self, obj, sha256):
        """The md5 of bytes that changed since they were hashed, read again; ``None`` (the
        manifest then gives sha-256 alone) if they changed once more in between."""
        try:
            again = self.source.representation(obj)
        except UnpublishableResource:
            return None
        return again.md5 if again is not None and again.sha256 == sha256 else None

    def _recheck(self, obj):
        tracking.recheck(self.source, [obj.pk])

    def open(self):
        """Start a package unless one is open: finished, it is there even if nothing went in."""
        if self.package is None:
            self._start()

    def add_entry(self, entry):
        self.open()
        self.manifest.add(entry)

    def finish(self, md=None):
        """Close the current package (if any) with its manifest; ``md`` adds to the manifest's."""
        if self.package is None:
            return
        number = len(self.packages) + 1
        completed = timezone.now()
        manifest_md = {"capability": f"{self.capability}-manifest", **(md or self._snapshot(completed))}
        links = [heads.up(self.context.resource_set)]
        with tempfile.TemporaryFile() as manifest:
            manifest_doc = self.context.write(self.manifest_of(number), self.manifest, md=manifest_md, links=links, keep=manifest,
                                              replace=self.replace)
            try:
                sha256, size = self.package.close(manifest)
            except BaseException:
                self.package.abort()
                raise
        package_doc = self.context.record(
            self.name_of(number), self.package.name, entries=self.package.members, size=size, sha256=sha256,
            media_type=ZIP_MEDIA_TYPE, at=self.started, completed=completed,
        )
        self.packages.append((package_doc, manifest_doc, manifest_md))
        self.package = None

    def _snapshot(self, completed):
        return {"at": w3c_datetime(self.started), "completed": w3c_datetime(completed)}

    def abort(self):
        if self.package is not None:
            self.package.abort()
            self.package = None


def build_resourcedump(resource_set, *, refresh=True, progress=None, batch_size=None, parallel=False, lock=None):
    """Pack the set's resources into ZIP packages and publish its Resource Dump.

    The packages are planned as parts first. With ``parallel``, a dump of more than one part is
    packed by Celery workers, a task per part, under ``lock`` (the build lock, kept held until
    the build is over), and the build is returned running; the task that completes it publishes
    it. Otherwise the parts are packed here, one after the other. On any error the build is
    recorded as failed, its files are removed, and the dump published before stays.
    """
    if parallel and lock is None:
        raise ValueError("a parallel build needs the build lock it runs under")
    context = BuildContext(resource_set, capabilities.RESOURCEDUMP, at=timezone.now())
    batch_size = batch_size or app_settings.BATCH_SIZE
    try:
        context.bring_up_to_date(refresh=refresh, progress=progress, batch_size=batch_size)
        rows = Resource.objects.filter(resource_set=resource_set)
        planned = list(
            parts.plan(context.build, rows, app_settings.MAX_ENTRIES_PER_DOCUMENT, max_bytes=app_settings.DUMP_PACKAGE_BYTES)
        )
        total = rows.aggregate(total=Sum("length"))["total"] or 0
        return parts.run(context, planned, parallel=parallel and len(planned) > 1, lock=lock, progress=progress, total=total,
                         batch_size=batch_size)
    except BaseException as exc:
        context.fail(exc)
        raise


def render_part(context, part, *, progress=None, batch_size=None):
    """Pack the rows of ``part`` into its packages (recorded in ``context.documents``, with their
    manifests); returns ``(packages, bitstreams, report)``. Packing a part again overwrites its
    files. ``progress(bytes, files)`` hears how far it got, every ``FETCH`` rows and at the end."""
    build, resource_set = context.build, context.resource_set
    source = resource_set.get_source()
    packer = Packer(context, source, capability=capabilities.RESOURCEDUMP, replace=True,
                    name_of=lambda n: package_name(build, part.number, n),
                    manifest_of=lambda n: manifest_name(build, part.number, n))
    rows = Resource.objects.filter(resource_set=resource_set, pk__gt=part.after_pk, pk__lte=part.last_pk).order_by("pk")
    count = 0
    batch = []
    try:
        for row in rows.iterator(chunk_size=FETCH):
            batch.append(row)
            if len(batch) == FETCH:
                count += _pack_batch(packer, source, resource_set, batch)
                batch = []
                if progress:
                    progress(packer.bytes_done, count)
        count += _pack_batch(packer, source, resource_set, batch)
        packer.finish()
    except BaseException:
        packer.abort()
        raise
    if progress:
        progress(packer.bytes_done, count)
    return len(packer.packages), count, packer.report


def part_documents(build, part):
    """The packages of a done part, each with its manifest, which hold the same entries."""
    return [(package_name(build, part.number, n), manifest_name(build, part.number, n)) for n in range(1, part.documents + 1)]


def progress_details(files):
    return {"unit": "B", "note": f"{files} files"}


def finish(context, done):
    """Write the Resource Dump (or its index) over the packages of the parts ``done``; returns
    ``(entries, completed, report)``."""
    completed = timezone.now()
    _write_dump(context, _packages(context.build, done), completed)
    return sum(part.entries for part in done), completed, parts.summed_reports(done, Packer.REPORT)


def _packages(build, done):
    """``(package, manifest, md)`` of the packages of the parts ``done`` that are not withdrawn
    (those packed again in their place), in order."""
    numbers = {part.number for part in done}
    recorded = {document.name: document for document in Document.objects.filter(build=build, withdrawn__isnull=True)}
    held = sorted((name for name in recorded if name.endswith(".zip") and part_number(name) in numbers), key=_package_order)
    packages = []
    for name in held:
        package_doc = recorded[name]
        md = {"at": w3c_datetime(package_doc.at), "completed": w3c_datetime(package_doc.completed)}
        packages.append((package_doc, recorded[manifest_of(name)], md))
    return packages


def rewrite_dump(build):
    """Write the dump's document (or index and its parts) again over its packages that are not
    withdrawn; the old files leave storage once the transaction commits."""
    context = BuildContext(build=build)
    context.fresh_names = True
    dump_names = [NAME] + [
        name
        for name in Document.objects.filter(build=build).values_list("name", flat=True)
        if name.startswith(f"resourcedump/{build.pk}/dump-")
    ]
    Document.objects.filter(build=build, name__in=dump_names).delete()  # files: see signals.py
    _write_dump(context, _packages(build, build.parts.order_by("number")), build.completed or timezone.now())
    context.save_documents()
    withdrawn = Document.objects.filter(build=build, withdrawn__isnull=False, media_type=ZIP_MEDIA_TYPE).count()
    Build.objects.filter(pk=build.pk).update(
        documents=Document.objects.filter(build=build, withdrawn__isnull=True).count(),
        report={**build.report, "withdrawn_packages": withdrawn},
    )


def _pack_batch(packer, source, resource_set, rows):
    if not rows:
        return 0
    objects = {str(obj.pk): obj for obj in source.queryset(resource_set.lookups).filter(pk__in=[row.object_pk for row in rows])}
    source.prefetch(objects.values())
    packed = 0
    for row in rows:
        md = packer.pack(row, objects.get(row.object_pk))
        if md is not None:
            packer.add_entry(url_element(row.uri, lastmod=row.lastmod, md=md, links=row.links))
            packed += 1
    return packed


def dump_entry(resource_set, package_doc, manifest_doc, md):
    """The Resource (or Change) Dump's ``<url>`` for one package."""
    meta = {"type": ZIP_MEDIA_TYPE, "length": package_doc.size, "hash": hash_value("", package_doc.sha256)}
    for key in ("at", "completed", "from", "until"):
        if key in md:
            meta[key] = md[key]
    return url_element(
        uris.document_uri(resource_set, package_doc.name),
        md=meta,
        links=[{"rel": "contents", "href": uris.document_uri(resource_set, manifest_doc.name), "type": "application/xml"}],
    )


def _write_dump(context, packages, completed):
    """The Resource Dump, or a Resource Dump Index with parts past the entry limit."""
    resource_set, build = context.resource_set, context.build
    limit = app_settings.MAX_ENTRIES_PER_DOCUMENT
    md, links = heads.head(resource_set, capabilities.RESOURCEDUMP, at=build.at, completed=completed)
    if len(packages) <= limit:
        writer = DocumentWriter()
        for package_doc, manifest_doc, package_md in packages:
            writer.add(dump_entry(resource_set, package_doc, manifest_doc, package_md))
        context.write(NAME, writer, md=md, links=links, at=build.at, completed=completed)
        return
    index = DocumentWriter(root="sitemapindex")
    _, part_links = heads.head(resource_set, capabilities.RESOURCEDUMP, indexed_by=capabilities.RESOURCEDUMP)
    for start in range(0, len(packages), limit):
        name = f"resourcedump/{build.pk}/dump-{start // limit + 1:05d}.xml"
        writer = DocumentWriter()
        for package_doc, manifest_doc, package_md in packages[start : start + limit]:
            writer.add(dump_entry(resource_set, package_doc, manifest_doc, package_md))
        context.write(name, writer, md=md, links=part_links, at=build.at, completed=completed)
        index.add(
            url_element(uris.document_uri(resource_set, name), md={"at": md["at"], "completed": md["completed"]}, tag="sitemap")
        )
    context.write(NAME, index, md=md, links=links, at=build.at, completed=completed)


def update(resource_set, *, progress=None, batch_size=None, parallel=False, lock=None):
    """The capability table's way in (see capabilities.py): a new Resource Dump of the set's
    record as it is (the rebuild brought it up to date)."""
    return [build_resourcedump(resource_set, refresh=False, progress=lock.renewing(progress), batch_size=batch_size,
                               parallel=parallel, lock=lock)]


# -- withdrawal (see builders.withdrawal) ---------------------------------------------------


def withdraw_from_build(build, record_ids, locs):
    """Take the resources whose records had the keys ``record_ids`` and the URIs ``locs`` out
    of a Resource Dump build; returns how many bitstreams were taken out. A retired build that
    holds any is removed whole; a published one (or one being published) has the packages that
    held them packed again without them (:func:`repack`), so its dump still covers the set."""
    if build.status == Build.Status.RETIRED:
        if parts.holding(build, record_ids):
            logger.info("%s held the bytes of a resource that left the set: removed", build)
            build.delete()  # its files leave storage once this commits (see signals.py)
        return 0
    return repack(build, record_ids, locs)


def repack(build, record_ids, locs):
    """Pack again, from the packages themselves, those of ``build`` whose parts take in any of
    ``record_ids``, leaving out the bitstreams of ``locs``; returns how many were left out.

    Each new package is the old one's members but those, copied as they are (the same names,
    dates and bytes), with its manifest cut the same way (``BuildContext.write_without``), under
    a name of its own (``part-NNNNN-rN.zip``): the old package and its manifest answer 410 Gone
    from the commit and leave storage. A package left with no bitstream is not replaced. The
    packages keep their ``at``: their bytes are still those of that time, and what left the set
    since is in the Change List. The dump's document is written again over them."""
    hit = parts.holding(build, record_ids)
    documents = {document.name: document for document in Document.objects.filter(build=build, withdrawn__isnull=True)}
    held = [document for name, document in documents.items() if name.endswith(".zip") and part_number(name) in hit]
    if not held:
        return 0
    context = BuildContext(build=build)
    context.fresh_names = True
    replaced, taken_out, written = [], 0, None
    try:
        for package in held:
            manifest = documents[manifest_of(package.name)]
            cut = _repack(context, package, manifest, locs)
            if cut:
                replaced += [package.pk, manifest.pk]
                taken_out += cut
        if not replaced:
            return 0
        written = [document.storage_name for document in context.documents]
        _withdraw_documents(Document.objects.filter(pk__in=replaced))
        context.save_documents()
        rewrite_dump(build)
    except BaseException:
        # The transaction is rolled back by the caller; the files written for it go now.
        storage.delete_quietly([document.storage_name for document in context.documents] + (written or []))
        raise
    # (A build being published counts its entries as it does: see BuildContext.publish.)
    Build.objects.filter(pk=build.pk).exclude(status=Build.Status.RUNNING).update(entries=F("entries") - taken_out)
    logger.info("%s: %d package(s) packed again without %d bitstream(s) of resources that left the set",
                build, len(replaced) // 2, taken_out)
    return taken_out


_PATH = re.compile(rb' path="([^"]*)"')
_ATTR_ENTITIES = {"&quot;": '"', "&#9;": "\t", "&#10;": "\n", "&#13;": "\r"}


def _repack(context, package, manifest, locs):
    """Pack ``package`` again into ``context`` without the bitstreams of ``locs``; returns how
    many were left out (none: nothing is written)."""
    with storage.get_storage().open(package.storage_name, "rb") as stored, zipfile.ZipFile(stored) as old:
        with old.open(MANIFEST) as inside, tempfile.TemporaryFile() as bare:
            # The manifest in the package is the one published beside it, byte for byte.
            cut, new_manifest = context.write_without(revised(manifest.name), inside, locs, into=bare)
            if not cut:
                return 0
            leaving = {unescape(match.group(1).decode("utf-8"), _ATTR_ENTITIES)[1:]
                       for match in (_PATH.search(entry) for entry in cut) if match}
            if not new_manifest.entries:
                context.documents.remove(new_manifest)
                storage.delete_quietly([new_manifest.storage_name])
                return len(cut)  # nothing left to pack
            name = revised(package.name)
            writer = PackageWriter(context.storage_name(name))
            try:
                for info in old.infolist():
                    if info.filename == MANIFEST or info.filename in leaving:
                        continue
                    with old.open(info) as member:
                        writer.add(info.filename, iter(lambda member=member: member.read(CHUNK), b""),
                                   size_hint=info.file_size, modified=info.date_time, algorithms=())
                sha256, size = writer.close(bare)
            except BaseException:
                writer.abort()
                raise
    context.record(name, writer.name, entries=new_manifest.entries, size=size, sha256=sha256, media_type=ZIP_MEDIA_TYPE,
                   at=package.at, completed=package.completed)
    return len(cut)


def _withdraw_documents(documents, now=None):
    """Mark documents withdrawn and remove their files once the transaction commits."""
    found = list(documents.values_list("pk", "storage_name"))
    if not found:
        return 0
    Document.objects.filter(pk__in=[pk for pk, _name in found]).update(withdrawn=now or timezone.now())
    names = [name for _pk, name in found]
    transaction.on_commit(lambda: storage.delete_quietly(names))
    return len(found)


def before_publish(context, report):
    """Before a dump is published (in the transaction that publishes it, under the set's lock):
    the resources that left the set since its snapshot are taken out of its packages; returns
    how many bitstreams were."""
    leaving = Withdrawal.since(context.resource_set, context.build.at)
    if not leaving:
        return 0
    taken_out = withdraw_from_build(context.build, [record_id for _key, record_id, _uri in leaving],
                                    [uri for *_rest, uri in leaving])
    if taken_out:
        report["taken_out"] = taken_out
        report["withdrawn_packages"] = Document.objects.filter(
            build=context.build, withdrawn__isnull=False, media_type=ZIP_MEDIA_TYPE
        ).count()
    return taken_out


def published(resource_set):
    """When the set's published Resource Dump was made; ``None`` before the first."""
    return published_at(resource_set, capabilities.RESOURCEDUMP)


def published_expression():
    """:func:`published` as an expression of a set's row (see capabilities.with_published)."""
    return published_at_expression(capabilities.RESOURCEDUMP)


def describe(resource_set):
    """What the admin says of it."""
    return describe_build(resource_set, capabilities.RESOURCEDUMP)


def notice(resource_set):
    """What a framework notification tells of it (see push.announce)."""
    return build_notice(resource_set, capabilities.RESOURCEDUMP)
