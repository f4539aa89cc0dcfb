"""Archives of snapshots (the 2013 technical paper's Resource Dump Archive, and its like for
Resource Lists): ``resourcelist-archive`` and ``resourcedump-archive``.

A set that offers one keeps the builds of the capability it archives past ``KEEP_BUILDS``, as
``ARCHIVE_RETENTION`` says (how many, how old), and the archive lists them, oldest first, each
with the ``at`` and ``completed`` of its snapshot: the current one too. Each archived document
has a URI of its own, ``<capability>-archive/<build>.xml``, which serves the bytes the build
published, as they were; the documents it links to (the parts of an index, the packages of a
dump) keep their URIs. What leaves the archive leaves storage. Past ``MAX_ENTRIES_PER_DOCUMENT``
entries the archive is an index of parts (``<capability>-archive/part-<n>.xml``).

A Resource Dump build that held the bytes of a resource that is no longer public is removed
at once (see :mod:`~django_resourcesync.builders.withdrawal`): it leaves the archive too.
"""

import datetime
import io
import re

from django.utils import timezone

from .. import capabilities, heads, uris
from ..conf import app_settings
from ..models import Build, Document
from ..served import GONE, Served
from ..xml.writer import DocumentWriter, url_element, w3c_datetime

ARCHIVED = capabilities.ARCHIVES
_MEMBER = re.compile(r"^(?P<build>[0-9]+)\.xml$")
_PART = re.compile(r"^part-(?P<number>[0-9]+)\.xml$")


def archive_of(capability):
    """The archive capability of ``capability`` (``resourcelist`` -> ``resourcelist-archive``), or ``None``."""
    return next((archive for archive, archived in ARCHIVED.items() if archived == capability), None)


def retention(capability):
    """``(count, age)`` of ``ARCHIVE_RETENTION`` for the archived ``capability``: how many
    builds (the current one included) and how old (seconds); ``None`` for no limit."""
    rule = (app_settings.ARCHIVE_RETENTION or {}).get(capability) or {}
    return rule.get("count"), rule.get("age")


def stale_builds(resource_set, capability, now=None):
    """The retired builds of ``capability`` the set no longer keeps: past ``KEEP_BUILDS``, and,
    if the set offers the capability's archive, past its retention too."""
    retired = list(
        Build.objects.filter(resource_set=resource_set, capability=capability, status=Build.Status.RETIRED)
        .order_by("-pk").values_list("pk", "at")
    )
    archive = archive_of(capability)
    if archive is None or not resource_set.has_capability(archive):
        return [pk for pk, _at in retired[app_settings.KEEP_BUILDS :]]
    count, age = retention(capability)
    cutoff = (now or timezone.now()) - datetime.timedelta(seconds=age) if age is not None else None
    stale = []
    for position, (pk, at) in enumerate(retired):
        if position < app_settings.KEEP_BUILDS:
            continue  # kept for Destinations that fetched an index just before a switch-over
        # ``count`` includes the published build.
        if (count is not None and position + 1 >= count) or (cutoff is not None and at < cutoff):
            stale.append(pk)
    return stale


def _kept(resource_set, capability):
    return list(
        Build.objects.filter(resource_set=resource_set, capability=capability,
                             status__in=[Build.Status.PUBLISHED, Build.Status.RETIRED]).order_by("pk")
    )


def member_name(archive, build):
    return f"{capabilities.get(archive).folder}/{build.pk}.xml"


def part_name(archive, number):
    return f"{capabilities.get(archive).folder}/part-{number}.xml"


def _render(resource_set, archive, builds, *, index=False):
    writer = DocumentWriter()
    for build in builds:
        md = {"at": w3c_datetime(build.at), "completed": w3c_datetime(build.completed) if build.completed else None}
        writer.add(url_element(uris.document_uri(resource_set, member_name(archive, build)), md=md))
    md, links = heads.head(resource_set, archive, indexed_by=archive if index else None)
    out = io.BytesIO()
    writer.finish(out, md=md, links=links)
    return out.getvalue()


def render(resource_set, archive, name):
    """``(bytes, last_modified)`` of the archive document ``name`` (the archive, its index, or
    one of its parts); ``None`` if there is none."""
    builds = _kept(resource_set, ARCHIVED[archive])
    if not builds:
        return None
    last_modified = max(build.finished or build.at for build in builds)
    limit = app_settings.MAX_ENTRIES_PER_DOCUMENT
    parts = [builds[start : start + limit] for start in range(0, len(builds), limit)]
    main = capabilities.get(archive).document
    if len(parts) == 1:
        return (_render(resource_set, archive, builds), last_modified) if name == main else None
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


def serve(resource_set, name, archive):
    """The archive document ``name``, or an archived document (``<build>.xml``): the bytes its
    build published (410 once withdrawn)."""
    member = _MEMBER.match(name.removeprefix(capabilities.get(archive).folder + "/"))
    if member and name.startswith(capabilities.get(archive).folder + "/"):
        document = (
            Document.objects.filter(
                resource_set=resource_set, build_id=int(member["build"]), name=capabilities.get(ARCHIVED[archive]).document,
                build__capability=ARCHIVED[archive], build__status__in=[Build.Status.PUBLISHED, Build.Status.RETIRED],
            ).first()
        )
        if document is None:
            return None
        if document.withdrawn:
            return GONE
        return Served(document.sha256, document.written, storage_name=document.storage_name, size=document.size)
    rendered = render(resource_set, archive, name)
    return None if rendered is None else Served.rendered(*rendered)


def published(resource_set, archive):
    """When the archive last changed (its newest build finished); ``None`` while it is empty."""
    build = _kept(resource_set, ARCHIVED[archive])[-1:]
    return (build[0].finished or build[0].at) if build else None


def describe(resource_set, archive):
    kept = _kept(resource_set, ARCHIVED[archive])
    if not kept:
        return None
    size = sum(Document.objects.filter(build__in=kept, withdrawn__isnull=True).values_list("size", flat=True))
    return f"{len(kept)} archived build(s), {size} bytes, since {kept[0].at:%Y-%m-%d %H:%M:%S}Z"


class Archive:
    """What the capability table asks of a builder (see capabilities.py), for one archive."""

    def __init__(self, archive):
        self.archive = archive

    def update(self, resource_set, *, progress=None, batch_size=None, parallel=False, lock=None):
        return []  # the builds it lists are made by their own capability

    def published(self, resource_set):
        return published(resource_set, self.archive)

    def serve(self, resource_set, name):
        return serve(resource_set, name, self.archive)

    def describe(self, resource_set):
        return describe(resource_set, self.archive)


resourcelist = Archive(capabilities.RESOURCELIST_ARCHIVE)
resourcedump = Archive(capabilities.RESOURCEDUMP_ARCHIVE)
