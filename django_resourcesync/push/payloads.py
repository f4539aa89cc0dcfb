"""The payloads of notifications: ``<urlset>`` documents (framework notification 1.0, section 3;
the change notification of the 2013 paper, whose entries are those of a Change List)."""

import io

from .. import capabilities, heads
from ..xml.writer import DocumentWriter, url_element, w3c_datetime


def render(resource_set, capability, entries, *, up=True):
    """The payload of a notification on one of the set's channels: ``entries`` (``<url>``
    elements, oldest first) under ``rs:md capability`` and ``rs:ln rel="up"`` to the set's
    Capability List (left out when that list is gone). No stylesheet: a payload is for the
    subscriber's software, not for a browser."""
    writer = DocumentWriter()
    for entry in entries:
        writer.add(entry)
    out = io.BytesIO()
    writer.finish(out, md={"capability": capability}, links=[heads.up(resource_set)] if up else [], stylesheet=False)
    return out.getvalue()


def empty(resource_set, capability):
    """What a topic answers before its first notification."""
    return render(resource_set, capability, [])


def framework_entry(loc, change, capability, datetime=None, index=None):
    """One change of a document in a framework notification; ``index``: the index it is under."""
    md = {"change": change, "datetime": w3c_datetime(datetime) if datetime else None, "capability": capability}
    return url_element(loc, md=md, links=[{"rel": "index", "href": index}] if index else ())


#: What framework notifications tell of each kind of document (section 2.1, Table 2): a new
#: Resource List or Resource Dump is a new snapshot (``created``); a Change List or Change Dump
#: grows (``updated``); the Capability List and the Source Description may also go.
CHANGE_TYPES = {
    capabilities.RESOURCELIST: {"created", "deleted"},
    capabilities.RESOURCEDUMP: {"created"},
    capabilities.CHANGELIST: {"created", "updated"},
    capabilities.CHANGEDUMP: {"created", "updated"},
    capabilities.CAPABILITYLIST: {"created", "updated", "deleted"},
    capabilities.DESCRIPTION: {"created", "updated", "deleted"},
}

#: Capabilities whose every new version is a new document (a snapshot): ``created``, not ``updated``.
SNAPSHOTS = {capabilities.RESOURCELIST, capabilities.RESOURCEDUMP}


def change_type(capability, before, now):
    """How a document announced as ``before`` (``None``: never) and now ``now`` (``None``:
    gone) changed, as Table 2 allows it to be told; ``None`` if it is not told."""
    if before is None and now is None:
        return None
    if before is None:
        change = "created"
    elif now is None:
        change = "deleted"
    elif before.get("marker") == now.get("marker"):
        return None
    elif capability in SNAPSHOTS or before.get("loc") != now.get("loc"):
        change = "created"  # a new snapshot, or a new document (the next Change List)
    else:
        change = "updated"
    return change if change in CHANGE_TYPES.get(capability, ()) else None
