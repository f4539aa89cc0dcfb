"""Validation of published documents: the official schemas plus the spec rules they cannot express."""

from lxml import etree

from django_resourcesync.audit import rules

SM = "http://www.sitemaps.org/schemas/sitemap/0.9"
RS = "http://www.openarchives.org/rs/terms/"
# The official schemas, as the app ships them (from the checkout, or from the installed wheel).
SCHEMAS = rules.SCHEMAS

# The spec's rules are the app's own (the self-audit reads deployed Sources with them).
W3C_UTC = rules.W3C_UTC


def _schema(root):
    return rules._schema(SCHEMAS, root)


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


md, links, entries = rules.md, rules.links, rules.entries


def link(element, rel):
    hrefs = [ln["href"] for ln in links(element) if ln["rel"] == rel]
    assert len(hrefs) <= 1, f"more than one rel={rel}"
    return hrefs[0] if hrefs else None


def check_document(xml_bytes, capability, *, max_entries=50_000):
    """The official schemas, then the spec's rules as the app's self-audit reads them
    (:func:`django_resourcesync.audit.rules.problems`: sections 7 to 13 and Appendix A); returns
    the parsed root."""
    doc = assert_schema_valid(xml_bytes)
    found = rules.problems(doc, capability, max_entries=max_entries)
    assert not found, found
    # What the app does beyond the spec's letter: its manifests link up to their Capability
    # List too; a framework notification tells of a Change List, never of its index.
    if capability in rules.MANIFESTS:
        assert link(doc, "up"), "the app's manifests link up"
    if capability == "framework-notification":
        for item in entries(doc):
            loc = item.find(f"{{{SM}}}loc").text
            assert not loc.endswith("changelist.xml") or link(item, "index") is None
    return doc
