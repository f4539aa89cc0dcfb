"""Resource Dump and its packages (spec sections 11.1 and 11.2).

The dump packs what the set's Resource List lists, in the same order, into ZIP packages of at
most ``DUMP_PACKAGE_BYTES`` bytes of bitstreams and ``MAX_ENTRIES_PER_DOCUMENT`` bitstreams. Each
package carries ``manifest.xml`` at its top level, and an identical copy is published beside it
for the Resource Dump's ``rs:ln rel="contents"``. Every bitstream is hashed again as it is
packed: a file that changed since it was hashed is packed with its new hashes in the manifest,
counted in the build's report and handed to change tracking, so lists and log catch up; a file
that cannot be read any more is left out of its package and manifest, and reported the same way.

URIs: ``resourcedump.xml`` (a Resource Dump, or a Resource Dump Index past the entry limit) and
``resourcedump/<build>/part-NNNNN.zip`` with ``…-manifest.xml``.
"""

import logging
import tempfile

from django.utils import timezone

from .. import capabilities, tracking, uris
from ..conf import app_settings
from ..models import Resource
from ..packaging import ZIP_MEDIA_TYPE, MemberNames, PackageWriter
from ..sources import UnpublishableResource
from ..xml.writer import DocumentWriter, hash_value, url_element, w3c_datetime
from . import BuildContext

logger = logging.getLogger(__name__)

NAME = "resourcedump.xml"
FETCH = 200  # resources whose objects are fetched from the site in one query


def package_name(build, number):
    return f"resourcedump/{build.pk}/part-{number:05d}.zip"


def manifest_name(build, number):
    return f"resourcedump/{build.pk}/part-{number:05d}-manifest.xml"


class Packer:
    """Fills packages one after the other for a build; shared by Resource and Change Dumps."""

    def __init__(self, context, source, *, capability, name_of, manifest_of, progress=None, split=True):
        self.context, self.source = context, source
        self.split = split
        self.capability = capability
        self.name_of, self.manifest_of = name_of, manifest_of
        self.progress = progress
        self.packages = []  # (package Document, manifest Document, md dict) per finished package
        self.report = {"changed_since_hashed": 0, "unreadable": 0, "gone": 0}
        self.package = None
        self.started = None
        self.bytes_done = 0

    def _start(self):
        number = len(self.packages) + 1
        self.package = PackageWriter(self.context.storage_name(self.name_of(number)))
        self.manifest = DocumentWriter()
        self.names = MemberNames()
        self.started = timezone.now()

    def fits(self, size_hint):
        if self.package is None or not self.split:
            return True
        full = self.package.members >= app_settings.MAX_ENTRIES_PER_DOCUMENT
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
        if not self.fits(row.length):
            self.finish()
        if self.package is None:
            self._start()
        member = self.names.name(row.uri)
        chunks, _content_type = found
        size = self._current_size(obj, row.length)
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
        return {"hash": hash_value(md5, sha256), "length": length, "type": row.media_type or None, "path": "/" + member}

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
        """Have change tracking read ``obj`` again, whatever its fingerprint says."""
        Resource.objects.filter(object_pk=str(obj.pk), resource_set__source=self.source.name).update(fingerprint="")
        tracking.record(self.source.name, [obj.pk])

    def add_entry(self, entry):
        if self.package is None:
            self._start()
        self.manifest.add(entry)

    def finish(self, md=None):
        """Close the current package (if any) with its manifest; ``md`` adds to the manifest's."""
        if self.package is None:
            return
        number = len(self.packages) + 1
        completed = timezone.now()
        manifest_md = {"capability": f"{self.capability}-manifest", **(md or self._snapshot(completed))}
        links = [{"rel": "up", "href": uris.capability_list_uri(self.context.resource_set)}]
        with tempfile.TemporaryFile() as manifest:
            manifest_doc = self.context.write(self.manifest_of(number), self.manifest, md=manifest_md, links=links, keep=manifest)
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


def build_resourcedump(resource_set, *, refresh=True, pending=True, progress=None, batch_size=None):
    """Pack the set's resources into ZIP packages and publish its Resource Dump."""
    context = BuildContext(resource_set, capabilities.RESOURCEDUMP, at=timezone.now())
    source = resource_set.get_source()
    packer = Packer(context, source, capability=capabilities.RESOURCEDUMP,
                    name_of=lambda n: package_name(context.build, n), manifest_of=lambda n: manifest_name(context.build, n),
                    progress=progress)
    try:
        if refresh and pending:
            tracking.process_pending([resource_set.source], batch_size=batch_size)
        if refresh:
            tracking.reconcile(resource_set, progress=progress, batch_size=batch_size)
        context.take_snapshot_time()
        rows = Resource.objects.filter(resource_set=resource_set).order_by("uri")
        total_bytes = sum(length or 0 for length in rows.values_list("length", flat=True))
        count = 0
        batch = []
        for row in rows.iterator(chunk_size=FETCH):
            batch.append(row)
            if len(batch) == FETCH:
                count += _pack_batch(packer, source, resource_set, batch)
                batch = []
                if progress:
                    progress("resourcedump", packer.bytes_done, total_bytes, unit="B", note=f"{count} files")
        count += _pack_batch(packer, source, resource_set, batch)
        packer.finish()
        if progress:
            progress("resourcedump", packer.bytes_done, total_bytes, unit="B", note=f"{count} files")
        completed = timezone.now()
        _write_dump(context, packer.packages, completed)
    except BaseException as exc:
        packer.abort()
        context.fail(exc)
        raise
    return context.publish(entries=count, completed=completed, report=packer.report)


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
    up = {"rel": "up", "href": uris.capability_list_uri(resource_set)}
    md = {"capability": capabilities.RESOURCEDUMP, "at": w3c_datetime(build.at), "completed": w3c_datetime(completed)}
    limit = app_settings.MAX_ENTRIES_PER_DOCUMENT
    if len(packages) <= limit:
        writer = DocumentWriter()
        for package_doc, manifest_doc, package_md in packages:
            writer.add(dump_entry(resource_set, package_doc, manifest_doc, package_md))
        context.write(NAME, writer, md=md, links=[up], at=build.at, completed=completed)
        return
    index = DocumentWriter(root="sitemapindex")
    index_link = {"rel": "index", "href": uris.document_uri(resource_set, NAME)}
    for start in range(0, len(packages), limit):
        name = f"resourcedump/{build.pk}/dump-{start // limit + 1:05d}.xml"
        writer = DocumentWriter()
        for package_doc, manifest_doc, package_md in packages[start : start + limit]:
            writer.add(dump_entry(resource_set, package_doc, manifest_doc, package_md))
        context.write(name, writer, md=md, links=[up, index_link], at=build.at, completed=completed)
        index.add(url_element(uris.document_uri(resource_set, name), md={"at": md["at"], "completed": md["completed"]}, tag="sitemap"))
    context.write(NAME, index, md=md, links=[up], at=build.at, completed=completed)
