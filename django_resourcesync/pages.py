"""Documents as pages for people (``RESOURCESYNC["HTML_PAGES"]``, on by default).

A browser asks for HTML before XML (``Accept: text/html,…,application/xml;q=0.9,*/*;q=0.8``).
Such a request for a document a person may open (the Source Description, a Capability List, a
list, a dump, an archive, a manifest copy) is answered with a page made on the server from the
document's bytes: what kind of document it is, its dates and links, and a table of its entries.
Every other request, ``Accept: */*``, an XML type or no ``Accept`` at all (Destinations, ``curl``,
``resync``), gets the XML as it was published. ``?format=xml`` asks for the XML whatever the
``Accept``; ``?format=html`` for the page. The answer varies by ``Accept``; the page has an ETag of
its own (the document's, with a suffix that changes with the page's template), so no cache hands
one for the other.

The document is read as a stream (lxml's iterparse, over the stored bytes as they come), each entry
dropped once it is read: a Resource List of 50,000 entries never becomes a tree in memory. The
page shows the first :data:`SHOWN` entries and says how many more the XML has.
"""

import datetime
import hashlib
import re

from django.template.loader import get_template
from lxml import etree

from .conf import app_settings
from .xml import RS_NS, SITEMAP_NS

CONTENT_TYPE = "text/html; charset=utf-8"
TEMPLATE = "resourcesync/document.html"
STYLE = "resourcesync/document.css"
#: Entries a page shows; the rest are counted, and left to the XML.
SHOWN = 1000
#: What the page's ETag is made of besides the document's; changed when the page would read differently.
PAGE_FORMAT = "1"

_URL, _SITEMAP = f"{{{SITEMAP_NS}}}url", f"{{{SITEMAP_NS}}}sitemap"
_ROOTS = {f"{{{SITEMAP_NS}}}urlset": False, f"{{{SITEMAP_NS}}}sitemapindex": True}
_LOC, _LASTMOD = f"{{{SITEMAP_NS}}}loc", f"{{{SITEMAP_NS}}}lastmod"
_MD, _LN = f"{{{RS_NS}}}md", f"{{{RS_NS}}}ln"

# -- negotiation -----------------------------------------------------------------------------

_HTML_TYPES = ("text/html", "application/xhtml+xml")
_XML_TYPES = ("application/xml", "text/xml")
_QVALUE = re.compile(r"0(\.\d{0,3})?|1(\.0{0,3})?")


def _ranges(accept):
    """``[(media range, q)]`` of an ``Accept`` header; a range with a q that is no qvalue is left out."""
    found = []
    for part in accept.split(","):
        media, *parameters = part.split(";")
        media = media.strip().lower()
        if media.count("/") != 1:
            continue
        q = "1"
        for parameter in parameters:
            name, _, value = parameter.partition("=")
            if name.strip().lower() == "q":
                q = value.strip()
        if _QVALUE.fullmatch(q):
            found.append((media, float(q)))
    return found


def _quality(ranges, media_type):
    """The q of ``media_type``: that of the most specific range matching it (RFC 9110, 12.5.1)."""
    exact, family = media_type, media_type.split("/")[0] + "/*"
    best, quality = -1, 0.0
    for media, q in ranges:
        specificity = 2 if media == exact else 1 if media == family else 0 if media == "*/*" else -1
        if specificity > best:
            best, quality = specificity, q
    return quality


def wanted(request):
    """Whether ``request`` is answered with the page: ``HTML_PAGES`` on, and ``?format=html``, or
    an ``Accept`` that names HTML and ranks it above XML (as browsers' do). ``*/*`` alone, an XML
    type, an HTML type no higher than XML, no ``Accept`` or ``?format=xml``: the XML."""
    if not app_settings.HTML_PAGES:
        return False
    chosen = request.GET.get("format")
    if chosen in ("xml", "html"):
        return chosen == "html"
    ranges = _ranges(request.headers.get("Accept", ""))
    if not any(media in _HTML_TYPES for media, _q in ranges):
        return False
    html = max(_quality(ranges, media_type) for media_type in _HTML_TYPES)
    return html > max(_quality(ranges, media_type) for media_type in _XML_TYPES)


def etag(document_etag):
    """The page's ETag: the document's (whose bytes it is made from) and the page's own make."""
    made = hashlib.sha256(PAGE_FORMAT.encode())
    for name in (TEMPLATE, STYLE):
        made.update(get_template(name).template.source.encode())
    made.update(str(SHOWN).encode())
    return f"{document_etag}-html-{made.hexdigest()[:12]}"


# -- reading the document ------------------------------------------------------------------


class Read:
    """What a page shows of a document: whether it is an index, its own metadata and links, its
    first entries and how many it has."""

    def __init__(self):
        self.index = False
        self.md, self.links, self.rows = {}, [], []
        self.count = 0

    def head(self, root):
        """Take the root's ``rs:md`` and ``rs:ln`` read so far."""
        for child in root:
            if child.tag == _MD:
                self.md.update(child.attrib)
            elif child.tag == _LN:
                self.links.append(_link(child.get("rel", ""), child.get("href", ""), child.get("type")))


class _Stream:
    """A file object over the chunks of bytes of a document (as storage or a live document gives
    them): what lxml's iterparse reads from, a piece at a time."""

    def __init__(self, chunks):
        self._chunks = iter(chunks)
        self._chunk, self._at = b"", 0

    def read(self, size=-1):
        if size is None or size < 0:
            rest = b"".join([self._chunk[self._at:], *self._chunks])
            self._chunk, self._at = b"", 0
            return rest
        while self._at >= len(self._chunk):
            chunk = next(self._chunks, None)
            if chunk is None:
                return b""
            self._chunk, self._at = chunk, 0
        piece = self._chunk[self._at:self._at + size]
        self._at += len(piece)
        return piece


def read(chunks, shown=None):
    """The :class:`Read` of the sitemap document whose bytes ``chunks`` yields, with its first
    ``shown`` entries (:data:`SHOWN`); ``None`` if it is not one (another root, not well-formed)."""
    shown = SHOWN if shown is None else shown
    found, root = Read(), None
    events = etree.iterparse(
        _Stream(chunks), events=("start", "end"), tag=(*_ROOTS, _URL, _SITEMAP), resolve_entities=False,
        no_network=True, load_dtd=False,
    )
    try:
        for event, element in events:
            if event == "start":
                root = element if root is None else root
                continue
            if element is root or element.getparent() is not root:
                continue
            if found.count == 0:
                found.head(root)
            found.count += 1
            if found.count <= shown:
                found.rows.append(_row(found.count, element))
            # Nothing read stays in memory: the entry and whatever came before it.
            element.clear(keep_tail=True)
            while element.getprevious() is not None:
                del root[0]
    except etree.XMLSyntaxError:
        return None
    if root is None or root is not events.root:
        return None
    found.index = _ROOTS[root.tag]
    found.head(root)  # what was after the last entry, or the whole head of a document without entries
    return found


def _words(values, order):
    return [(name, values[name]) for name in order if values.get(name)]


def _row(number, entry):
    md = entry.find(_MD)
    md = {} if md is None else dict(md.attrib)
    loc = " ".join((entry.findtext(_LOC) or "").split())
    lastmod = entry.findtext(_LASTMOD)
    change = md.get("change", "")
    return {
        "n": number,
        "loc": _link("", loc, None),
        "capability": kind(md["capability"]) if md.get("capability") else "",
        "capability_name": md.get("capability", ""),
        "change": change,
        "change_class": change if change in ("created", "updated", "deleted") else "",
        "datetime": _when(md["datetime"], utc="") if md.get("datetime") else None,
        "lastmod": _when(lastmod, utc="") if lastmod else None,
        "span": [(name, _when(value, utc="")["shown"]) for name, value in _words(md, ("at", "completed", "from", "until"))],
        "length": _size(md["length"]) if md.get("length") else None,
        "type": md.get("type", ""),
        "hash": _hashes(md["hash"]) if md.get("hash") else None,
        "path": md.get("path", ""),
        "links": [_link(ln.get("rel", ""), ln.get("href", ""), ln.get("type")) for ln in entry.iterfind(_LN)],
    }


# -- values as people read them -------------------------------------------------------------

_WEB = re.compile(r"https?://", re.IGNORECASE)


def _link(rel, href, media_type):
    """A link: ``url`` is its address where it is an http(s) one, else ``None`` (a ``javascript:``
    or other URI is shown as text, never made a link)."""
    href = href.strip()
    return {"rel": rel, "href": href, "url": href if _WEB.match(href) else None, "type": media_type or ""}


def _when(value, utc=" UTC"):
    """``{"shown", "written"}``: a W3C datetime as ``2024-05-01 12:34:56`` in UTC (``utc`` after
    it), whatever offset it was written with; a date, or what cannot be read, as written."""
    written = " ".join(value.split())
    shown = written
    if "T" in written:
        try:
            moment = datetime.datetime.fromisoformat(written)
        except ValueError:
            moment = None
        if moment is not None and moment.tzinfo is not None:
            moment = moment.astimezone(datetime.timezone.utc).replace(tzinfo=None)
            shown = moment.isoformat(sep=" ", timespec="seconds") + utc
        elif moment is not None:
            shown = moment.isoformat(sep=" ", timespec="seconds")
    return {"shown": shown, "written": written}


_UNITS = ("KB", "MB", "GB", "TB", "PB")


def _size(value):
    """``{"shown", "bytes"}``: a length in the largest unit it has a whole one of (1 KB = 1,024 bytes)."""
    try:
        number = int(value)
    except ValueError:
        return {"shown": value, "bytes": ""}
    exact = f"{number:,} byte{'' if number == 1 else 's'}"
    if number < 1024:
        return {"shown": exact, "bytes": ""}
    amount = number
    for unit in _UNITS:
        amount /= 1024
        if amount < 1024 or unit == _UNITS[-1]:
            return {"shown": f"{amount:,.1f} {unit}", "bytes": exact}


def _hashes(value):
    """``{"shown": ["md5 d41d8cd98f…", …], "written"}``: each hash by its first ten digits."""
    shown = []
    for token in value.split():
        algorithm, _, digits = token.partition(":")
        shown.append(f"{algorithm} {digits[:10]}{'…' if len(digits) > 10 else ''}")
    return {"shown": shown, "written": " ".join(value.split())}


KINDS = {
    "description": "Source Description", "capabilitylist": "Capability List", "resourcelist": "Resource List",
    "changelist": "Change List", "resourcedump": "Resource Dump", "changedump": "Change Dump",
    "resourcedump-manifest": "Resource Dump Manifest", "changedump-manifest": "Change Dump Manifest",
    "resourcelist-archive": "Resource List Archive", "resourcedump-archive": "Resource Dump Archive",
    "changelist-archive": "Change List Archive", "changedump-archive": "Change Dump Archive",
    "framework-notification": "Framework Notification", "change-notification": "Change Notification",
}


def kind(capability, index=False):
    """The kind of a document in words, from its capability (and its root: an index)."""
    return (KINDS.get(capability) or capability or "Sitemap") + (" Index" if index else "")


def about(capability, index):
    """What a document of that kind is, in a sentence."""
    if index and capability in ("changelist", "changedump"):
        return f"The parts of this set's {kind(capability)}, oldest first, each covering the period shown."
    if index:
        return "The parts of a document too long for one file, each listing some of its entries."
    if capability.endswith("-archive"):
        return "Earlier documents of this kind that the Source keeps, oldest first, the current one too."
    return {
        "description": "What this Source publishes: a Capability List for each set of resources it keeps in sync.",
        "capabilitylist": "What this set of resources offers: the documents a Destination reads to stay in sync with it.",
        "resourcelist": "The resources of this set as they were at the time below, with their sizes and hashes.",
        "changelist": "Changes to the resources of this set, oldest first: what was created, updated or deleted, and when.",
        "resourcedump": "ZIP packages holding the content of this set's resources, each with a manifest of what it holds.",
        "changedump": "ZIP packages holding the content of this set's changes, oldest first, each with a manifest.",
        "resourcedump-manifest": "What one package holds: for each file, the resource it is, its path in the package "
                                 "and its hashes.",
        "changedump-manifest": "What one package holds: for each file, the change it is, its path in the package and "
                               "its hashes.",
    }.get(capability, "A sitemap document.")


_DATES = {"at": "As of", "completed": "Completed", "from": "From", "until": "Until"}
_RELS = {"up": "Up", "index": "Index", "describedby": "Described by", "hub": "Hub", "self": "Self"}
#: The columns of the table, each shown when an entry on the page has a value for it.
_COLUMNS = ("capability", "change", "lastmod", "span", "length", "type", "hash", "path", "links")


def context(found):
    """What the template is given for the document ``found`` (a :class:`Read`)."""
    capability = found.md.get("capability", "")
    facts = [{"label": _DATES[name], "name": name, "value": _when(value)}
             for name, value in _words(found.md, ("at", "completed", "from", "until"))]
    still_open = capability in ("changelist", "changedump") and not found.index and "until" not in found.md
    for link in found.links:
        link["label"] = _RELS.get(link["rel"], "Link")
    return {
        "kind": kind(capability, found.index),
        "about": about(capability, found.index),
        "capability": capability,
        "index": found.index,
        "facts": facts,
        "still_open": still_open,
        "links": found.links,
        "rows": found.rows,
        "count": f"{found.count:,} entr{'y' if found.count == 1 else 'ies'}",
        "more": f"{found.count - len(found.rows):,}" if found.count > len(found.rows) else "",
        "shown": f"{len(found.rows):,}",
        "columns": {name: any(row[name] for row in found.rows) for name in _COLUMNS},
    }


def render(chunks):
    """The page (bytes) of the document whose bytes ``chunks`` yields; ``None`` if it is no
    sitemap document (it is then served as it is)."""
    found = read(chunks)
    if found is None:
        return None
    return get_template(TEMPLATE).render(context(found)).encode()
