"""Source Description (spec section 8) and Capability Lists (section 9).

Both are small and follow the sets' configuration, so they are rendered from the database on
request rather than stored: a set disabled in the admin leaves the Source Description at once.
"""

import io

from django.db.models import Max

from .. import capabilities, uris
from ..conf import app_settings
from ..models import Build, ResourceSet
from ..xml.writer import DocumentWriter, url_element

# Which document each capability of a Capability List points at.
DOCUMENT_NAMES = {
    capabilities.RESOURCELIST: "resourcelist.xml",
    capabilities.CHANGELIST: "changelist.xml",
    capabilities.RESOURCEDUMP: "resourcedump.xml",
    capabilities.CHANGEDUMP: "changedump.xml",
}


def published_capabilities(resource_set):
    """``[(capability, last_modified)]`` for each capability of the set that has a document:
    a published build, or (Change Lists) a started change log."""
    changed = {
        build.capability: build.finished
        for build in Build.objects.filter(resource_set=resource_set, status=Build.Status.PUBLISHED).order_by("pk")
    }
    log = resource_set.changelists.order_by("-number").first()
    if log is not None:
        changed[capabilities.CHANGELIST] = log.last_datetime or log.from_time
    package = resource_set.changedump_packages.order_by("-number").first()
    if package is not None:
        changed[capabilities.CHANGEDUMP] = package.written
    order = [name for name, _label in capabilities.CAPABILITY_CHOICES]
    return [(name, changed[name]) for name in order if resource_set.has_capability(name) and name in changed]


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
        writer.add(url_element(uris.document_uri(resource_set, DOCUMENT_NAMES[capability]), md={"capability": capability}))
    links = [{"rel": "up", "href": uris.source_description_uri()}]
    if resource_set.describedby:
        links.append({"rel": "describedby", "href": resource_set.describedby})
    last_modified = max([resource_set.modified] + [changed for _c, changed in published if changed])
    return _render(writer, {"capability": capabilities.CAPABILITYLIST}, links), last_modified


def public_sets():
    """``[(set, last_modified)]``: enabled sets that publish at least one capability document,
    in Source Description order, with the time their configuration or documents last changed."""
    found = []
    for resource_set in ResourceSet.objects.filter(enabled=True):
        published = published_capabilities(resource_set)
        if published:
            found.append((resource_set, max([resource_set.modified, *(changed for _c, changed in published if changed)])))
    return found


def source_description():
    """``(bytes, last_modified)`` of the Source Description."""
    writer = DocumentWriter()
    # Every set's configuration counts, disabled ones too: disabling a set changes this document.
    last_modified = ResourceSet.objects.aggregate(latest=Max("modified"))["latest"]
    for resource_set, changed in public_sets():
        links = [{"rel": "describedby", "href": resource_set.describedby}] if resource_set.describedby else ()
        writer.add(url_element(uris.capability_list_uri(resource_set), md={"capability": capabilities.CAPABILITYLIST}, links=links))
        last_modified = max(filter(None, [last_modified, changed]))
    links = []
    if app_settings.SOURCE_DESCRIBEDBY:
        links.append({"rel": "describedby", "href": app_settings.SOURCE_DESCRIBEDBY})
    return _render(writer, {"capability": capabilities.DESCRIPTION}, links), last_modified
