"""Validation of published documents: the official schemas plus the spec rules they cannot express."""

import os
import re
from pathlib import Path

from lxml import etree

SM = "http://www.sitemaps.org/schemas/sitemap/0.9"
RS = "http://www.openarchives.org/rs/terms/"
# The official schemas, in shared/ beside the checkout (or where RESOURCESYNC_XSD_DIR says: the
# suite run from an installed wheel, in a folder of its own).
XSD_DIR = Path(os.environ.get("RESOURCESYNC_XSD_DIR") or Path(__file__).resolve().parents[1].parent / "shared" / "spec" / "xsd")

W3C_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
CAPABILITIES = {
    "resourcelist", "changelist", "resourcedump", "changedump",
    "resourcedump-manifest", "changedump-manifest", "capabilitylist", "description",
    "framework-notification", "change-notification", "resourcelist-archive", "resourcedump-archive",
    "changelist-archive", "changedump-archive",
}
AT_DOCUMENTS = {"resourcelist", "resourcedump", "resourcedump-manifest"}
FROM_DOCUMENTS = {"changelist", "changedump", "changedump-manifest"}
_schemas = {}


def _schema(root):
    if root not in _schemas:
        if not (XSD_DIR / "resourcesync.xsd").exists():
            raise RuntimeError(f"The official schemas are missing: expected them in {XSD_DIR}")
        smfile = {"urlset": "sitemap.xsd", "sitemapindex": "siteindex.xsd"}[root]
        wrapper = (
            '<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">'
            f'<xs:import namespace="{RS}" schemaLocation="{(XSD_DIR / "resourcesync.xsd").as_uri()}"/>'
            f'<xs:import namespace="{SM}" schemaLocation="{(XSD_DIR / smfile).as_uri()}"/></xs:schema>'
        )
        _schemas[root] = etree.XMLSchema(etree.fromstring(wrapper.encode()))
    return _schemas[root]


def parse(xml_bytes):
    return etree.fromstring(xml_bytes)


def assert_schema_valid(xml_bytes):
    """Validate against the official schemas. An empty ``<urlset>`` or ``<sitemapindex>`` is
    valid ResourceSync (core 1.1 section 7: "zero or more <url> child elements"; an empty open
    Change List, the Resource List of an empty set), and the app publishes it as it is; the
    sitemaps.org schema wants one entry at least. So for an empty document the schema's one
    complaint must be that missing entry, and a copy with one entry added must validate."""
    doc = parse(xml_bytes)
    root = etree.QName(doc).localname
    schema = _schema(root)
    if schema.validate(doc):
        return doc
    complaints = [f"{e.line}: {e.message}" for e in schema.error_log]
    assert not entries(doc), complaints
    tag = "url" if root == "urlset" else "sitemap"
    assert len(complaints) == 1 and "Missing child element" in complaints[0] and f"{{{SM}}}{tag}" in complaints[0], complaints
    padded = parse(xml_bytes)
    entry = etree.SubElement(padded, f"{{{SM}}}{tag}")
    etree.SubElement(entry, f"{{{SM}}}loc").text = "http://example.org/entry"
    assert schema.validate(padded), [f"{e.line}: {e.message}" for e in schema.error_log]
    return doc


def md(element):
    found = element.find(f"{{{RS}}}md")
    return dict(found.attrib) if found is not None else None


def links(element):
    return [dict(ln.attrib) for ln in element.findall(f"{{{RS}}}ln")]


def link(element, rel):
    hrefs = [ln["href"] for ln in links(element) if ln["rel"] == rel]
    assert len(hrefs) <= 1, f"more than one rel={rel}"
    return hrefs[0] if hrefs else None


def entries(doc):
    return doc.findall(f"{{{SM}}}url") + doc.findall(f"{{{SM}}}sitemap")


def check_document(xml_bytes, capability, *, max_entries=50_000):
    """Schema plus spec rules (sections 7-10, Appendix A); returns the parsed root."""
    doc = assert_schema_valid(xml_bytes)
    top = md(doc)
    assert top is not None, "the root must have rs:md"
    assert top.get("capability") == capability, top
    assert top["capability"] in CAPABILITIES
    for name in ("at", "completed", "from", "until"):
        if name in top:
            assert W3C_UTC.match(top[name]), f"{name}={top[name]} is not a full UTC W3C datetime"
    if capability in AT_DOCUMENTS:
        assert "at" in top and "from" not in top and "until" not in top, top
    if capability in FROM_DOCUMENTS:
        assert "from" in top and "at" not in top and "completed" not in top, top
    if capability in ("description", "capabilitylist"):
        assert not {"at", "completed", "from", "until"} & set(top), top
    if capability not in ("description", "framework-notification"):  # Example 2 of the notification spec has none
        assert link(doc, "up"), "every document but the Source Description links up"
    items = entries(doc)
    assert len(items) <= max_entries
    for item in items:
        loc = item.find(f"{{{SM}}}loc").text
        assert loc.isascii() and " " not in loc, loc
        lastmod = item.find(f"{{{SM}}}lastmod")
        if lastmod is not None:
            assert W3C_UTC.match(lastmod.text), lastmod.text
        meta = md(item) or {}
        for name in ("at", "completed", "from", "until", "datetime"):
            if name in meta:
                assert W3C_UTC.match(meta[name]), meta
        if capability == "description" and doc.tag == f"{{{SM}}}urlset":  # an index lists parts
            assert meta.get("capability") == "capabilitylist"
        elif capability == "capabilitylist":
            assert meta.get("capability") in CAPABILITIES - {"description", "capabilitylist"}
            if meta["capability"].endswith("-notification"):  # a channel: its topic and hub (Example 8)
                assert link(item, "hub"), "a notification channel names its hub"
        elif capability == "framework-notification":
            # Section 3: what changed, of which document; never an index (one under an index links it).
            assert meta.get("change") in ("created", "updated", "deleted") and meta.get("capability") in CAPABILITIES, meta
            assert not loc.endswith("changelist.xml") or link(item, "index") is None
        elif capability in ("resourcelist-archive", "resourcedump-archive") and doc.tag == f"{{{SM}}}urlset":
            # An archived snapshot: when it was taken, and finished.
            assert "at" in meta and "completed" in meta and meta["at"] <= meta["completed"], meta
        elif capability in ("changelist-archive", "changedump-archive") and doc.tag == f"{{{SM}}}urlset":
            # An archived list or package of changes: the interval it covers.
            assert "from" in meta and "at" not in meta and meta.get("until", meta["from"]) >= meta["from"], meta
        elif capability == "change-notification":
            assert meta.get("change") in ("created", "updated", "deleted") and "datetime" in meta, meta
        if "hash" in meta:
            for token in meta["hash"].split():
                algorithm, _, value = token.partition(":")
                assert algorithm in ("md5", "sha-1", "sha-256") and re.fullmatch(r"[0-9a-f]+", value), token
    if capability == "capabilitylist":
        kinds = [md(item)["capability"] for item in items]
        assert len(kinds) == len(set(kinds)), "one entry per capability"
    return doc
