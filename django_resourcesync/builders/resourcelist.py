"""Resource List and Resource List Index (spec sections 10.1 and 10.2).

The list is rendered from the set's :class:`~django_resourcesync.models.Resource` rows in one
ordered scan. While it fits in one document (``MAX_ENTRIES_PER_DOCUMENT`` entries and
``MAX_DOCUMENT_BYTES`` bytes), ``resourcelist.xml`` is a ``<urlset>``; past that it is a
``<sitemapindex>`` whose parts, ``resourcelist/<build>/part-NNNNN.xml``, each carry
``rs:ln rel="up"`` and ``rel="index"``.
"""

from django.utils import timezone

from .. import capabilities, uris
from ..conf import app_settings
from ..models import Resource
from ..tracking import process_pending, reconcile
from ..xml.writer import DocumentWriter, url_element, w3c_datetime
from . import BuildContext

NAME = "resourcelist.xml"

class _Overflow(Exception):
    """A list planned as a single document outgrew the limits: build it as an index."""


def part_name(build, number):
    return f"resourcelist/{build.pk}/part-{number:05d}.xml"


def build_resourcelist(resource_set, *, refresh=True, pending=True, progress=None, batch_size=None):
    """Reconcile the set (unless ``refresh`` is false; first processing its pending changes unless
    ``pending`` is false), render its Resource List and publish it.

    On any error the build is recorded as failed, its files are removed, and the documents
    published before stay in place and served.
    """
    context = BuildContext(resource_set, capabilities.RESOURCELIST, at=timezone.now())
    batch_size = batch_size or app_settings.BATCH_SIZE
    try:
        if refresh and pending:
            process_pending([resource_set.source], batch_size=batch_size)
        if refresh:
            reconcile(resource_set, progress=progress, batch_size=batch_size)
        context.take_snapshot_time()
        rows = Resource.objects.filter(resource_set=resource_set)
        total = rows.count()
        try:
            count, completed = _render(context, rows, total > app_settings.MAX_ENTRIES_PER_DOCUMENT, total, progress, batch_size)
        except _Overflow:
            # Planned as one document, the list outgrew the limits: render it as an index.
            context.discard()
            count, completed = _render(context, rows, True, total, progress, batch_size)
    except BaseException as exc:
        context.fail(exc)
        raise
    return context.publish(entries=count, completed=completed)


def _render(context, rows, as_index, total, progress, batch_size):
    resource_set, build = context.resource_set, context.build
    max_entries = app_settings.MAX_ENTRIES_PER_DOCUMENT
    max_bytes = app_settings.MAX_DOCUMENT_BYTES
    up = {"rel": "up", "href": uris.capability_list_uri(resource_set)}
    index_uri = uris.document_uri(resource_set, NAME)
    parts = []
    writer = DocumentWriter()
    count = 0

    def finish_part():
        completed = timezone.now()
        name = part_name(build, len(parts) + 1)
        md = {"capability": capabilities.RESOURCELIST, "at": w3c_datetime(build.at), "completed": w3c_datetime(completed)}
        context.write(name, writer, md=md, links=[up, {"rel": "index", "href": index_uri}], at=build.at, completed=completed)
        parts.append((name, completed))

    # Each row carries its <url> element, rendered when the resource last changed: the list is
    # one ordered scan that copies text, with no per-resource formatting.
    for entry in rows.order_by("uri").values_list("entry_xml", flat=True).iterator(chunk_size=batch_size):
        entry = entry.encode("utf-8")
        if not writer.fits(len(entry), max_entries, max_bytes):
            if not as_index:
                writer.discard()
                raise _Overflow
            finish_part()
            writer = DocumentWriter()
        writer.add(entry)
        count += 1
        if progress and count % 10_000 == 0:
            progress("resourcelist", count, total)

    completed = timezone.now()
    if not as_index:
        md = {"capability": capabilities.RESOURCELIST, "at": w3c_datetime(build.at), "completed": w3c_datetime(completed)}
        context.write(NAME, writer, md=md, links=[up], at=build.at, completed=completed)
    else:
        if writer.count or not parts:
            finish_part()
        else:
            writer.discard()
        index = DocumentWriter(root="sitemapindex")
        for name, part_completed in parts:
            index.add(
                url_element(
                    uris.document_uri(resource_set, name),
                    md={"at": w3c_datetime(build.at), "completed": w3c_datetime(part_completed)},
                    tag="sitemap",
                )
            )
        completed = timezone.now()
        md = {"capability": capabilities.RESOURCELIST, "at": w3c_datetime(build.at), "completed": w3c_datetime(completed)}
        context.write(NAME, index, md=md, links=[up], at=build.at, completed=completed)
    if progress:
        progress("resourcelist", count, total)
    return count, completed
