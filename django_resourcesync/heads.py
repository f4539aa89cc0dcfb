"""The head of every document: its ``rs:md`` (capability and datetimes) and ``rs:ln`` links.

One place says what each kind of document links to (spec sections 8-13): the Source Description
to nothing, a Capability List ``up`` to the Source Description, every other document ``up`` to
its set's Capability List, and a document listed in an index also to that index.
"""

from . import capabilities, uris
from .xml.writer import w3c_datetime


def up(resource_set):
    return {"rel": "up", "href": uris.capability_list_uri(resource_set)}


def index(resource_set, capability):
    """The link of a document listed in a capability's index (``changelist.xml``, say)."""
    return {"rel": "index", "href": uris.document_uri(resource_set, capabilities.get(capability).document)}


def head(resource_set, capability, *, at=None, completed=None, from_=None, until=None, indexed_by=None):
    """``(md, links)`` of a document of ``capability`` (a list, an index, a dump, a manifest) of
    the set; ``indexed_by``: the capability whose index lists it."""
    md = {"capability": capability}
    for key, value in (("at", at), ("completed", completed), ("from", from_), ("until", until)):
        if value is not None:
            md[key] = w3c_datetime(value)
    links = [up(resource_set)]
    if indexed_by is not None:
        links.append(index(resource_set, indexed_by))
    return md, links


def capability_list_head(describedby=()):
    return {"capability": capabilities.CAPABILITYLIST}, [{"rel": "up", "href": uris.source_description_uri()}, *describedby]


def source_description_head(describedby=()):
    return {"capability": capabilities.DESCRIPTION}, list(describedby)


def source_description_index():
    """The link of a part of a Source Description Index to the index."""
    return {"rel": "index", "href": uris.source_description_uri()}
