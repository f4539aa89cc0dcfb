"""Source Description (spec section 8) and Capability Lists (section 9).

Both are small and follow the sets' configuration, so they are made from the database on
request rather than stored: a set disabled in the admin leaves the Source Description at once.

What they are made of is read in a number of queries that does not grow with the number of sets:
each set is fetched with the dates of its documents (:func:`capabilities.with_published`). Their
bytes, with their ETag, are rendered once for what they are made of and kept in the process
(:func:`_rendered`): a request, a conditional one above all, is answered from those queries
without rendering again, and any change to what a document is made of is a document of its own.
"""

import collections
import hashlib
import io
import threading
from typing import NamedTuple

from django.core.signals import setting_changed
from django.db.models import Max, Q, Subquery
from django.db.models.functions import Coalesce, Greatest
from django.dispatch import receiver
from django.urls import get_script_prefix, get_urlconf

from .. import capabilities, heads, uris
from ..conf import app_settings
from ..entries import clean_links
from ..exceptions import NotRegistered
from ..models import ResourceSet, SourceState
from ..xml.writer import DocumentWriter, url_element


class Rendered(NamedTuple):
    """A document as it is served: its bytes, their SHA-256 (the ETag) and its Last-Modified."""

    body: bytes
    etag: str
    last_modified: object  # a datetime, or None


def published_capabilities(resource_set):
    """``[(capability, last_modified)]`` for each capability of the set that has a document,
    in the table's order: its builder says whether it has, and since when."""
    found = []
    try:
        gives_bytes = resource_set.get_source().gives_bytes
    except NotRegistered:
        gives_bytes = True  # what was published stays listed until the source is back
    for capability in capabilities.TABLE:
        if capability.needs_bytes and not gives_bytes:
            continue  # a dump of resources without bytes is not offered (check W008)
        if resource_set.has_capability(capability.name):
            changed = capability.builder.published(resource_set)
            if changed is not None:
                found.append((capability.name, changed))
    return found


# -- rendered once for what they are made of ---------------------------------------------------

#: Documents kept in the process: the Source Description and a Capability List per set (the
#: least recently served leaves first past this many), each in the last state it was served in.
KEPT = 1024
_kept = collections.OrderedDict()  # {document: (what it is made of, hashed; [(bytes, sha256)])}
_lock = threading.Lock()


def _rendered(document, made_of, render):
    """What ``render()`` returns, as a list of ``(bytes, sha256)``, for the ``document`` (a key:
    which one) that ``made_of`` says everything of that the database gives (the settings give
    the rest, and the URLconf and script prefix the URIs); rendered when that has changed since
    the document was last served, kept from then on."""
    made_of = hashlib.sha256(repr((get_urlconf(), get_script_prefix(), made_of)).encode()).digest()
    with _lock:
        kept = _kept.get(document)
        if kept is not None and kept[0] == made_of:
            _kept.move_to_end(document)
            return kept[1]
    found = [(body, hashlib.sha256(body).hexdigest()) for body in render()]
    with _lock:
        _kept[document] = (made_of, found)
        _kept.move_to_end(document)
        while len(_kept) > KEPT:
            _kept.popitem(last=False)
    return found


@receiver(setting_changed, dispatch_uid="resourcesync_rendered_documents")
def _forget(**kwargs):
    """Settings shape the documents (BASE_URL, the stylesheet, the limits): none kept survives a change."""
    with _lock:
        _kept.clear()


def _render(writer, md, links):
    out = io.BytesIO()
    writer.finish(out, md=md, links=links)
    return out.getvalue()


# -- Capability Lists --------------------------------------------------------------------------


def capability_list_document(resource_set):
    """:class:`Rendered` of the set's Capability List, or ``None`` if it lists nothing. Fetch the
    set with :func:`capabilities.with_published`: then this asks the database nothing."""
    published = published_capabilities(resource_set)
    if not published:
        return None
    listed = []
    for capability, _changed in published:
        builder = capabilities.get(capability).builder
        listed.append((capability, builder.entry_links(resource_set) if hasattr(builder, "entry_links") else ()))
    made_of = (resource_set.slug, resource_set.describedby, listed)

    def render():
        return [_render_capability_list(resource_set, listed)]

    ((body, etag),) = _rendered(("capabilitylist", resource_set.pk), made_of, render)
    last_modified = max([resource_set.modified] + [changed for _c, changed in published if changed])
    return Rendered(body, etag, last_modified)


def _render_capability_list(resource_set, listed):
    writer = DocumentWriter()
    for capability, links in listed:
        writer.add(url_element(
            uris.document_uri(resource_set, capabilities.get(capability).document), md={"capability": capability}, links=links
        ))
    md, links = heads.capability_list_head(clean_links([{"rel": "describedby", "href": resource_set.describedby}]))
    return _render(writer, md, links)


def capability_list(resource_set):
    """``(bytes, last_modified)`` of the set's Capability List, or ``None`` if it lists nothing."""
    found = capability_list_document(resource_set)
    return None if found is None else (found.body, found.last_modified)


# -- the Source Description --------------------------------------------------------------------


def public_sets():
    """``[(set, last_modified)]``: enabled sets that publish at least one capability document,
    in Source Description order, with the time their configuration or documents last changed.
    Sets for partners with a token are among them only with ``LIST_TOKEN_SETS``. One query."""
    found = []
    sets = ResourceSet.objects.with_published()
    for resource_set in sets.filter(enabled=True) if app_settings.LIST_TOKEN_SETS else sets.public():
        published = published_capabilities(resource_set)
        if published:
            found.append((resource_set, max([resource_set.modified, *(changed for _c, changed in published if changed)])))
    return found


def _configured_at():
    """When the configuration of the sets the Source Description has a say of last changed, in
    one query: every set's, disabled ones too (disabling a set changes this document), and the
    Source's own clock, which keeps when a set was deleted (a deleted set takes its date with it,
    and the date must never go backwards: a client's If-Modified-Since would hide the change).
    A set for partners that it does not list has no say (its edits are nobody else's business);
    one that goes from public to restricted or back touches the Source's clock (models.py)."""
    counted = Q() if app_settings.LIST_TOKEN_SETS else ~Q(access="token")
    newest = Max("modified", filter=counted)
    clock = Subquery(SourceState.objects.filter(pk=1).values("changed"))
    # One row whatever the number of sets (none too); SQLite's GREATEST is NULL if any value is.
    changed = Greatest(Coalesce(newest, clock), Coalesce(clock, newest))
    return ResourceSet.objects.aggregate(changed=changed)["changed"]


def source_description_document(part=None):
    """:class:`Rendered` of the Source Description; ``None`` for a part that does not exist.
    Two queries, whatever the number of sets.

    A Source with more sets than one document may list (``MAX_ENTRIES_PER_DOCUMENT`` entries,
    ``MAX_DOCUMENT_BYTES`` bytes) publishes a Source Description Index (spec section 8) at the
    well-known URI, listing parts ``/.well-known/resourcesync/<n>.xml`` that each link ``index``
    back to it."""
    # The date first: a change committed between the two queries then shows in the sets, and
    # makes the date of the next request later than this one (never a copy older than its date).
    configured = _configured_at()
    found = public_sets()
    last_modified = max(filter(None, [configured, *(changed for _set, changed in found)]), default=None)
    listed = [resource_set for resource_set, _changed in found]
    # A restricted set is named by its Capability List's URI alone (LIST_TOKEN_SETS).
    made_of = [(s.slug, s.describedby if s.is_public else "") for s in listed]
    documents = _rendered("description", made_of, lambda: _render_description(listed))
    if part is None:
        return Rendered(*documents[0], last_modified)
    if len(documents) == 1 or not 1 <= part < len(documents):
        return None
    return Rendered(*documents[part], last_modified)


def source_description(part=None):
    """``(bytes, last_modified)`` of the Source Description, or of a part of its index; ``None``
    for a part that does not exist."""
    found = source_description_document(part)
    return None if found is None else (found.body, found.last_modified)


def _render_description(sets):
    """The Source Description: ``[the document]``, or ``[the index, its parts...]``."""
    parts = _cut([_description_entry(resource_set) for resource_set in sets])
    # Encoded as every published URI; a value that cannot be published is left out.
    md, links = heads.source_description_head(clean_links([{"rel": "describedby", "href": app_settings.SOURCE_DESCRIBEDBY}]))
    if len(parts) == 1:
        return [_render_entries(parts[0], md, links)]
    writer = DocumentWriter(root="sitemapindex")
    for number in range(1, len(parts) + 1):
        writer.add(url_element(uris.source_description_part_uri(number), tag="sitemap"))
    index = [*links, heads.source_description_index()]
    return [_render(writer, md, links), *(_render_entries(entries, md, index) for entries in parts)]


def _description_entry(resource_set):
    # A restricted set is named by its Capability List's URI alone (LIST_TOKEN_SETS).
    described = resource_set.describedby if resource_set.is_public else ""
    return url_element(
        uris.capability_list_uri(resource_set), md={"capability": capabilities.CAPABILITYLIST},
        links=clean_links([{"rel": "describedby", "href": described}]),
    )


def _cut(entries):
    """The entries in parts that each fit one document (``MAX_ENTRIES_PER_DOCUMENT`` entries,
    ``MAX_DOCUMENT_BYTES`` bytes); one part, maybe empty, when they all fit."""
    parts, writer = [[]], DocumentWriter()
    for entry in entries:
        if not writer.fits(len(entry.encode()), app_settings.MAX_ENTRIES_PER_DOCUMENT, app_settings.MAX_DOCUMENT_BYTES):
            parts.append([])
            writer = DocumentWriter()
        writer.add(entry)
        parts[-1].append(entry)
    return parts


def _render_entries(entries, md, links):
    writer = DocumentWriter()
    for entry in entries:
        writer.add(entry)
    return _render(writer, md, links)
