"""Streaming writer for ResourceSync documents.

Documents are written entry by entry into a binary file object, so memory stays flat whatever the
size of the list. Entries are formatted as text rather than built as lxml trees: a million
``<url>`` elements format in about a second this way, against more than ten through lxml's
incremental writer. Every value passes through :func:`attr` or :func:`text`, which escape markup
and drop the characters XML 1.0 cannot carry, so no input can make a document ill-formed; the
tests parse and schema-validate what this module writes.
"""

import datetime
import hashlib
import itertools
import re
import tempfile

from django.urls import reverse

from ..conf import app_settings
from . import RS_NS, SITEMAP_NS

# Characters XML 1.0 cannot carry at all (even escaped).
_ILLEGAL_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")
_ATTR_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "\t": "&#9;", "\n": "&#10;", "\r": "&#13;"})
_TEXT_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "\r": "&#13;"})
_NEEDS_WORK = re.compile("[&<>\"\t\n\r\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")

# Order of rs:md attributes in what we write (any order is valid; a fixed one reads better).
MD_ATTRIBUTES = (
    "capability", "change", "datetime", "at", "completed", "from", "until", "hash", "length", "type", "path", "encoding"
)
LN_ATTRIBUTES = ("rel", "href", "type", "length", "hash", "modified", "pri", "encoding", "profile", "path")
XML_DECLARATION = b'<?xml version="1.0" encoding="UTF-8"?>\n'


def w3c_datetime(value):
    """A full W3C datetime in UTC ending in ``Z``; fractions of a second only when present."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if not isinstance(value, datetime.datetime):
        raise TypeError(f"Expected a datetime, got {value!r}")
    if value.tzinfo is None:
        raise ValueError(f"Naive datetime {value!r}: ResourceSync datetimes must be in UTC")
    # isoformat() writes the year in four digits, as xs:dateTime requires, where strftime's %Y
    # leaves a year before 1000 as the C library writes it ("999"); it is quicker too.
    return value.astimezone(datetime.timezone.utc).replace(tzinfo=None).isoformat() + "Z"


def _clean(value):
    return _ILLEGAL_XML.sub("", value)


def attr(value):
    """Escape a value for use inside a double-quoted attribute."""
    if type(value) is int:  # a length: nothing to escape
        return str(value)
    value = str(value)
    if _NEEDS_WORK.search(value):
        value = _clean(value).translate(_ATTR_ESCAPES)
    return value


def text(value):
    """Escape a value for use as element content."""
    value = str(value)
    if _NEEDS_WORK.search(value):
        value = _clean(value).translate(_TEXT_ESCAPES)
    return value


def _attributes(values, order):
    out = []
    for name in order:
        value = values.get(name)
        if value is not None:
            out.append(f' {name}="{attr(value)}"')
    return "".join(out)


def md_element(values):
    """``<rs:md .../>`` from a dict of attribute values (``None`` values are left out)."""
    return f"<rs:md{_attributes(values, MD_ATTRIBUTES)}/>"


def ln_element(link):
    """``<rs:ln .../>`` from a dict with at least ``rel`` and ``href``."""
    return f"<rs:ln{_attributes(link, LN_ATTRIBUTES)}/>"


def hash_value(md5, sha256):
    """The ``hash`` attribute: whitespace-separated ``algorithm:hex`` tokens."""
    parts = []
    if md5:
        parts.append(f"md5:{md5}")
    if sha256:
        parts.append(f"sha-256:{sha256}")
    return " ".join(parts) or None


def stylesheet_href():
    """The ``href`` of the stylesheet ``RESOURCESYNC["STYLESHEET"]`` names, or ``None``: the app's
    own (``True``) by its path on the site, which the browser resolves against the document's
    URL, so that the stylesheet comes from the origin that served the document (a browser
    applies no other); a string as it is. Any other value names none (check resourcesync.E027
    says why)."""
    value = app_settings.STYLESHEET
    if value is True:
        return reverse("resourcesync:stylesheet")
    return value if isinstance(value, str) and value.strip() else None


def stylesheet_instruction(href):
    """The ``xml-stylesheet`` processing instruction naming ``href`` (escaped as an attribute
    is: no ``?>`` can end it early)."""
    return f'<?xml-stylesheet type="text/xsl" href="{attr(href)}"?>\n'


def url_element(loc, lastmod=None, changefreq=None, md=None, links=(), tag="url"):
    """One ``<url>`` (or ``<sitemap>``) entry, as text."""
    out = [f"<{tag}><loc>{text(loc)}</loc>"]
    if lastmod is not None:
        out.append(f"<lastmod>{w3c_datetime(lastmod)}</lastmod>")
    if changefreq:
        out.append(f"<changefreq>{changefreq}</changefreq>")
    if md:
        md = {key: value for key, value in md.items() if value is not None}
        if md:
            out.append(md_element(md))
    out.extend(ln_element(link) for link in links)
    out.append(f"</{tag}>\n")
    return "".join(out)


def resource_entry(
    uri, lastmod=None, changefreq=None, md5="", sha256="", length=None, media_type=None, links=(), encoding=None
):
    """The ``<url>`` entry of a resource in a Resource List."""
    return url_element(
        uri,
        lastmod=lastmod,
        changefreq=changefreq or None,
        md={"hash": hash_value(md5, sha256), "length": length, "type": media_type or None, "encoding": encoding or None},
        links=links or (),
    )


def change_entry(
    uri, change, datetime, lastmod=None, md5="", sha256="", length=None, media_type=None, links=(), encoding=None
):
    """The ``<url>`` entry of one change in a Change List (spec section 12.1).

    A deletion carries the URI, the change and its datetime only: nothing about what was removed.
    """
    if change == "deleted":  # the commonest entry of a bulk change: written directly
        return f'<url><loc>{text(uri)}</loc><rs:md change="deleted" datetime="{w3c_datetime(datetime)}"/></url>\n'
    return url_element(
        uri,
        lastmod=lastmod,
        md={
            "change": change,
            "datetime": w3c_datetime(datetime),
            "hash": hash_value(md5, sha256),
            "length": length,
            "type": media_type or None,
            "encoding": encoding or None,
        },
        links=links or (),
    )


class DocumentWriter:
    """Write one ``<urlset>`` or ``<sitemapindex>`` document.

    Entries are added one at a time (:meth:`add`) and spooled to a temporary file; :meth:`finish`
    then writes the whole document into a binary file object, with the document's own ``rs:md``
    (capability, at, completed, from, until) and ``rs:ln`` elements (up, index, describedby), which
    may only be known once the last entry is in (``completed``, say). ``size``, ``count`` and
    ``sha256`` describe the finished document.
    """

    # Room kept for the root element, rs:md and rs:ln when checking the size limit.
    HEAD_ROOM = 4096

    def __init__(self, *, root="urlset"):
        if root not in ("urlset", "sitemapindex"):
            raise ValueError(root)
        self.root = root
        self.count = 0
        self.size = 0
        self.sha256 = None
        self._body = tempfile.TemporaryFile()
        self._pending = []
        self._pending_size = 0
        self._body_size = 0

    def fits(self, entry_size, max_entries, max_bytes, count=1):
        """Whether one more entry of ``entry_size`` bytes (or ``count`` entries of that many
        bytes together) keeps the document within limits."""
        return self.count + count <= max_entries and self.HEAD_ROOM + self._body_size + entry_size <= max_bytes

    def add(self, entry, count=1):
        """Append one entry (text from :func:`url_element`, or bytes), or ``count`` entries
        joined in one."""
        if isinstance(entry, str):
            entry = entry.encode("utf-8")
        self._pending.append(entry)
        self._pending_size += len(entry)
        self._body_size += len(entry)
        self.count += count
        if self._pending_size >= 256 * 1024:
            self._spill()

    def _spill(self):
        self._body.write(b"".join(self._pending))
        self._pending = []
        self._pending_size = 0

    def finish(self, fileobj, *, md, links=(), stylesheet=True, copy=None):
        """Write the document into ``fileobj``; returns ``self``.

        Every document the app writes goes through here, so here its stylesheet is named: with
        ``stylesheet`` true (the default), the one of ``RESOURCESYNC["STYLESHEET"]``, if any, in
        an ``xml-stylesheet`` instruction after the XML declaration; a string names that one
        instead; false, none (a notification's payload, which no browser opens; a manifest,
        which is packed too). ``copy``, a binary file, also receives the document, byte for
        byte (a manifest: the one packed, and the one published beside its package).
        """
        self._spill()
        href = stylesheet_href() if stylesheet is True else stylesheet or None
        instruction = stylesheet_instruction(href).encode("utf-8") if href else b""
        head = [f'<{self.root} xmlns="{SITEMAP_NS}" xmlns:rs="{RS_NS}">\n', md_element(md), "\n"]
        for link in links:
            head += [ln_element(link), "\n"]
        digest = hashlib.sha256()
        size = 0
        self._body.seek(0)
        for chunk in itertools.chain(
            [XML_DECLARATION, instruction, "".join(head).encode("utf-8")],
            iter(lambda: self._body.read(1024 * 1024), b""),
            [f"</{self.root}>\n".encode("utf-8")],
        ):
            digest.update(chunk)
            fileobj.write(chunk)
            size += len(chunk)
            if copy is not None:
                copy.write(chunk)
        self._body.close()
        self.size, self.sha256 = size, digest.hexdigest()
        return self

    def discard(self):
        self._body.close()


_ENTRY_END = b"</url>\n"
_ENTRY_START = b"<url><loc>"


def without_entries(chunks, locs, out):
    """Copy a document this module wrote (``chunks``: its bytes, in any pieces) into ``out``,
    leaving out the ``<url>`` entries whose ``<loc>`` is one of ``locs``; returns ``(kept,
    cut)``: the entries left in, and those left out (their bytes, in document order).

    No parser is needed, and the copy is byte for byte: every value is escaped as it is written,
    so ``<url><loc>`` and ``</url>`` are tags wherever they occur, and each entry ends with its
    ``</url>`` and a line break."""
    targets = {text(loc).encode("utf-8") for loc in locs}
    kept, cut = 0, []
    pending = b""
    for chunk in chunks:
        pending += chunk
        done = 0
        while (end := pending.find(_ENTRY_END, done)) >= 0:
            end += len(_ENTRY_END)
            start = pending.find(_ENTRY_START, done, end)
            if start < 0:  # not an entry (a sitemap index's, say): as it is
                out.write(pending[done:end])
            else:
                out.write(pending[done:start])
                entry = pending[start:end]
                if entry[len(_ENTRY_START) : entry.index(b"</loc>")] in targets:
                    cut.append(entry)
                else:
                    out.write(entry)
                    kept += 1
            done = end
        pending = pending[done:]
    out.write(pending)
    return kept, cut
