"""Serving Change Lists and the Change List Index (spec sections 12.1 and 12.2).

The change log (:mod:`django_resourcesync.tracking.changelog`) cuts a set's changes into lists.
The open one is rendered from the database on every request, so a committed change shows as soon
as it is processed, with no rebuild; a closed one is served from storage. Once there is more
than one list, ``changelist.xml`` is a Change List Index, listing them oldest first, and every
list links to it with ``rel="index"``; after retention has dropped old lists, the index's
``from`` tells a Destination how far back the log reaches.

URIs: ``changelist.xml`` (the open list, or the index) and ``changelist/<number>.xml``.
"""

import hashlib
import io

from django.db.models import OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.utils.translation import ngettext

from .. import capabilities, heads, tracking, uris
from ..models import ChangeList
from ..served import Served
from ..tracking.changelog import NAME, close_due, part_name, render_list
from ..xml.writer import DocumentWriter, stylesheet_href, url_element, w3c_datetime


def render_index(resource_set, lists):
    writer = DocumentWriter(root="sitemapindex")
    for changelist in lists:
        md = {"from": w3c_datetime(changelist.from_time)}
        if changelist.until is not None:
            md["until"] = w3c_datetime(changelist.until)
        writer.add(url_element(uris.document_uri(resource_set, part_name(changelist.number)), md=md, tag="sitemap"))
    out = io.BytesIO()
    closed = all(changelist.until is not None for changelist in lists)
    md, links = heads.head(
        resource_set, capabilities.CHANGELIST, from_=lists[0].from_time, until=lists[-1].until if closed else None
    )
    writer.finish(out, md=md, links=links)
    return out.getvalue()


def _live(changelist, has_index):
    """The open list: its ETag comes from the database (and the stylesheet the list names),
    the body is rendered on demand."""
    state = f"{changelist.pk}:{changelist.entries}:{changelist.last_datetime}:{has_index}:{stylesheet_href()}"
    etag = hashlib.sha256(state.encode()).hexdigest()

    def body():
        out = io.BytesIO()
        render_list(changelist, out, has_index=has_index)
        return out.getvalue()

    return Served(etag, changelist.last_datetime or changelist.from_time, body=body)


def _stored(changelist):
    return Served(changelist.sha256, changelist.until, storage_name=changelist.storage_name, size=changelist.size)


def serve(resource_set, name):
    """The :class:`Served` for ``changelist.xml`` or ``changelist/<number>.xml``, or ``None``."""
    lists = list(resource_set.changelists.filter(archived__isnull=True).order_by("number"))
    if not lists:
        # Every list has gone to the archive: those stay served, as they were.
        return _archived(resource_set, name)
    has_index = len(lists) > 1
    if name == NAME:
        if not has_index:
            return _live(lists[0], has_index=False)
        return Served.rendered(render_index(resource_set, lists), max(c.last_datetime or c.from_time for c in lists))
    for changelist in lists:
        if name == part_name(changelist.number):
            return _live(changelist, has_index) if changelist.is_open else _stored(changelist)
    return _archived(resource_set, name)


def _archived(resource_set, name):
    """A list that left the index for the Change List Archive stays served, as it was."""
    for changelist in resource_set.changelists.filter(archived__isnull=False):
        if name == part_name(changelist.number):
            return _stored(changelist)
    return None


def update(resource_set, *, progress=None, batch_size=None, parallel=False, lock=None):
    """The capability table's way in (see capabilities.py): close the open Change List if its
    period is over (the open list is served live and needs no build)."""
    with tracking.locked(resource_set):
        close_due(resource_set)
    return []


def published(resource_set):
    """When the set's change log last changed; ``None`` before it starts (its first reconcile)."""
    return capabilities.published_value(resource_set, capabilities.CHANGELIST, published_expression)


def published_expression():
    """:func:`published` as an expression of a set's row (see capabilities.with_published): its
    newest list's last change, or its start while it has none."""
    newest = ChangeList.objects.filter(resource_set=OuterRef("pk")).order_by("-number")
    return Subquery(newest.annotate(changed=Coalesce("last_datetime", "from_time")).values("changed")[:1])


def describe(resource_set):
    """What the admin says of it."""
    lists = resource_set.changelists.filter(archived__isnull=True).count()
    if not lists:
        return None
    changes = resource_set.changes.count()
    return (ngettext("%(n)d change", "%(n)d changes", changes) % {"n": changes} + " "
            + ngettext("in %(n)d list", "in %(n)d lists", lists) % {"n": lists})


def notice(resource_set):
    """What a framework notification tells of it (see push.announce): the newest list, with
    a link to the index once there is one; a new list is a new document (``created``)."""
    lists = list(resource_set.changelists.filter(archived__isnull=True).order_by("-number")[:2])
    if not lists:
        return None
    newest = lists[0]
    indexed = len(lists) > 1
    own = uris.document_uri(resource_set, part_name(newest.number) if indexed else NAME)
    return {
        "marker": [newest.number, newest.entries],
        "loc": own,
        "index": uris.document_uri(resource_set, NAME) if indexed else None,
        "datetime": w3c_datetime(newest.last_datetime or newest.from_time),
    }
