"""Resource List and Resource List Index (spec sections 10.1 and 10.2).

The list is rendered from the set's :class:`~django_resourcesync.models.Resource` rows. While it
fits in one document (``MAX_ENTRIES_PER_DOCUMENT`` entries and ``MAX_DOCUMENT_BYTES`` bytes),
``resourcelist.xml`` is a ``<urlset>``; past that it is a ``<sitemapindex>`` whose parts each
carry ``rs:ln rel="up"`` and ``rel="index"``. The parts are ranges of the rows by primary key,
planned before any is rendered (see :mod:`~django_resourcesync.builders.parts`), so that Celery
workers can render them at the same time: part N is ``resourcelist/<build>/part-NNNNN.xml``,
followed by ``part-NNNNN-2.xml`` and so on if its rows pass the byte limit.
"""

import itertools

from django.db import connections
from django.db.models import F
from django.utils import timezone

from .. import capabilities, heads, mementos, uris, versions
from ..conf import app_settings
from ..models import Build, Document, Resource, Withdrawal
from ..xml.writer import DocumentWriter, url_element, w3c_datetime
from . import parts
from .context import BuildContext, build_notice, cut_document, describe_build, published_at, published_at_expression

NAME = "resourcelist.xml"


class _Overflow(Exception):
    """A list planned as a single document outgrew the limits: build it as an index."""


def part_name(build, number, document=1):
    suffix = f"-{document}" if document > 1 else ""
    return f"resourcelist/{build.pk}/part-{number:05d}{suffix}.xml"


def build_resourcelist(resource_set, *, refresh=True, progress=None, batch_size=None, parallel=False, lock=None):
    """Bring the set's record up to date (unless ``refresh`` is false), render its Resource List
    and publish it.

    With ``parallel``, a list past one document is planned as parts that are sent to Celery
    workers as tasks; the build is returned still running, and the task that completes it
    publishes it. ``lock``, the :class:`~django_resourcesync.builders.build_lock` held for this
    build, is then kept held until the build is over.

    On any error the build is recorded as failed, its files are removed, and the documents
    published before stay in place and served.
    """
    if parallel and lock is None:
        raise ValueError("a parallel build needs the build lock it runs under")
    context = BuildContext(resource_set, capabilities.RESOURCELIST, at=timezone.now())
    batch_size = batch_size or app_settings.BATCH_SIZE
    try:
        context.bring_up_to_date(refresh=refresh, progress=progress, batch_size=batch_size)
        rows = Resource.objects.filter(resource_set=resource_set)
        total = rows.count()
        if total <= app_settings.MAX_ENTRIES_PER_DOCUMENT:
            try:
                count, completed = _render_single(context, rows, total, progress, batch_size)
                return context.publish(entries=count, completed=completed, prepare=before_publish)
            except _Overflow:
                # Planned as one document, the list outgrew the limits: render it as an index.
                context.discard()
        planned = parts.plan(context.build, rows, app_settings.MAX_ENTRIES_PER_DOCUMENT)
        return parts.run(context, planned, parallel=parallel, lock=lock, progress=progress, total=total, batch_size=batch_size)
    except BaseException as exc:
        context.fail(exc)
        raise


def _head(build, completed, *, in_index=False):
    """``(md, links)`` of a document of the list: the list, its index, or a part of the index."""
    return heads.head(build.resource_set, capabilities.RESOURCELIST, at=build.at, completed=completed,
                      indexed_by=capabilities.RESOURCELIST if in_index else None)


def _entry_blocks(rows, batch_size, resource_set):
    """The ``<url>`` elements of ``rows`` in key order, ``batch_size`` at a time: each block
    ``(count, data, one_by_one)``, ``data`` the UTF-8 bytes of its ``count`` entries joined, and
    ``one_by_one()`` the same entries each alone (for a block that would overflow a document).

    Each row carries its element, rendered when the resource last changed: the list is an
    ordered scan that copies text, with no per-resource formatting (but the links to a
    resource's TimeGate and TimeMap, where the set publishes prior versions). On PostgreSQL the
    database joins a block's elements (``string_agg``), so no Python object is made per row.
    """
    rows = rows.order_by("pk")
    if versions.publishes(resource_set):
        links_of = mementos.resource_links_for(resource_set)
        entries = rows.values_list("entry_xml", "object_pk").iterator(chunk_size=batch_size)
        return _joined((mementos.splice(entry, links_of(key)) for entry, key in entries), batch_size)
    if connections[rows.db].vendor == "postgresql":
        return _joined_by_postgresql(rows, batch_size)
    return _joined(rows.values_list("entry_xml", flat=True).iterator(chunk_size=batch_size), batch_size)


def _joined(entries, size):
    entries = iter(entries)
    while block := list(itertools.islice(entries, size)):
        yield len(block), "".join(block).encode("utf-8"), lambda block=block: (entry.encode("utf-8") for entry in block)


def _joined_by_postgresql(rows, size):
    # Keyset pages of the rows, each read by one query (its snapshot its own, as each part's is).
    # The elements are joined in the order the sorted page gives them, which PostgreSQL keeps in
    # practice: no sort of the page again (``ORDER BY`` in the aggregate costs as much as the
    # rest of the query), and a Resource List's entries may come in any order anyway.
    after = None
    while True:
        page = rows if after is None else rows.filter(pk__gt=after)
        sql, params = page.values_list("pk", "entry_xml")[:size].query.get_compiler(rows.db).as_sql()
        with connections[rows.db].cursor() as cursor:
            cursor.execute(
                f"SELECT count(*), max(page.pk), string_agg(page.entry, '') FROM ({sql}) AS page (pk, entry)",
                params,
            )
            count, last, data = cursor.fetchone()
        if not count:
            return
        yield count, data.encode("utf-8"), lambda entries=page.filter(pk__lte=last): (
            entry.encode("utf-8") for entry in entries.values_list("entry_xml", flat=True)
        )
        if count < size:
            return
        after = last


def _fill(writer, blocks, limits, full):
    """Add the entries of ``blocks`` to ``writer``, a block at once where it fits, else one at a
    time; ``full(writer)`` is called with the writer an entry does not fit in, and returns the
    one to go on with. Yields ``(entries added so far, the writer)`` after each block."""
    added = 0
    for count, data, one_by_one in blocks:
        if writer.fits(len(data), *limits, count=count):
            writer.add(data, count=count)
            added += count
        else:
            for entry in one_by_one():  # read again on PostgreSQL: counted as written
                if not writer.fits(len(entry), *limits):
                    writer = full(writer)
                writer.add(entry)
                added += 1
        yield added, writer


def _overflow(writer):
    writer.discard()
    raise _Overflow


def _render_single(context, rows, total, progress, batch_size):
    writer = DocumentWriter()
    limits = app_settings.MAX_ENTRIES_PER_DOCUMENT, app_settings.MAX_DOCUMENT_BYTES  # read once, not per entry
    for _added, writer in _fill(writer, _entry_blocks(rows, batch_size, context.resource_set), limits, _overflow):
        pass
    completed = timezone.now()
    build = context.build
    md, links = _head(build, completed)
    context.write(NAME, writer, md=md, links=links, at=build.at, completed=completed)
    if progress:
        progress("resourcelist", writer.count, total)
    return writer.count, completed


def render_part(context, part, *, progress=None, batch_size):
    """Write the rows of ``part`` into its documents (kept in ``context.documents``); returns
    ``(documents, entries, report)``. Rendering a part again overwrites its files."""
    build = context.build
    rows = Resource.objects.filter(resource_set=context.resource_set, pk__gt=part.after_pk, pk__lte=part.last_pk)
    written = 0
    count = 0
    writer = DocumentWriter()

    def finish_document(writer):
        completed = timezone.now()
        name = part_name(build, part.number, written + 1)
        md, links = _head(build, completed, in_index=True)
        context.write(name, writer, md=md, links=links, at=build.at, completed=completed, replace=True)

    def full(writer):
        nonlocal written
        finish_document(writer)
        written += 1
        return DocumentWriter()

    limits = app_settings.MAX_ENTRIES_PER_DOCUMENT, app_settings.MAX_DOCUMENT_BYTES  # read once, not per entry
    blocks = _entry_blocks(rows, batch_size, context.resource_set)
    for added, writer in _fill(writer, blocks, limits, full):
        if progress and added // 10_000 > count // 10_000:
            progress(added, added)
        count = added
    if writer.count or not written:
        finish_document(writer)
        written += 1
    else:
        writer.discard()
    if progress:
        progress(count, count)
    return written, count, {}


def part_documents(build, part):
    """The documents of a done part, one group each, whose entries add up to the part's."""
    return [(part_name(build, part.number, document),) for document in range(1, part.documents + 1)]


def progress_details(entries):
    return {}


def finish(context, done):
    """Write the Resource List Index over the parts ``done``; returns ``(entries, completed, report)``."""
    resource_set, build = context.resource_set, context.build
    recorded = {document.name: document for document in Document.objects.filter(build=build)}
    index = DocumentWriter(root="sitemapindex")
    for part in done:
        for (name,) in part_documents(build, part):
            md = {"at": w3c_datetime(build.at), "completed": w3c_datetime(recorded[name].completed)}
            index.add(url_element(uris.document_uri(resource_set, name), md=md, tag="sitemap"))
    completed = timezone.now()
    md, links = _head(build, completed)
    context.write(NAME, index, md=md, links=links, at=build.at, completed=completed)
    return sum(part.entries for part in done), completed, {}


def update(resource_set, *, progress=None, batch_size=None, parallel=False, lock=None):
    """The capability table's way in (see capabilities.py): a new Resource List of the set's
    record as it is (the rebuild brought it up to date)."""
    return [build_resourcelist(resource_set, refresh=False, progress=lock.renewing(progress), batch_size=batch_size,
                               parallel=parallel, lock=lock)]


def published(resource_set):
    """When the set's published Resource List was made; ``None`` before the first."""
    return published_at(resource_set, capabilities.RESOURCELIST)


def published_expression():
    """:func:`published` as an expression of a set's row (see capabilities.with_published)."""
    return published_at_expression(capabilities.RESOURCELIST)


def describe(resource_set):
    """What the admin says of it."""
    return describe_build(resource_set, capabilities.RESOURCELIST)


def notice(resource_set):
    """What a framework notification tells of it (see push.announce)."""
    return build_notice(resource_set, capabilities.RESOURCELIST)


# -- withdrawal (see builders.withdrawal) ---------------------------------------------------


def cut_from_build(build, record_ids, locs):
    """Leave the resources whose records had the keys ``record_ids`` and the URIs ``locs`` out
    of the documents of a Resource List build (the parts whose ranges take them in, or the one
    document); returns how many entries were cut out. The index, if any, stays as it is."""
    names = [NAME]
    hit = parts.holding(build, record_ids)
    if hit:
        names = [name for part in build.parts.filter(number__in=hit) for (name,) in part_documents(build, part)]
    cut = 0
    for document in Document.objects.filter(build=build, name__in=names, withdrawn__isnull=True, is_index=False):
        cut += len(cut_document(document, locs))
    if cut:
        # (A build being published counts its entries as it does: see BuildContext.publish.)
        Build.objects.filter(pk=build.pk).exclude(status=Build.Status.RUNNING).update(entries=F("entries") - cut)
    return cut


def before_publish(context, report):
    """Before a list is published (in the transaction that publishes it, under the set's lock):
    the resources that left the set since its snapshot are cut out of it. Returns how many."""
    leaving = Withdrawal.since(context.resource_set, context.build.at)
    if not leaving:
        return 0
    return cut_from_build(context.build, [record_id for _key, record_id, _uri in leaving], [uri for *_rest, uri in leaving])
