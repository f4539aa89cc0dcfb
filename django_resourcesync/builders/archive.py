"""Archives (the 2013 technical paper's Resource Dump, Change List and Change Dump Archives,
and a Resource List Archive): ``resourcelist-archive``, ``resourcedump-archive``,
``changelist-archive`` and ``changedump-archive``, one document each, rendered from the rows.

- **Snapshots** (Resource Lists, Resource Dumps): a set that offers the archive keeps the builds
  past ``KEEP_BUILDS``, as ``ARCHIVE_RETENTION`` says (how many, how old; see
  :mod:`.retention`), and the archive lists them, oldest first, each with the ``at`` and
  ``completed`` of its snapshot, the current one too. Each has a URI of its own,
  ``<capability>-archive/<build>.xml``, which serves the build's main document as stored; the
  documents it links to (the parts of an index, the packages of a dump) keep their URIs.
- **Changes**: Change Lists and Change Dump packages that leave the live log (past
  ``CHANGELIST_RETENTION``) stay, out of the Change List Index and the Change Dump, as long as
  ``ARCHIVE_RETENTION`` says (see ``close_due`` in :mod:`~django_resourcesync.tracking.changelog`).
  Each archive lists what the paper says it links to, oldest first, with ``from`` and ``until``:

  - the Change List Archive, "both the current and previous Change Lists": every list the set
    keeps, each at the one URI a Destination meets it at elsewhere (``changelist/<n>.xml``, but
    ``changelist.xml`` for the list that is alone in the log, which that URI serves), so that
    merging the archive with the Change List Index gives each list, and each change, once;
  - the Change Dump Archive, "Change Dumps that cover previous time periods": for each package
    that left ``changedump.xml``, a Change Dump of its own, ``changedump-archive/<n>.xml``,
    listing it, then ``changedump.xml`` itself (the current Change Dump, with its ``from``), so
    that every package kept is in exactly one of the Change Dumps it lists.

What leaves an archive leaves storage. Past ``MAX_ENTRIES_PER_DOCUMENT`` entries an archive is
an index of parts (``<capability>-archive/part-<n>.xml``). An archive is published only while
the set offers the capability it archives. A Resource Dump build or Change Dump package that held
the bytes of a resource that is no longer public is withdrawn at once (see
:mod:`~django_resourcesync.builders.withdrawal`), and leaves the archive.
"""

import io
import re

from django.db.models import Max, OuterRef, Subquery
from django.db.models.functions import Coalesce, Greatest
from django.template.defaultfilters import filesizeformat
from django.utils.translation import ngettext

from .. import capabilities, heads, uris
from ..conf import app_settings
from ..models import Build, ChangeDumpPackage, ChangeList, Document
from ..served import GONE, Served
from ..tracking import changelog
from ..xml.writer import DocumentWriter, url_element, w3c_datetime
from . import changedump as changedumps
from . import changelist as changelists

ARCHIVED = capabilities.ARCHIVES
# At most 18 digits: below any database's largest id (a larger number would fail the query,
# and Python refuses to read a number of thousands of digits).
_MEMBER = re.compile(r"^(?P<number>[0-9]{1,18})\.xml$")
_PART = re.compile(r"^part-(?P<number>[0-9]{1,18})\.xml$")


class _CurrentDump:
    """The set's Change Dump as it is now, ``changedump.xml``: the Change Dump Archive's last entry."""

    def __init__(self, from_time, changed):
        self.from_time, self.changed = from_time, changed


def _kept(resource_set, capability):
    """What the archive of ``capability`` lists, oldest first: builds of a snapshot (the
    published one too), every Change List (those that left the index too), the packages that
    left the Change Dump (but those withdrawn) and then the Change Dump."""
    if capability == capabilities.CHANGELIST:
        return list(resource_set.changelists.order_by("number"))
    if capability == capabilities.CHANGEDUMP:
        kept = list(
            resource_set.changedump_packages.filter(withdrawn__isnull=True, archived__isnull=False).order_by("number")
        )
        current = changedumps.current_from(resource_set)
        if current is not None:
            kept.append(_CurrentDump(current, changedumps.published(resource_set)))
        return kept
    return list(
        Build.objects.filter(resource_set=resource_set, capability=capability,
                             status__in=[Build.Status.PUBLISHED, Build.Status.RETIRED]).order_by("pk")
    )


def _changed(member):
    """When an archived document was last written."""
    if isinstance(member, Build):
        return member.finished or member.at
    if isinstance(member, ChangeList):
        return member.last_datetime or member.from_time
    if isinstance(member, _CurrentDump):
        return member.changed
    return member.written


def _alone(resource_set):
    """The pk of the Change List that is alone in the set's log, if one is: ``changelist.xml``
    is that list itself (no index), and the Change List capability names it so."""
    live = list(resource_set.changelists.filter(archived__isnull=True).values_list("pk", flat=True)[:2])
    return live[0] if len(live) == 1 else None


def _entry(resource_set, archive, member, alone=None):
    if isinstance(member, Build):
        md = {"at": w3c_datetime(member.at), "completed": w3c_datetime(member.completed) if member.completed else None}
        return url_element(uris.document_uri(resource_set, member_name(archive, member)), md=md)
    if isinstance(member, ChangeList):
        md = {"from": w3c_datetime(member.from_time), "until": w3c_datetime(member.until) if member.until else None}
        name = changelists.NAME if member.pk == alone else changelog.part_name(member.number)
        return url_element(uris.document_uri(resource_set, name), md=md)
    if isinstance(member, _CurrentDump):
        return url_element(uris.document_uri(resource_set, changedumps.NAME), md={"from": w3c_datetime(member.from_time)})
    md = {"from": w3c_datetime(member.from_time), "until": w3c_datetime(member.until)}
    return url_element(uris.document_uri(resource_set, member_name(archive, member)), md=md)


def member_name(archive, member):
    """``<archive>/<n>.xml``: a build's id, an archived Change Dump package's number."""
    number = member.number if isinstance(member, ChangeDumpPackage) else member.pk
    return f"{capabilities.get(archive).folder}/{number}.xml"


def part_name(archive, number):
    return f"{capabilities.get(archive).folder}/part-{number}.xml"


def _render(resource_set, archive, members, *, index=False):
    writer = DocumentWriter()
    alone = _alone(resource_set) if ARCHIVED[archive] == capabilities.CHANGELIST else None
    for member in members:
        writer.add(_entry(resource_set, archive, member, alone))
    md, links = heads.head(resource_set, archive, indexed_by=archive if index else None)
    out = io.BytesIO()
    writer.finish(out, md=md, links=links)
    return out.getvalue()


def render(resource_set, archive, name):
    """``(bytes, last_modified)`` of the archive document ``name`` (the archive, its index, or
    one of its parts); ``None`` if there is none."""
    members = _kept(resource_set, ARCHIVED[archive])
    if not members:
        return None
    last_modified = max(_changed(member) for member in members)
    limit = app_settings.MAX_ENTRIES_PER_DOCUMENT
    parts = [members[start : start + limit] for start in range(0, len(members), limit)]
    main = capabilities.get(archive).document
    if len(parts) == 1:
        return (_render(resource_set, archive, members), last_modified) if name == main else None
    if name == main:
        index = DocumentWriter(root="sitemapindex")
        for number in range(1, len(parts) + 1):
            index.add(url_element(uris.document_uri(resource_set, part_name(archive, number)), tag="sitemap"))
        out = io.BytesIO()
        md, links = heads.head(resource_set, archive)
        index.finish(out, md=md, links=links)
        return out.getvalue(), last_modified
    match = _PART.match(name.removeprefix(capabilities.get(archive).folder + "/"))
    if match and 1 <= int(match["number"]) <= len(parts):
        return _render(resource_set, archive, parts[int(match["number"]) - 1], index=True), last_modified
    return None


def _archived_dump(resource_set, number):
    """The Change Dump of the archived package ``number`` (410 once withdrawn)."""
    package = resource_set.changedump_packages.filter(number=number, archived__isnull=False).first()
    if package is None or not resource_set.has_capability(capabilities.CHANGEDUMP):
        return None  # (the packages it would list are served only with the Change Dump)
    if package.withdrawn is not None:
        return GONE
    return Served.rendered(*changedumps.archived_dump(resource_set, package))


def serve(resource_set, name, archive):
    """The archive document ``name``, or an archived document (``<n>.xml``): the bytes a build
    published, or the Change Dump of an archived package (410 once withdrawn)."""
    folder = capabilities.get(archive).folder + "/"
    member = _MEMBER.match(name.removeprefix(folder)) if name.startswith(folder) else None
    if member and ARCHIVED[archive] == capabilities.CHANGEDUMP:
        return _archived_dump(resource_set, int(member["number"]))
    if member:
        document = (
            Document.objects.filter(
                resource_set=resource_set, build_id=int(member["number"]), name=capabilities.get(ARCHIVED[archive]).document,
                build__capability=ARCHIVED[archive], build__status__in=[Build.Status.PUBLISHED, Build.Status.RETIRED],
            ).first()
        )
        if document is None:
            return None
        if document.withdrawn:
            return GONE
        return Served(document.sha256, document.written, storage_name=document.storage_name, size=document.size)
    if not resource_set.has_capability(ARCHIVED[archive]):
        return None
    rendered = render(resource_set, archive, name)
    # No Last-Modified: an entry that leaves (retention, a withdrawal) changes the document
    # without a newer date among those it lists. The ETag tells every change.
    return None if rendered is None else Served.rendered(rendered[0], None)


def published(resource_set, archive):
    """When the archive last changed; ``None`` while it is empty, or while the set does not
    offer what it archives (its documents would not be served)."""
    if not resource_set.has_capability(ARCHIVED[archive]):
        return None
    return capabilities.published_value(resource_set, archive, lambda: published_expression(archive))


def published_expression(archive):
    """The newest date of what the archive lists (see :func:`_kept` and :func:`_changed`), as
    an expression of a set's row (see capabilities.with_published); ``None`` while it is empty."""
    archived = ARCHIVED[archive]
    if archived == capabilities.CHANGELIST:
        rows, newest = ChangeList.objects, Max(Coalesce("last_datetime", "from_time"))
    elif archived == capabilities.CHANGEDUMP:
        rows, newest = ChangeDumpPackage.objects.filter(withdrawn__isnull=True, archived__isnull=False), Max("written")
    else:
        rows = Build.objects.filter(capability=archived, status__in=[Build.Status.PUBLISHED, Build.Status.RETIRED])
        newest = Max(Coalesce("finished", "at"))
    kept = rows.filter(resource_set=OuterRef("pk")).order_by().values("resource_set")
    latest = Subquery(kept.annotate(newest=newest).values("newest"))
    if archived != capabilities.CHANGEDUMP:
        return latest
    # Then the Change Dump itself, while it has packages. (SQLite's GREATEST is NULL if any of
    # its values is: each stands for the other where it is empty.)
    current = changedumps.published_expression()
    return Greatest(Coalesce(latest, current), Coalesce(current, latest))


def describe(resource_set, archive):
    kept = _kept(resource_set, ARCHIVED[archive])
    if not kept:
        return None
    if isinstance(kept[0], Build):
        size = sum(Document.objects.filter(build__in=kept, withdrawn__isnull=True).values_list("size", flat=True))
    elif isinstance(kept[0], ChangeList):
        size = sum(member.size for member in kept)
    else:  # the packages of the Change Dumps it lists, those of changedump.xml too
        packages = resource_set.changedump_packages.filter(withdrawn__isnull=True).values_list("size", "manifest_size")
        size = sum(package + manifest for package, manifest in packages)
    documents = ngettext("%(n)d document", "%(n)d documents", len(kept)) % {"n": len(kept)}
    return f"{documents} in the archive (the current ones too), {filesizeformat(size)}"


class Archive:
    """What the capability table asks of a builder (see capabilities.py), for one archive."""

    def __init__(self, archive):
        self.archive = archive

    def update(self, resource_set, *, progress=None, batch_size=None, parallel=False, lock=None):
        return []  # the builds it lists are made by their own capability

    def published(self, resource_set):
        return published(resource_set, self.archive)

    def published_expression(self):
        return published_expression(self.archive)

    def serve(self, resource_set, name):
        return serve(resource_set, name, self.archive)

    def describe(self, resource_set):
        return describe(resource_set, self.archive)


resourcelist = Archive(capabilities.RESOURCELIST_ARCHIVE)
resourcedump = Archive(capabilities.RESOURCEDUMP_ARCHIVE)
changelist = Archive(capabilities.CHANGELIST_ARCHIVE)
changedump = Archive(capabilities.CHANGEDUMP_ARCHIVE)
