"""Reading a ResourceSync document as a Destination does, and the spec's rules it must keep.

:func:`read` parses the bytes (no DTD, no entities, no network); :func:`problems` lists, one
sentence each, what breaks the rules of core 1.1 (sections 7 to 13 and Appendix A) and of the
framework notifications: the capability the document must carry, ``at`` against ``from`` and
``until`` by document kind, full UTC datetimes, links up and to the index, entries per document,
hashes and lengths as section 7 writes them, the order of changes, manifests' paths. The schema's
part (:func:`schema_problems`) validates against the official schemas: ``resourcesync.xsd``,
``sitemap.xsd`` and ``siteindex.xsd``, which the app ships (:data:`SCHEMAS`), or those of another
folder.

The app's own tests check every document it writes with these functions; the audit
(:mod:`django_resourcesync.audit`) checks a deployed Source, this one or another, with them.
"""

import re
from pathlib import Path

from lxml import etree

from .. import capabilities

SM = "http://www.sitemaps.org/schemas/sitemap/0.9"
RS = "http://www.openarchives.org/rs/terms/"

#: A complete datetime in UTC, as the spec recommends and the app writes (``2024-05-01T12:00:00Z``).
W3C_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
#: Any W3C datetime a sitemap's ``lastmod`` may have (a date alone, an offset).
W3C_ANY = re.compile(r"^\d{4}(-\d\d(-\d\d(T\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:\d\d))?)?)?$")
HASH_TOKEN = re.compile(r"^(md5|sha-1|sha-256):[0-9a-f]+$")
CHANGES = ("created", "updated", "deleted")

#: Every value of ``rs:md capability`` a document or an entry may carry.
NAMES = frozenset(
    [capabilities.DESCRIPTION, capabilities.CAPABILITYLIST, capabilities.RESOURCEDUMP_MANIFEST,
     capabilities.CHANGEDUMP_MANIFEST, *capabilities.BY_NAME]
)
#: Documents that are snapshots (``at``, ``completed``) and those that cover an interval (``from``, ``until``).
AT_DOCUMENTS = frozenset([capabilities.RESOURCELIST, capabilities.RESOURCEDUMP, capabilities.RESOURCEDUMP_MANIFEST])
FROM_DOCUMENTS = frozenset([capabilities.CHANGELIST, capabilities.CHANGEDUMP, capabilities.CHANGEDUMP_MANIFEST])
MANIFESTS = frozenset([capabilities.RESOURCEDUMP_MANIFEST, capabilities.CHANGEDUMP_MANIFEST])
#: The limits of one document (core 1.1 section 10.2, from the Sitemap protocol).
MAX_ENTRIES = 50_000
MAX_BYTES = 50 * 1024 * 1024

_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=True)


class Unreadable(ValueError):
    """Bytes that are no XML document."""


def read(body):
    """The root element of ``body``; :class:`Unreadable` if it is not well-formed XML."""
    try:
        return etree.fromstring(body, _PARSER)
    except etree.XMLSyntaxError as exc:
        raise Unreadable(f"not well-formed XML: {exc}") from None


def md(element):
    """The attributes of the element's ``rs:md``, or ``None`` without one."""
    found = element.find(f"{{{RS}}}md")
    return dict(found.attrib) if found is not None else None


def links(element):
    return [dict(ln.attrib) for ln in element.findall(f"{{{RS}}}ln")]


def hrefs(element, rel):
    """The ``href`` of each of the element's links of relation ``rel``."""
    return [ln.get("href") for ln in links(element) if ln.get("rel") == rel]


def entries(doc):
    return doc.findall(f"{{{SM}}}url") + doc.findall(f"{{{SM}}}sitemap")


def loc(entry):
    found = entry.find(f"{{{SM}}}loc")
    return (found.text or "").strip() if found is not None else ""


def is_index(doc):
    return doc.tag == f"{{{SM}}}sitemapindex"


def hashes(meta):
    """``{"md5": hex, "sha-256": hex}`` of an ``rs:md`` (or ``rs:ln``) ``hash`` attribute."""
    found = {}
    for token in (meta or {}).get("hash", "").split():
        algorithm, _, value = token.partition(":")
        found[algorithm] = value
    return found


def problems(doc, capability, *, size=None, max_entries=MAX_ENTRIES, max_bytes=MAX_BYTES):
    """What in ``doc`` (from :func:`read`) breaks the spec's rules for a document of
    ``capability`` (``"description"`` for a Source Description), ``size`` bytes long: a list
    of sentences, empty for a document that keeps them all."""
    found = []
    say = found.append
    if doc.tag not in (f"{{{SM}}}urlset", f"{{{SM}}}sitemapindex"):
        return [f"its root is {doc.tag}, not a <urlset> or <sitemapindex> of the Sitemap namespace"]
    top = md(doc)
    if top is None:
        return ["it has no rs:md child of its root (section 7)"]
    if top.get("capability") != capability:
        say(f"its capability is {top.get('capability')!r}, where {capability!r} was expected")
    for name in ("at", "completed", "from", "until"):
        if name in top and not W3C_UTC.match(top[name]):
            say(f"its {name}={top[name]!r} is not a complete UTC datetime")
    if capability in AT_DOCUMENTS and ("at" not in top or {"from", "until"} & set(top)):
        say("a snapshot document has at (and maybe completed), never from or until (Appendix A)")
    if capability in FROM_DOCUMENTS and ("from" not in top or {"at", "completed"} & set(top)):
        say("a document of changes has from (and maybe until), never at or completed (Appendix A)")
    if capability in (capabilities.DESCRIPTION, capabilities.CAPABILITYLIST) and {"at", "completed", "from", "until"} & set(top):
        say("a Source Description or Capability List has no at, completed, from or until")
    if "from" in top and "until" in top and top["until"] < top["from"]:
        say(f"until={top['until']} is before from={top['from']}")
    if "at" in top and "completed" in top and top["completed"] < top["at"]:
        say(f"completed={top['completed']} is before at={top['at']}")
    if capability not in (capabilities.DESCRIPTION, capabilities.FRAMEWORK_NOTIFICATION) and capability not in MANIFESTS:
        if not hrefs(doc, "up"):
            say("it has no rs:ln rel=\"up\" (to its Capability List, or the Capability List's to the Source Description)")
    for rel in ("up", "index"):
        if len(hrefs(doc, rel)) > 1:
            say(f"it has more than one rs:ln rel=\"{rel}\"")
    items = entries(doc)
    if len(items) > max_entries:
        say(f"it has {len(items):,} entries: more than {max_entries:,} (section 10.2)")
    if size is not None and size > max_bytes:
        say(f"it is {size:,} bytes: more than {max_bytes:,} (section 10.2)")
    kinds, previous = [], None
    for number, item in enumerate(items, 1):
        where = f"entry {number}"
        uri = loc(item)
        if not uri:
            say(f"{where} has no <loc>")
            continue
        where = f"entry {number} ({uri[:120]})"
        if not uri.isascii() or " " in uri or not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", uri):
            say(f"{where}: its <loc> is not an absolute, percent-encoded URI")
        lastmod = item.find(f"{{{SM}}}lastmod")
        if lastmod is not None and not W3C_ANY.match((lastmod.text or "").strip()):
            say(f"{where}: lastmod {lastmod.text!r} is not a W3C datetime")
        meta = md(item) or {}
        for name in ("at", "completed", "from", "until", "datetime"):
            if name in meta and not W3C_UTC.match(meta[name]):
                say(f"{where}: {name}={meta[name]!r} is not a complete UTC datetime")
        for token in meta.get("hash", "").split():
            if not HASH_TOKEN.match(token):
                say(f"{where}: hash token {token!r} is not md5:, sha-1: or sha-256: and lowercase hex (section 7)")
        if "length" in meta and not meta["length"].isdigit():
            say(f"{where}: length {meta['length']!r} is not a whole number of bytes")
        found_kind = meta.get("capability")
        if capability == capabilities.DESCRIPTION and not is_index(doc) and found_kind != capabilities.CAPABILITYLIST:
            say(f"{where}: a Source Description lists Capability Lists (capability={found_kind!r})")
        elif capability == capabilities.CAPABILITYLIST:
            kinds.append(found_kind)
            if found_kind not in NAMES - {capabilities.DESCRIPTION, capabilities.CAPABILITYLIST}:
                say(f"{where}: capability {found_kind!r} is not one a Capability List lists")
            elif found_kind.endswith("-notification") and not hrefs(item, "hub"):
                say(f"{where}: a notification channel names its hub (rs:ln rel=\"hub\")")
        elif capability in (capabilities.CHANGELIST, capabilities.CHANGEDUMP_MANIFEST) and not is_index(doc):
            if meta.get("change") not in CHANGES:
                say(f"{where}: change {meta.get('change')!r} is not created, updated or deleted (section 12)")
            moment = meta.get("datetime") or (lastmod.text.strip() if lastmod is not None and lastmod.text else None)
            if moment is not None and W3C_UTC.match(moment):
                if previous is not None and _instant(moment) < _instant(previous):
                    say(f"{where}: its change at {moment} comes after one at {previous}: changes are listed oldest first")
                previous = moment
        elif capability in (capabilities.FRAMEWORK_NOTIFICATION, capabilities.CHANGE_NOTIFICATION):
            if meta.get("change") not in CHANGES:
                say(f"{where}: change {meta.get('change')!r} is not created, updated or deleted")
            if capability == capabilities.FRAMEWORK_NOTIFICATION and found_kind not in NAMES:
                say(f"{where}: a framework notification names the capability of the document it tells of")
            if capability == capabilities.CHANGE_NOTIFICATION and "datetime" not in meta:
                say(f"{where}: a change notification gives the datetime of the change")
        elif capability in (capabilities.RESOURCELIST_ARCHIVE, capabilities.RESOURCEDUMP_ARCHIVE) and not is_index(doc):
            if "at" not in meta or "completed" not in meta or meta["completed"] < meta["at"]:
                say(f"{where}: an archived snapshot gives its at and, not before it, its completed")
        elif capability in (capabilities.CHANGELIST_ARCHIVE, capabilities.CHANGEDUMP_ARCHIVE) and not is_index(doc):
            if "from" not in meta or "at" in meta or meta.get("until", meta["from"]) < meta["from"]:
                say(f"{where}: an archived document of changes gives its from (and until, not before it), never at")
        if capability in MANIFESTS and meta.get("change") != "deleted":  # a deletion has no bitstream
            path = meta.get("path", "")
            if not path.startswith("/"):
                say(f"{where}: its path {path!r} does not start with a slash (section 11.2)")
    if len(kinds) != len(set(kinds)):
        say("a Capability List lists one capability twice")
    return found


def _instant(moment):
    """A UTC datetime as text that sorts as the instants do (fractions of a second padded)."""
    head, _, fraction = moment.rstrip("Z").partition(".")
    return head + "." + fraction.ljust(9, "0")


#: The official schemas shipped with the app, unmodified (their origins, checksums and licences
#: are in the folder's README.md): what the audit validates against unless told otherwise.
SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"

_schemas = {}


def schema_folder(choice):
    """The folder of schemas that ``choice`` (``--schemas`` or the setting ``AUDIT_SCHEMAS``)
    names: the app's own for ``None``, none (``None``: no validation) for ``False`` or ``""``."""
    if choice is None:
        return SCHEMAS
    return Path(choice) if choice else None


def schema_problems(doc, schemas):
    """What the official schemas in the folder ``schemas`` find wrong with ``doc``. An empty
    ``<urlset>`` or ``<sitemapindex>`` is valid ResourceSync (section 7: "zero or more"
    entries), which the sitemaps.org schema refuses: that one complaint is not reported."""
    root = etree.QName(doc).localname
    schema = _schema(Path(schemas), root)
    if schema is None:
        return [f"its root <{root}> is no document the schemas describe"]
    if schema.validate(doc):
        return []
    complaints = [f"line {e.line}: {e.message}" for e in schema.error_log]
    if not entries(doc) and len(complaints) == 1 and "Missing child element" in complaints[0]:
        return []
    return [f"the schema refuses it: {complaint}" for complaint in complaints[:5]]


def _schema(folder, root):
    key = (folder.resolve(), root)
    if key not in _schemas:
        smfile = {"urlset": "sitemap.xsd", "sitemapindex": "siteindex.xsd"}.get(root)
        if smfile is None:
            return None
        wrapper = (
            '<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">'
            f'<xs:import namespace="{RS}" schemaLocation="{(key[0] / "resourcesync.xsd").as_uri()}"/>'
            f'<xs:import namespace="{SM}" schemaLocation="{(key[0] / smfile).as_uri()}"/></xs:schema>'
        )
        _schemas[key] = etree.XMLSchema(etree.fromstring(wrapper.encode()))
    return _schemas[key]


def schemas_missing(folder):
    """Why the folder ``folder`` cannot serve as the schemas' (``None`` if it can)."""
    folder = Path(folder)
    missing = [name for name in ("resourcesync.xsd", "sitemap.xsd", "siteindex.xsd") if not (folder / name).is_file()]
    return f"{folder} lacks {', '.join(missing)}" if missing else None
