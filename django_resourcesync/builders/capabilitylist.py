"""Source Description (spec section 8) and Capability Lists (section 9).

Both are small and follow the sets' configuration, so they are rendered from the database on
request rather than stored: a set disabled in the admin leaves the Source Description at once.
"""

import io

from .. import capabilities, uris
from ..conf import app_settings
from ..models import Build, ResourceSet
from ..xml.writer import DocumentWriter, url_element

# Which document each capability of a Capability List points at.
DOCUMENT_NAMES = {capabilities.RESOURCELIST: "resourcelist.xml"}


def published_capabilities(resource_set):
    """``[(capability, build)]`` for each of the set's capabilities that has a published build."""
    builds = {
        build.capability: build
        for build in Build.objects.filter(resource_set=resource_set, status=Build.Status.PUBLISHED).order_by("pk")
    }
    order = [name for name, _label in capabilities.CAPABILITY_CHOICES]
    return [(name, builds[name]) for name in order if resource_set.has_capability(name) and name in builds]


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
    for capability, _build in published:
        writer.add(url_element(uris.document_uri(resource_set, DOCUMENT_NAMES[capability]), md={"capability": capability}))
    links = [{"rel": "up", "href": uris.source_description_uri()}]
    if resource_set.describedby:
        links.append({"rel": "describedby", "href": resource_set.describedby})
    last_modified = max([resource_set.modified] + [build.finished for _c, build in published if build.finished])
    return _render(writer, {"capability": capabilities.CAPABILITYLIST}, links), last_modified


def public_sets():
    """``[(set, last_modified)]``: enabled sets that publish at least one capability document,
    in Source Description order, with the time their configuration or documents last changed."""
    published = Build.objects.filter(status=Build.Status.PUBLISHED).values_list("resource_set_id", "capability", "finished")
    by_set = {}
    for set_id, capability, finished in published:
        by_set.setdefault(set_id, []).append((capability, finished))
    found = []
    for resource_set in ResourceSet.objects.filter(enabled=True, pk__in=by_set):
        finished = [when for capability, when in by_set[resource_set.pk] if resource_set.has_capability(capability) and when]
        if finished:
            found.append((resource_set, max([resource_set.modified, *finished])))
    return found


def source_description():
    """``(bytes, last_modified)`` of the Source Description."""
    writer = DocumentWriter()
    last_modified = None
    for resource_set, changed in public_sets():
        links = [{"rel": "describedby", "href": resource_set.describedby}] if resource_set.describedby else ()
        writer.add(url_element(uris.capability_list_uri(resource_set), md={"capability": capabilities.CAPABILITYLIST}, links=links))
        last_modified = max(filter(None, [last_modified, changed]))
    links = []
    if app_settings.SOURCE_DESCRIBEDBY:
        links.append({"rel": "describedby", "href": app_settings.SOURCE_DESCRIBEDBY})
    return _render(writer, {"capability": capabilities.DESCRIPTION}, links), last_modified
