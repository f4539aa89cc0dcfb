"""What an entry of a list says about a resource: its representation (hashes, length, media
type), its ``rs:ln`` links cleaned to what the schema accepts."""

import hashlib
import logging
import re
from dataclasses import dataclass, field

from .conf import app_settings
from .exceptions import UnpublishableResource
from .uris import MAX_URI_LENGTH, URI_SCHEME_RE, absolute_uri, encode_uri
from .xml.writer import w3c_datetime

logger = logging.getLogger(__name__)

# The ResourceSync schema types rs:md/@type and rs:ln/@type with the pattern [\w-]+/[\w-]+, in
# which \w leaves out punctuation such as "." and "_". Media types outside it are not published.
MEDIA_TYPE_RE = re.compile(r"^[A-Za-z0-9+-]+/[A-Za-z0-9+-]+$")
REL_RE = re.compile(r"^[a-z][a-z0-9.-]*$")
LINK_ATTRIBUTES = ("rel", "href", "type", "length", "hash", "modified", "pri", "encoding", "profile", "path")
CHANGEFREQS = {"always", "hourly", "daily", "weekly", "monthly", "yearly", "never"}


def normalise_media_type(value):
    """``text/html; charset=utf-8`` -> ``text/html``; ``None`` for what the schema cannot carry."""
    if not value:
        return None
    value = str(value).split(";", 1)[0].strip().lower()
    return value if MEDIA_TYPE_RE.match(value) else None


@dataclass(frozen=True)
class Representation:
    """What a resource's bytes are: digests, length and media type."""

    md5: str
    sha256: str
    length: int
    media_type: str | None = None

    @classmethod
    def of_chunks(cls, chunks, media_type=None):
        md5, sha256, length = hashlib.md5(), hashlib.sha256(), 0
        for chunk in chunks:
            md5.update(chunk)
            sha256.update(chunk)
            length += len(chunk)
        return cls(md5.hexdigest(), sha256.hexdigest(), length, normalise_media_type(media_type))


@dataclass
class Entry:
    """Everything a Resource List says about one resource."""

    uri: str
    lastmod: object = None  # aware datetime or None
    md5: str = ""
    sha256: str = ""
    length: int | None = None
    media_type: str | None = None
    changefreq: str | None = None
    links: list = field(default_factory=list)
    encoding: str | None = None


_schemes = [None, frozenset()]  # [the setting's value, its schemes in lowercase]


def _allowed_schemes():
    """``RESOURCESYNC["LINK_SCHEMES"]`` in lowercase, made again only when the setting is
    another value (every link of every entry asks)."""
    given = app_settings.LINK_SCHEMES
    if _schemes[0] is not given:
        _schemes[:] = [given, frozenset(str(allowed).lower() for allowed in given)]
    return _schemes[1]


def _link_scheme_allowed(uri):
    """Whether a link may point at ``uri`` (encoded, so its scheme is lowercase): its scheme is
    one of ``RESOURCESYNC["LINK_SCHEMES"]``. A Destination follows links; one to a
    ``javascript:`` or ``file:`` URI, say, is not something a Source should hand it."""
    scheme = uri.partition(":")[0] if URI_SCHEME_RE.match(uri) else ""
    if scheme in _allowed_schemes():
        return True
    logger.debug("Link to %.80s left out: its scheme is not in RESOURCESYNC['LINK_SCHEMES'].", uri)
    return False


def clean_link(link):
    """Keep the attributes of an ``rs:ln`` dict that the schema accepts; ``None`` if unusable."""
    rel, href = link.get("rel"), link.get("href")
    if not rel or not href:
        return None
    rel = str(rel)
    if not REL_RE.match(rel) and not URI_SCHEME_RE.match(rel):
        return None
    try:
        cleaned = {"rel": rel, "href": absolute_uri(href)}
    except UnpublishableResource:
        return None
    if not _link_scheme_allowed(cleaned["href"]):
        return None
    for key in LINK_ATTRIBUTES[2:]:
        value = link.get(key)
        if value is None or value == "":
            continue
        if key == "type":
            value = normalise_media_type(value)
        elif key in ("length", "pri"):
            try:
                value = int(value)
            except (TypeError, ValueError):
                value = None
            if value is not None and (value < 0 or (key == "pri" and not 1 <= value <= 999_999)):
                value = None
        elif key == "modified":
            value = w3c_datetime(value)
        elif key == "profile":
            value = encode_uri(str(value))
            value = value if _link_scheme_allowed(value) and len(value) <= MAX_URI_LENGTH else None
        elif key == "path":
            # A package member's path (section 14.4, in Change Dump manifests): the app packs no
            # change descriptions, so no entry it writes has that member to point at.
            value = None
        else:
            value = str(value)
        if value is not None:
            cleaned[key] = value
    return cleaned


def clean_links(links):
    """The usable ones of ``links``, cleaned by :func:`clean_link`."""
    return [link for link in map(clean_link, links) if link]
