"""Source Description (spec section 8) and Capability Lists (section 9).

Both are small and follow the sets' configuration, so they are rendered from the database on
request rather than stored: a set disabled in the admin leaves the Source Description at once.
"""

import io

from django.db.models import Max

from .. import capabilities, heads, uris
from ..conf import app_settings
from ..entries import clean_links
from ..exceptions import NotRegistered
from ..models import ResourceSet, SourceState
from ..xml.writer import DocumentWriter, url_element


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


def _render(writer, md, links):
    out = io.BytesIO()
    writer.finish(out, md=md, links=links)
    return out.getvalue()


def capability_list(resource_set):
    """``(bytes, last_modified)`` of the set's Capability List, or ``None`` if it lists nothing."""
    published = published_capabilities(resource_set)
    if not published:
        return None
    writer = DocumentWriter()
    for capability, _changed in published:
        builder = capabilities.get(capability).builder
        links = builder.entry_links(resource_set) if hasattr(builder, "entry_links") else ()
        writer.add(url_element(
            uris.document_uri(resource_set, capabilities.get(capability).document), md={"capability": capability}, links=links
        ))
    md, links = heads.capability_list_head(clean_links([{"rel": "describedby", "href": resource_set.describedby}]))
    last_modified = max([resource_set.modified] + [changed for _c, changed in published if changed])
    return _render(writer, md, links), last_modified


def public_sets():
    """``[(set, last_modified)]``: enabled sets that publish at least one capability document,
    in Source Description order, with the time their configuration or documents last changed.
    Sets for partners with a token are among them only with ``LIST_TOKEN_SETS``."""
    found = []
    sets = ResourceSet.objects.filter(enabled=True) if app_settings.LIST_TOKEN_SETS else ResourceSet.objects.public()
    for resource_set in sets:
        published = published_capabilities(resource_set)
        if published:
            found.append((resource_set, max([resource_set.modified, *(changed for _c, changed in published if changed)])))
    return found


def source_description(part=None):
    """``(bytes, last_modified)`` of the Source Description; ``None`` for a part that does not
    exist. A Source with more sets than one document may list (``MAX_ENTRIES_PER_DOCUMENT``
    entries, ``MAX_DOCUMENT_BYTES`` bytes) publishes a Source Description Index (spec section 8)
    at the well-known URI, listing parts ``/.well-known/resourcesync/<n>.xml`` that each link
    ``index`` back to it."""
    # Every set's configuration counts, disabled ones too: disabling a set changes this document.
    # A deleted set takes its date with it: the Source's own clock keeps when that happened, so
    # the date never goes backwards and a client's If-Modified-Since never hides the change.
    # A set for partners that it does not list has no say (its edits are nobody else's business);
    # one that goes from public to restricted or back touches the Source's clock (models.py).
    sets = ResourceSet.objects.all() if app_settings.LIST_TOKEN_SETS else ResourceSet.objects.exclude(access="token")
    last_modified = max(
        filter(None, [sets.aggregate(latest=Max("modified"))["latest"], SourceState.changed_at()]), default=None
    )
    found = public_sets()
    last_modified = max(filter(None, [last_modified, *(changed for _set, changed in found)]), default=None)
    parts = _cut([_description_entry(resource_set) for resource_set, _changed in found])
    # Encoded as every published URI; a value that cannot be published is left out.
    md, links = heads.source_description_head(clean_links([{"rel": "describedby", "href": app_settings.SOURCE_DESCRIBEDBY}]))
    if len(parts) == 1:
        return (_render_entries(parts[0], md, links), last_modified) if part is None else None
    if part is None:
        writer = DocumentWriter(root="sitemapindex")
        for number in range(1, len(parts) + 1):
            writer.add(url_element(uris.source_description_part_uri(number), tag="sitemap"))
        return _render(writer, md, links), last_modified
    if not 1 <= part <= len(parts):
        return None
    return _render_entries(parts[part - 1], md, [*links, heads.source_description_index()]), last_modified


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
