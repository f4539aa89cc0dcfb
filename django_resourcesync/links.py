"""Links to related resources (spec section 14), for a source's ``links()``.

Each helper returns the ``rs:ln`` dict of one relation, checked now: a link a Destination could
not use (a ``patch`` without its media type, a ``memento`` without its datetime, a priority out of
range) raises :class:`InvalidLink` with what is wrong, where the source is written, rather than
leave the entry without it later. ::

    from django_resourcesync import links

    def links(self, obj):
        return [
            links.describedby(obj.get_metadata_url(), type="application/xml"),
            links.duplicate("https://mirror.example.org/" + obj.path, pri=1),
        ]

Paths are made absolute with ``RESOURCESYNC["BASE_URL"]`` when the entry is written.
"""

import datetime
import re

from .entries import MEDIA_TYPE_RE, REL_RE
from .uris import URI_SCHEME_RE

#: The relation type of a description of the changes a resource underwent (section 14.4).
PATCH = "http://www.openarchives.org/rs/terms/patch"

_HASH_RE = re.compile(r"^(md5:[0-9a-fA-F]{32}|sha-1:[0-9a-fA-F]{40}|sha-256:[0-9a-fA-F]{64})( \S+)*$")
_ATTRIBUTES = ("type", "length", "hash", "modified", "pri", "encoding", "profile", "path")


class InvalidLink(ValueError):
    """A link that the schema, or section 14, does not allow."""


def problems(link):
    """What is wrong with the ``rs:ln`` dict ``link``, in sentences (empty when nothing is)."""
    found = []
    rel, href = link.get("rel"), link.get("href")
    if not rel:
        found.append("it has no rel")
    elif not (REL_RE.match(str(rel)) or URI_SCHEME_RE.match(str(rel))):
        found.append(f"rel {rel!r} is neither a registered relation type (lowercase) nor a URI")
    if not href:
        found.append("it has no href")
    unknown = sorted(set(link) - {"rel", "href", *_ATTRIBUTES})
    if unknown:
        found.append(f"unknown attribute(s) {', '.join(unknown)}; known: {', '.join(_ATTRIBUTES)}")
    value = link.get("type")
    if value is not None and not MEDIA_TYPE_RE.match(str(value).split(";", 1)[0].strip()):
        found.append(f"type {value!r} is not a media type the schema accepts (type/subtype)")
    value = link.get("length")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        found.append(f"length {value!r} is not a non-negative integer")
    value = link.get("pri")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 999_999):
        found.append(f"pri {value!r} is not an integer from 1 to 999999")
    value = link.get("hash")
    if value is not None and not _HASH_RE.match(str(value)):
        found.append(f"hash {value!r} is not 'md5:<hex>', 'sha-1:<hex>' or 'sha-256:<hex>' (space-separated)")
    value = link.get("modified")
    if value is not None and not (isinstance(value, datetime.datetime) and value.tzinfo is not None):
        found.append(f"modified {value!r} is not an aware datetime")
    value = link.get("path")
    if value is not None and not (str(value).startswith("/") and not str(value).endswith("/")):
        found.append(f"path {value!r} must start with '/' and name a file (a package member)")
    if rel == PATCH and not link.get("type"):
        found.append("a patch link must give the media type of the change description (section 14.4)")
    if rel == "memento" and not link.get("modified"):
        found.append("a memento link must give the datetime of the version (modified, section 14.6)")
    return found


def link(rel, href, **attributes):
    """An ``rs:ln`` dict of any relation; attributes left ``None`` are left out."""
    made = {"rel": rel, "href": str(href) if href is not None else href}
    made.update({key: value for key, value in attributes.items() if value is not None})
    found = problems(made)
    if found:
        raise InvalidLink(f"rs:ln rel={rel!r} href={href!r}: " + "; ".join(found))
    return made


def describedby(href, **attributes):
    """Metadata about the resource (section 14.5); ``profile=`` names its kind."""
    return link("describedby", href, **attributes)


def describes(href, **attributes):
    """From metadata to the resource it describes (section 14.5)."""
    return link("describes", href, **attributes)


def profile(href):
    """The kind of metadata an entry is (a namespace, a schema), RFC 6906 (section 14.5)."""
    return link("profile", href)


def duplicate(href, *, pri=None, **attributes):
    """A mirror of the resource, ``pri`` 1 (first choice) to 999999 (section 14.2)."""
    return link("duplicate", href, pri=pri, **attributes)


def alternate(href, *, type=None, **attributes):
    """Another representation of the resource; its ``type`` is recommended (section 14.3)."""
    return link("alternate", href, type=type, **attributes)


def canonical(href, **attributes):
    """The generic URI of the specific representation listed (section 14.3)."""
    return link("canonical", href, **attributes)


def collection(href, **attributes):
    """A collection the resource belongs to, such as an ORE Aggregation (section 14.7)."""
    return link("collection", href, **attributes)


def via(href, **attributes):
    """The resource at the original Source that this one republishes (section 14.8)."""
    return link("via", href, **attributes)


def memento(href, *, modified, **attributes):
    """The version of the resource as of ``modified`` (an aware datetime) (section 14.6)."""
    return link("memento", href, modified=modified, **attributes)


def timegate(href):
    """The Memento TimeGate of the resource; no other attribute (section 14.6)."""
    return link("timegate", href)


def timemap(href, **attributes):
    """The Memento TimeMap of the resource (section 14.6)."""
    return link("timemap", href, **attributes)


def patch(href, *, type, path=None, **attributes):
    """A description of the changes from the previous version, in the media type ``type``
    (section 14.4). ``path`` names its place in a Change Dump package; the app packs no change
    descriptions, so it leaves ``path`` out of the entries it writes."""
    return link(PATCH, href, type=type, path=path, **attributes)
