"""A build in progress: the files it writes, and its publication in one switch-over."""

import hashlib
import logging
import posixpath
import traceback
import uuid

from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone
from django.utils.translation import ngettext

from .. import capabilities, storage, tracking, uris
from ..exceptions import BuildAbandoned
from ..models import Build, Document, LeftOut, ResourceSet
from ..xml.writer import w3c_datetime, without_entries
from .retention import stale_builds

logger = logging.getLogger(__name__)


class BuildContext:
    """A running build: collects the files written, publishes them or cleans them up.

    ``BuildContext(build=build)`` takes up a build started elsewhere (a part rendered by a task).
    """

    def __init__(self, resource_set=None, capability=None, at=None, *, build=None):
        if build is None:
            build = Build.objects.create(resource_set=resource_set, capability=capability, at=at)
        self.build = build
        self.resource_set = build.resource_set
        self.capability = build.capability
        self.documents = []

    def take_snapshot_time(self):
        """Set the build's ``at`` to now, taken under the set's lock: a change being written
        waits until it has committed, and every change written later has a later datetime. So
        the documents plus the changes after ``at`` are the current state: a change processed
        later is dated after it (the change log reads it in the same lock)."""
        with tracking.locked(self.resource_set):
            self.build.at = timezone.now()
            self.build.save(update_fields=["at"])

    def bring_up_to_date(self, *, refresh=True, progress=None, batch_size=None):
        """Bring the set's record in line with the site (unless ``refresh`` is false: the caller
        did), then take the snapshot time."""
        if refresh:
            tracking.refresh(self.resource_set, progress=progress, batch_size=batch_size)
        self.take_snapshot_time()

    #: Write under names no file had before (a document written again into a published build:
    #: the old file is deleted once the transaction commits, and a storage that overwrites
    #: files must not let that deletion take the new one).
    fresh_names = False

    def storage_name(self, name):
        name = posixpath.basename(name)
        if self.fresh_names:
            stem, dot, extension = name.rpartition(".")
            name = f"{stem}-{uuid.uuid4().hex[:12]}{dot}{extension}"
        return storage.storage_name(self.resource_set.slug, self.build.pk, name)

    def write(self, name, writer, *, md, links=(), at=None, completed=None, keep=None, replace=False):
        """Finish a :class:`~django_resourcesync.xml.writer.DocumentWriter` into storage as
        ``name``. ``keep``, a binary file, also receives the document, byte for byte (a manifest,
        which goes into its package too: section 13.1 has the Source ensure that both match, so
        a manifest names no stylesheet, which a browser could not fetch from an unpacked ZIP
        anyway; a person opening the published copy reads its page, see :mod:`..pages`).
        ``replace`` first deletes a file left under that name (by an attempt at a part that was
        killed before it recorded it), so the name stays the same."""
        with storage.scratch_file() as tmp:
            writer.finish(tmp, md=md, links=links, stylesheet=keep is None, copy=keep)
            if replace:
                storage.get_storage().delete(self.storage_name(name))
            stored = storage.save_or_remove(self.storage_name(name), tmp)
        return self.record(name, stored, entries=writer.count, size=writer.size, sha256=writer.sha256,
                           is_index=writer.root == "sitemapindex", at=at, completed=completed)

    def write_without(self, name, source, locs, *, into=None, at=None, completed=None):
        """Write into storage as ``name`` the document the app wrote that ``source`` (an open
        binary file) reads, byte for byte but for its entries whose ``<loc>`` is one of ``locs``
        (see :func:`~..xml.writer.without_entries`); ``into``, a binary file, receives the same
        bytes. Returns ``(entries cut out, the new document's record)``: ``([], None)``, and
        nothing written, if none was cut."""
        with storage.scratch_file() as tmp:
            out = _Digesting(tmp, into)
            kept, cut = without_entries(iter(lambda: source.read(CHUNK), b""), locs, out)
            if not cut:
                return cut, None
            stored = storage.save_or_remove(self.storage_name(name), tmp)
        return cut, self.record(name, stored, entries=kept, size=out.size, sha256=out.sha256.hexdigest(), at=at,
                                completed=completed)

    def record(
        self, name, stored, *, entries, size, sha256, media_type="application/xml", is_index=False, at=None, completed=None
    ):
        """Note a file written into storage as part of this build."""
        document = Document(
            build=self.build,
            resource_set=self.resource_set,
            name=name,
            storage_name=stored,
            media_type=media_type,
            is_index=is_index,
            entries=entries,
            size=size,
            sha256=sha256,
            at=at,
            completed=completed,
        )
        self.documents.append(document)
        return document

    def discard_record(self):
        """Forget the build row, keeping the files (for packages that are not replaceable builds)."""
        self.build.delete()

    def discard(self):
        """Remove the files written, those recorded by parts too."""
        storage.delete_quietly([document.storage_name for document in self.documents])
        self.documents = []
        # Their files leave storage once this commits (see signals.py).
        Document.objects.filter(build=self.build).delete()

    def save_documents(self):
        """Record the files written so far in the database (a part's, while the build runs)."""
        Document.objects.bulk_create(self.documents)
        self.documents = []

    def publish(self, *, entries, completed, report=None, prepare=None):
        """Switch readers over to this build, in one transaction; prune old builds after it.
        ``prepare(context, report)``, the capability's last word, runs first in that
        transaction, under the set's lock, and returns how many of the ``entries`` it cut out
        (resources that left the set meanwhile: see resourcelist.before_publish)."""
        build = self.build
        report = dict(report or {})
        with transaction.atomic():
            # The set's row first, as change tracking takes it: a resource that leaves the set
            # is either already gone when this runs, or leaves the published build.
            ResourceSet.objects.lock(self.resource_set.pk)
            if Build.objects.select_for_update().get(pk=build.pk).status != Build.Status.RUNNING:
                raise BuildAbandoned(f"{build} is no longer running; not published")
            self.save_documents()
            if prepare is not None:
                entries -= prepare(self, report) or 0
            if capabilities.get(self.capability).lists_resources:
                report.update(left_out_report(self.resource_set))
            previous = Build.objects.select_for_update().filter(
                resource_set=self.resource_set, capability=self.capability, status=Build.Status.PUBLISHED
            )
            previous.update(status=Build.Status.RETIRED)
            build.status = Build.Status.PUBLISHED
            build.entries = entries
            build.documents = Document.objects.filter(build=build, withdrawn__isnull=True).count()
            build.completed = completed
            build.report = report
            build.finished = timezone.now()
            build.save()
            # Past KEEP_BUILDS, or past the archive's retention where the set offers one. Their
            # files leave storage once this commits (see signals.py).
            Build.objects.filter(pk__in=stale_builds(self.resource_set, self.capability)).delete()
        return build

    def fail(self, exc):
        """Mark the build failed and remove its files. A build that is no longer running (a
        duplicate of a part failing after another copy finished the build) is left as it is."""
        with transaction.atomic():
            if not Build.objects.select_for_update().filter(pk=self.build.pk, status=Build.Status.RUNNING).exists():
                logger.warning("Build %s is no longer running; not marked failed: %s", self.build, exc)
                return
            self.discard()
            self.build.status = Build.Status.FAILED
            self.build.error = "".join(traceback.format_exception(exc))[-10_000:]
            self.build.finished = timezone.now()
            self.build.save(update_fields=["status", "error", "finished"])
        logger.error("Build %s failed: %s", self.build, exc)


def cut_document(document, locs):
    """Write ``document`` (a Resource List's) again without its entries whose ``<loc>`` is one
    of ``locs``; returns the entries cut out (none: it is left as it is). It keeps its name (its
    URI) and its ``at``: it still tells of the set at that time, but for resources that have
    left it since, whose deletions the Change List gives. The new file has a storage name of
    its own; the old one leaves storage once the transaction commits."""
    context = BuildContext(build=document.build)
    context.fresh_names = True
    with storage.get_storage().open(document.storage_name, "rb") as stored:
        cut, new = context.write_without(document.name, stored, locs)
    if not cut:
        return cut
    old = document.storage_name
    fields = {"storage_name": new.storage_name, "entries": new.entries, "size": new.size, "sha256": new.sha256,
              "written": timezone.now()}
    Document.objects.filter(pk=document.pk).update(**fields)
    transaction.on_commit(lambda: storage.delete_quietly([old]))
    return cut


CHUNK = 1024 * 1024


class _Digesting:
    """A binary file that passes what is written on to ``raw`` (and ``copy``, if any),
    counting and hashing it."""

    def __init__(self, raw, copy=None):
        self.raw, self.copy, self.size, self.sha256 = raw, copy, 0, hashlib.sha256()

    def write(self, data):
        self.raw.write(data)
        if self.copy is not None:
            self.copy.write(data)
        self.size += len(data)
        self.sha256.update(data)

#: How many left-out objects a build's report names (the admin lists them all).
LEFT_OUT_EXAMPLES = 20


def left_out_report(resource_set):
    """What a build reports of the set's objects that could not be published: ``{}`` if none."""
    left_out = LeftOut.objects.filter(resource_set=resource_set)
    count = left_out.count()
    if not count:
        return {}
    examples = [
        {"object": key, "reason": reason}
        for key, reason in left_out.order_by("object_pk").values_list("object_pk", "reason")[:LEFT_OUT_EXAMPLES]
    ]
    return {"left_out": count, "left_out_objects": examples}


def describe_build(resource_set, capability):
    """A line for the admin on the set's published build of ``capability``; ``None`` if none."""
    build = current_build(resource_set, capability)
    if build is None:
        return None
    entries = ngettext("%(n)d entry", "%(n)d entries", build.entries) % {"n": build.entries}
    files = ngettext("in %(n)d file", "in %(n)d files", build.documents) % {"n": build.documents}
    return f"{entries} {files}, at {build.at:%Y-%m-%d %H:%M:%S}Z"


def published_at(resource_set, capability):
    """When the set's published build of ``capability`` finished; ``None`` if there is none."""
    return capabilities.published_value(resource_set, capability, lambda: published_at_expression(capability))


def published_at_expression(capability):
    """:func:`published_at` as an expression of a set's row (see capabilities.with_published)."""
    newest = Build.objects.filter(resource_set=OuterRef("pk"), capability=capability, status=Build.Status.PUBLISHED)
    return Subquery(newest.order_by("-pk").values("finished")[:1])


def current_build(resource_set, capability):
    return (
        Build.objects.filter(resource_set=resource_set, capability=capability, status=Build.Status.PUBLISHED)
        .order_by("-pk")
        .first()
    )


def build_notice(resource_set, capability):
    """What a framework notification tells of the set's published build of ``capability``
    (see :mod:`django_resourcesync.push.announce`): ``None`` if there is none. A build past one
    document is told of by its first document, with a link to the index it is under."""
    build = current_build(resource_set, capability)
    if build is None:
        return None
    main = capabilities.get(capability).document
    notice = {"marker": build.pk, "loc": uris.document_uri(resource_set, main), "index": None,
              "datetime": w3c_datetime(build.finished or build.at)}
    if Document.objects.filter(build=build, name=main, is_index=True).exists():
        first = (
            Document.objects.filter(build=build, is_index=False, media_type="application/xml", withdrawn__isnull=True)
            .exclude(name__endswith="-manifest.xml").order_by("name").values_list("name", flat=True).first()
        )
        if first is not None:
            notice.update(loc=uris.document_uri(resource_set, first), index=notice["loc"])
    return notice
