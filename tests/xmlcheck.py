"""Validation of published documents: the official schemas plus the spec rules they cannot express."""

import re
from pathlib import Path

from lxml import etree

SM = "http://www.sitemaps.org/schemas/sitemap/0.9"
RS = "http://www.openarchives.org/rs/terms/"
XSD_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "spec" / "xsd"

W3C_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
CAPABILITIES = {
    "resourcelist", "changelist", "resourcedump", "changedump",
    "resourcedump-manifest", "changedump-manifest", "capabilitylist", "description",
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
    original = doc = parse(xml_bytes)
    root = etree.QName(doc).localname
    if not entries(doc):
        # The sitemap schema wants at least one <url>; an empty list is valid ResourceSync.
        # Validate a copy with one dummy entry so that everything else is still checked.
        doc = etree.fromstring(xml_bytes)
        tag = "url" if root == "urlset" else "sitemap"
        entry = etree.SubElement(doc, f"{{{SM}}}{tag}")
        etree.SubElement(entry, f"{{{SM}}}loc").text = "http://example.org/dummy"
    schema = _schema(root)
    assert schema.validate(doc), [f"{e.line}: {e.message}" for e in schema.error_log]
    return original


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
    if capability != "description":
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
        if capability == "description":
            assert meta.get("capability") == "capabilitylist"
        elif capability == "capabilitylist":
            assert meta.get("capability") in CAPABILITIES - {"description", "capabilitylist"}
        if "hash" in meta:
            for token in meta["hash"].split():
                algorithm, _, value = token.partition(":")
                assert algorithm in ("md5", "sha-1", "sha-256") and re.fullmatch(r"[0-9a-f]+", value), token
    if capability == "capabilitylist":
        kinds = [md(item)["capability"] for item in items]
        assert len(kinds) == len(set(kinds)), "one entry per capability"
    return doc
