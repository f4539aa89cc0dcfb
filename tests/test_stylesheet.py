"""The stylesheet (``RESOURCESYNC["STYLESHEET"]``): every document a person may open names it
right after the XML declaration, Destinations read the documents as before, and a browser shows
each as a page with a table of its entries."""

import hashlib
import http.server
import io
import re
import threading
import time
import urllib.request
import xml.etree.ElementTree as ElementTree
import zipfile
from importlib import resources

import pytest
from lxml import etree
from resync.capability_list import CapabilityList
from resync.change_list import ChangeList
from resync.resource_list import ResourceList
from resync.source_description import SourceDescription

from django_resourcesync.pages import KINDS
from django_resourcesync.rebuild import rebuild_set
from django_resourcesync.xml.writer import XML_DECLARATION, DocumentWriter, resource_entry, url_element
from example_project.repository.models import Item

from .conftest import demo_set
from .helpers import fetch
from .xmlcheck import RS, SM, assert_schema_valid, check_document, entries, link, md

OWN = "/resourcesync/resourcesync.xsl"
BASE = "http://testserver"
#: Every capability a set can offer: the example's files set offers them all here.
EVERY_CAPABILITY = [
    "resourcelist", "changelist", "resourcedump", "changedump", "resourcelist-archive", "resourcedump-archive",
    "changelist-archive", "changedump-archive", "framework-notification", "change-notification",
]
#: What a Destination's software reads and no browser opens: never a stylesheet.
PAYLOADS = {"framework-notification", "change-notification"}
#: Manifests name no stylesheet: the copy published beside a package is the one packed, byte for
#: byte (section 13.1), and a stylesheet would not load from an unpacked ZIP.
MANIFESTS = {"resourcedump-manifest", "changedump-manifest"}
# The Source's own documents: what the walk follows (not the resources, nor their versions).
_DOCUMENT = re.compile(r"^/(\.well-known/resourcesync(/|$)|resourcesync/[-\w]+/(?!(memento|timemap|timegate)/))")


def stylesheet_bytes():
    return resources.files("django_resourcesync.xml").joinpath("resourcesync.xsl").read_bytes()


def instruction(href):
    return f'<?xml-stylesheet type="text/xsl" href="{href}"?>\n'.encode()


def publish_every_kind(settings, seed, committing, stylesheet):
    """The example's three sets, its files set offering every capability (with prior versions),
    published with two entries a document at most (a package for each file), so that every
    kind of document is there, and an index of each that has one: Resource Lists and Dumps
    built twice (their archives), changes enough for closed Change Lists and Change Dump
    packages."""
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BASE_URL": BASE, "STYLESHEET": stylesheet, "MAX_ENTRIES_PER_DOCUMENT": 2,
                             "DUMP_PACKAGE_BYTES": 1}
    bitstreams = demo_set("bitstreams")
    bitstreams.capabilities = EVERY_CAPABILITY
    bitstreams.prior_versions = True
    bitstreams.save()
    metadata, pages = demo_set("metadata"), demo_set("pages")
    with committing():
        seed(4)
    sets = [bitstreams, metadata, pages]
    for resource_set in sets:
        rebuild_set(resource_set)
    for number, item in enumerate(Item.objects.order_by("pk")):
        with committing():
            item.title = f"Retitled {number}"
            item.save()
        for item_file in item.files.all()[:1]:
            with committing():
                item_file.file.save(f"changed-{number}.txt", io.BytesIO(f"new bytes {number}".encode()))
    with committing():
        Item.objects.order_by("pk").last().delete()
    for resource_set in sets:
        rebuild_set(resource_set)
    return sets


def walk():
    """``{path: (body, content type)}`` of every document of the Source, found from the Source
    Description by following each entry's ``loc`` and each ``rs:ln`` to one of them."""
    found, queue = {}, ["/.well-known/resourcesync"]
    while queue:
        path = queue.pop(0)
        if path in found:
            continue
        status, body, response = fetch(path)
        assert status == 200, (path, status)
        found[path] = (body, response["Content-Type"])
        if response["Content-Type"] != "application/xml":
            continue
        doc = etree.fromstring(body)
        for uri in [loc.text for loc in doc.iter(f"{{{SM}}}loc")] + [
            ln.get("href") for ln in doc.iter(f"{{{RS}}}ln") if ln.get("rel") != "hub"
        ]:
            if uri.startswith(BASE + "/") and _DOCUMENT.match(uri[len(BASE):]):
                queue.append(uri[len(BASE):])
    return found


def kinds(documents):
    """``{(capability, root): [path]}`` of the XML documents walked."""
    found = {}
    for path, (body, content_type) in documents.items():
        if content_type == "application/xml":
            doc = etree.fromstring(body)
            found.setdefault((md(doc)["capability"], etree.QName(doc).localname), []).append(path)
    return found


def packaged_manifests(documents):
    """``[(manifest in the package, the published copy)]`` of every dump package walked."""
    pairs = []
    for body, content_type in documents.values():
        if content_type == "application/xml" and md(etree.fromstring(body))["capability"] in ("resourcedump", "changedump"):
            for entry in entries(etree.fromstring(body)):
                package, contents = entry.find(f"{{{SM}}}loc").text, link(entry, "contents")
                if contents is not None:
                    with zipfile.ZipFile(io.BytesIO(documents[package[len(BASE):]][0])) as archive:
                        pairs.append((archive.read("manifest.xml"), documents[contents[len(BASE):]][0]))
    return pairs


#: What a walk of the Source published by publish_every_kind finds at least.
EXPECTED_KINDS = {
    ("description", "sitemapindex"), ("description", "urlset"), ("capabilitylist", "urlset"),
    ("resourcelist", "sitemapindex"), ("resourcelist", "urlset"), ("changelist", "sitemapindex"), ("changelist", "urlset"),
    ("resourcedump", "sitemapindex"), ("resourcedump", "urlset"), ("resourcedump-manifest", "urlset"),
    ("changedump", "sitemapindex"), ("changedump", "urlset"), ("changedump-manifest", "urlset"),
    ("resourcelist-archive", "urlset"), ("resourcedump-archive", "urlset"), ("changelist-archive", "sitemapindex"),
    ("changelist-archive", "urlset"), ("changedump-archive", "urlset"),
    ("framework-notification", "urlset"), ("change-notification", "urlset"),
}


@pytest.mark.parametrize("stylesheet, written", [
    (True, OWN), ("https://static.example.org/rs.xsl?v=2&x=1", "https://static.example.org/rs.xsl?v=2&amp;x=1"),
])
def test_every_document_a_person_may_open_names_the_stylesheet_right_after_the_xml_declaration(
    settings, seed, committing, stylesheet, written
):
    publish_every_kind(settings, seed, committing, stylesheet)
    documents = walk()
    found = kinds(documents)
    assert EXPECTED_KINDS <= set(found), sorted(EXPECTED_KINDS - set(found))
    wanted = XML_DECLARATION + instruction(written)
    for (capability, _root), paths in found.items():
        for path in paths:
            body = documents[path][0]
            if capability in PAYLOADS | MANIFESTS:
                assert b"<?xml-stylesheet" not in body, path
            else:
                assert body.startswith(wanted), (path, body[:200])
                assert body.count(b"<?xml-stylesheet") == 1, path
    # Stored files (lists closed, builds, manifests) and documents rendered on request alike.
    assert any("/changelist/" in path for path in found["changelist", "urlset"])
    # The manifest packed into a ZIP is the published copy, byte for byte.
    pairs = packaged_manifests(documents)
    assert len(pairs) >= 4
    for packaged, published in pairs:
        assert packaged == published and packaged.startswith(XML_DECLARATION + b"<urlset ")


@pytest.mark.parametrize("stylesheet", [None, False])
def test_with_no_stylesheet_no_document_names_one(settings, seed, committing, stylesheet):
    publish_every_kind(settings, seed, committing, stylesheet)
    documents = walk()
    assert EXPECTED_KINDS <= set(kinds(documents))
    for path, (body, content_type) in documents.items():
        if content_type == "application/xml":
            assert body.startswith(XML_DECLARATION + b"<") and b"<?xml-stylesheet" not in body, path
    for packaged, published in packaged_manifests(documents):
        assert packaged == published


def without_instruction(body):
    """The document as it would be without a stylesheet: the instruction after the declaration removed."""
    head, _, rest = body.partition(b"?>\n<?xml-stylesheet ")
    assert head == XML_DECLARATION[:-3] and rest, body[:200]
    return XML_DECLARATION + rest.partition(b"?>\n")[2]


def test_with_the_stylesheet_every_document_still_validates_and_parses_to_the_same_elements(settings, seed, committing):
    """Schema and spec rules (tests/xmlcheck.py) on every document; lxml and ElementTree read
    the same root and entries as from the document without the instruction."""
    publish_every_kind(settings, seed, committing, True)
    documents = walk()
    checked = 0
    for path, (body, content_type) in documents.items():
        if content_type != "application/xml":
            continue
        capability = md(etree.fromstring(body))["capability"]
        doc = check_document(body, capability)
        if capability in PAYLOADS | MANIFESTS:
            continue
        plain = without_instruction(body)
        assert etree.tostring(doc) == etree.tostring(etree.fromstring(plain)), path
        # lxml keeps the instruction as a sibling before the root, which stays the document's root.
        tree = etree.fromstring(body).getroottree()
        assert tree.getroot().tag == doc.tag and etree.QName(doc).namespace == SM
        before = tree.getroot().getprevious()
        assert before.target == "xml-stylesheet" and before.get("href") == OWN and before.get("type") == "text/xsl"
        # ElementTree drops it.
        with_it, without_it = ElementTree.fromstring(body), ElementTree.fromstring(plain)
        assert ElementTree.tostring(with_it) == ElementTree.tostring(without_it)
        assert [loc.text for loc in with_it.iter(f"{{{SM}}}loc")] == [e.find(f"{{{SM}}}loc").text for e in entries(doc)]
        checked += 1
    assert checked >= 40  # manifests aside (they name no stylesheet)


# -- the writer ----------------------------------------------------------------------------


def finished(stylesheet=True, **kwargs):
    writer = DocumentWriter()
    writer.add(url_element("https://example.org/a"))
    out = io.BytesIO()
    writer.finish(out, md={"capability": "resourcelist", "at": "2024-01-01T00:00:00Z"}, stylesheet=stylesheet, **kwargs)
    return writer, out.getvalue()


def test_the_writer_names_the_stylesheet_of_the_setting_once_at_the_top(settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "STYLESHEET": True}
    writer, body = finished()
    assert body.startswith(XML_DECLARATION + instruction(OWN) + b"<urlset ")
    assert writer.size == len(body) and writer.sha256 == hashlib.sha256(body).hexdigest()
    assert finished(stylesheet=False)[1] == without_instruction(body), "a payload names none, whatever the setting"
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "STYLESHEET": None}
    assert finished()[1] == without_instruction(body)


def test_a_stylesheet_url_is_escaped_so_that_nothing_ends_the_instruction_early(settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "STYLESHEET": 'https://example.org/s.xsl?a=1&b="2"?>x<y'}
    _, body = finished()
    assert body.startswith(
        XML_DECLARATION + b'<?xml-stylesheet type="text/xsl" href="https://example.org/s.xsl?a=1&amp;b=&quot;2&quot;?&gt;x&lt;y"?>\n'
    )
    # A browser reads the pseudo-attributes as those of an element (entities replaced).
    pi = etree.fromstring(body).getroottree().getroot().getprevious()
    assert etree.fromstring(f"<pi {pi.text}/>").get("href") == 'https://example.org/s.xsl?a=1&b="2"?>x<y'
    assert_schema_valid(body)


def test_the_copy_is_the_document_byte_for_byte(settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "STYLESHEET": True}
    copy = io.BytesIO()
    writer, body = finished(copy=copy)
    assert copy.getvalue() == body
    assert writer.size == len(body) and writer.sha256 == hashlib.sha256(body).hexdigest()


def test_the_open_change_list_is_not_answered_304_after_the_stylesheet_changes(settings, seed, committing, client):
    """Its ETag is made from the database; the stylesheet it names is part of it."""
    with committing():
        seed(2)
    rebuild_set(demo_set("metadata"))
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "STYLESHEET": None}
    first = client.get("/resourcesync/metadata/changelist.xml")
    assert first.status_code == 200 and b"<?xml-stylesheet" not in first.content
    assert client.get("/resourcesync/metadata/changelist.xml", headers={"if-none-match": first["ETag"]}).status_code == 304
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "STYLESHEET": True}
    again = client.get("/resourcesync/metadata/changelist.xml", headers={"if-none-match": first["ETag"]})
    assert again.status_code == 200 and again.content.startswith(XML_DECLARATION + instruction(OWN))
    assert again["ETag"] != first["ETag"]


# -- the view ------------------------------------------------------------------------------


def test_the_stylesheet_is_served_as_xslt_with_an_etag_and_a_304(client, db):
    response = client.get(OWN)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/xslt+xml; charset=utf-8"
    assert "max-age=3600" in response["Cache-Control"]
    body = response.content
    assert body == stylesheet_bytes()
    assert response["ETag"] == f'"{hashlib.sha256(body).hexdigest()}"'
    etree.XSLT(etree.fromstring(body))  # a stylesheet lxml (libxslt, as Chromium) compiles
    again = client.get(OWN, headers={"if-none-match": response["ETag"]})
    assert again.status_code == 304 and again["ETag"] == response["ETag"] and "max-age" in again["Cache-Control"]
    assert client.head(OWN).status_code == 200
    assert client.post(OWN).status_code == 405


def test_the_stylesheet_is_served_even_when_the_setting_is_off(client, db, settings):
    """Documents written while it was on still name it."""
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "STYLESHEET": None}
    assert client.get(OWN).status_code == 200


# -- the stylesheet, applied by lxml (libxslt: the XSLT engine of Chromium) ----------------------

#: The kinds of document a person opens, in words: as the server's pages name them (pages.py).
WORDS = {capability: words for capability, words in KINDS.items() if capability not in PAYLOADS}


def heading(doc):
    """What the page of a document is headed: its kind in words."""
    return WORDS[md(doc)["capability"]] + (" Index" if etree.QName(doc).localname == "sitemapindex" else "")


def transform(body):
    from lxml import html

    stylesheet = etree.XSLT(etree.fromstring(stylesheet_bytes()))
    return html.fromstring(str(stylesheet(etree.fromstring(body).getroottree())))


def cells(page, name):
    """The texts of the column ``name`` (a class of its cells)."""
    found = page.xpath(f"//tbody/tr/td[contains(concat(' ', @class, ' '), ' {name} ')]")
    return [" ".join(td.text_content().split()) for td in found]


def facts(page):
    """``{label: value}`` of the document's own rs:md and rs:ln, as the page's header shows them."""
    return {
        " ".join(dt.text_content().split()): " ".join(dd.text_content().split())
        for dt, dd in zip(page.xpath("//dl[@class='facts']/dt"), page.xpath("//dl[@class='facts']/dd"))
    }


def test_every_kind_of_document_reads_as_a_page_with_its_heading_and_a_row_per_entry(settings, seed, committing):
    publish_every_kind(settings, seed, committing, True)
    seen = set()
    for path, (body, content_type) in walk().items():
        if content_type != "application/xml" or md(etree.fromstring(body))["capability"] in PAYLOADS:
            continue
        doc, page = etree.fromstring(body), transform(body)
        seen.add(md(doc)["capability"])
        assert page.xpath("string(//h1)") == heading(doc), path
        assert page.xpath("string(//title)") == f"{heading(doc)} (ResourceSync)"
        listed = entries(doc)
        assert page.xpath("//tbody/tr/td[@class='loc']/a/@href") == [e.find(f"{{{SM}}}loc").text for e in listed], path
        assert page.xpath("//tbody/tr/td[@class='loc']/a/text()") == [e.find(f"{{{SM}}}loc").text for e in listed]
        assert page.xpath("string(//p[@class='count'])").strip() == f"{len(listed)} entr{'y' if len(listed) == 1 else 'ies'}"
        # The document's own links (up, index, describedby), as links, in the header.
        own = [ln.get("href") for ln in doc.findall(f"{{{RS}}}ln")]
        assert page.xpath("//header//dd/a/@href") == own
        assert own or md(doc)["capability"] == "description"
        # Each entry's links, rel for text.
        for row, entry in zip(page.xpath("//tbody/tr"), listed):
            links = entry.findall(f"{{{RS}}}ln")
            assert row.xpath("td[@class='links']/a/@href") == [ln.get("href") for ln in links]
            assert row.xpath("td[@class='links']/a/text()") == [ln.get("rel") for ln in links]
        # Its dates, in words and readable.
        words = {"at": "As of", "completed": "Completed", "from": "From", "until": "Until"}
        for name, value in md(doc).items():
            if name in words:
                assert facts(page)[f"{words[name]} ({name})"] == f"{value[:10]} {value[11:19]} UTC", (path, name)
    assert seen == set(WORDS)


def test_sizes_dates_hashes_and_links_read_as_people_read_them():
    writer = DocumentWriter()
    sizes = [0, 1, 1023, 1024, 1536, 5 * 1024**2 + 1, 3 * 1024**3, 2 * 1024**4]
    for number, length in enumerate(sizes):
        writer.add(resource_entry(
            f"https://example.org/files/{number}", lastmod="2024-05-01T12:34:56.123456Z", length=length,
            md5="d41d8cd98f00b204e9800998ecf8427e", sha256="e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            media_type="application/pdf", links=[{"rel": "describedby", "href": f"https://example.org/meta/{number}"}],
        ))
    writer.add(url_element("javascript:alert(1)", lastmod="2024-05-01T12:34:56+02:00",
                           links=[{"rel": "alternate", "href": "javascript:alert(2)"}]))
    writer.add(url_element("HTTPS://example.org/upper", lastmod="2024-05-01"))
    out = io.BytesIO()
    writer.finish(out, md={"capability": "resourcelist", "at": "2024-05-01T00:00:00Z", "completed": "2024-05-01T00:01:02.5Z"},
                  links=[{"rel": "up", "href": "https://example.org/capabilitylist.xml"}], stylesheet=OWN)
    page = transform(out.getvalue())
    assert page.xpath("string(//h1)") == "Resource List"
    assert cells(page, "length")[: len(sizes)] == [
        "0 bytes", "1 byte", "1,023 bytes", "1.0 KB", "1.5 KB", "5.0 MB", "3.0 GB", "2.0 TB"
    ]
    assert page.xpath("//td[@class='length']/@title")[4] == "1,536 bytes"
    assert cells(page, "lastmod") == ["2024-05-01 12:34:56"] * len(sizes) + ["2024-05-01 12:34:56 UTC+02:00", "2024-05-01"]
    assert page.xpath("//td[@class='lastmod']/@title")[0] == "2024-05-01T12:34:56.123456Z"
    assert facts(page) == {
        "Capability": "resourcelist", "As of (at)": "2024-05-01 00:00:00 UTC", "Completed (completed)": "2024-05-01 00:01:02 UTC",
        "Up (up)": "https://example.org/capabilitylist.xml",
    }
    assert cells(page, "hash")[0] == "md5 d41d8cd98f…sha-256 e3b0c44298…"
    assert page.xpath("//td[@class='hash']/@title")[0] == (
        "md5:d41d8cd98f00b204e9800998ecf8427e sha-256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    assert cells(page, "type")[0] == "application/pdf"
    assert cells(page, "n") == [str(n) for n in range(1, len(sizes) + 3)]
    # Only http(s) URIs are links: a javascript: one is shown as text.
    assert not [href for href in page.xpath("//a/@href") if not href.lower().startswith(("http://", "https://"))]
    assert cells(page, "loc")[len(sizes)] == "javascript:alert(1)"
    assert page.xpath("//tbody/tr[last()]/td[@class='loc']/a/@href") == ["HTTPS://example.org/upper"]
    assert page.xpath("//header//a/@href") == ["https://example.org/capabilitylist.xml"]
    assert not page.xpath("//script") and not page.xpath("//link") and not page.xpath("//*[@src]")


def test_a_long_document_is_cut_into_tables_numbered_on():
    writer = DocumentWriter()
    for number in range(1234):
        writer.add(url_element(f"https://example.org/{number}"))
    out = io.BytesIO()
    writer.finish(out, md={"capability": "resourcelist", "at": "2024-05-01T00:00:00Z"}, stylesheet=OWN)
    page = transform(out.getvalue())
    assert len(page.xpath("//div[@class='rows']/table")) == 3
    assert cells(page, "n") == [str(n) for n in range(1, 1235)]
    assert page.xpath("//td[@class='loc']/a/@href") == [f"https://example.org/{number}" for number in range(1234)]
    assert page.xpath("string(//p[@class='count'])").strip() == "1,234 entries"


# -- over HTTP: resync, and a browser -------------------------------------------------------


@pytest.fixture
def styled_source(live_server, settings, transactional_db):
    """A running Source with the app's stylesheet, as the example project has it."""
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BASE_URL": live_server.url, "STYLESHEET": True}
    return live_server.url


def publish_example(seed, *, items=6):
    """The example's three sets, its files set with a Resource Dump too; items changed and one
    deleted after the first publication, so that the open Change Lists have entries."""
    bitstreams = demo_set("bitstreams")
    bitstreams.capabilities = ["resourcelist", "changelist", "resourcedump"]
    bitstreams.save()
    sets = [bitstreams, demo_set("metadata"), demo_set("pages")]
    seed(items)
    for resource_set in sets:
        rebuild_set(resource_set)
    for item in Item.objects.order_by("pk")[:2]:
        item.title = f"{item.title} (revised)"
        item.save()
    Item.objects.order_by("pk").last().delete()
    for resource_set in sets:
        rebuild_set(resource_set)  # the changes processed and reconciled, whatever thread had them
    return sets


class _Read(io.BytesIO):
    """What resync reads: the bytes of a response, with its Content-Length."""

    def info(self):
        return {"Content-Length": str(len(self.getvalue()))}


def read_with_resync(monkeypatch, base, plain):
    """``{document: [resource fields]}`` as resync reads the Source Description, a Capability
    List, a Resource List (an index and its parts) and a Change List; ``plain``: from each
    document with its stylesheet instruction taken out (as the Source would serve it without)."""
    import resync.list_base
    import resync.list_base_with_index

    named = []

    def opened(uri, **kwargs):
        with urllib.request.urlopen(uri, timeout=30) as response:
            body = response.read()
        named.append(body.startswith(XML_DECLARATION + instruction(OWN)))
        return _Read(without_instruction(body) if plain else body)

    for module in (resync.list_base, resync.list_base_with_index):
        monkeypatch.setattr(module, "url_or_file_open", opened)

    def fields(resources):
        return [
            (r.uri, r.lastmod, r.hash, r.length, r.mime_type, r.change, r.datetime, r.capability, r.md_from, r.md_until, r.ln)
            for r in resources
        ]

    found = {}
    description = SourceDescription()
    description.read(uri=f"{base}/.well-known/resourcesync")
    found["description"] = fields(description.resources)
    capability_list = CapabilityList()
    capability_list.read(uri=f"{base}/resourcesync/metadata/capabilitylist.xml")
    found["capabilitylist"] = fields(capability_list.resources) + [capability_list.link("up")]
    listing = ResourceList(allow_multifile=True)
    listing.read(uri=f"{base}/resourcesync/metadata/resourcelist.xml")
    found["resourcelist"] = fields(listing) + [listing.md_at]
    changes = ChangeList()
    changes.read(uri=f"{base}/resourcesync/metadata/changelist.xml")
    found["changelist"] = fields(changes) + [changes.md_from]
    assert named and all(named), "every document resync read named the stylesheet"
    return found


def test_resync_reads_the_same_resources_with_the_stylesheet_as_without(styled_source, seed, settings, monkeypatch):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 3}
    publish_example(seed)  # the metadata set's Resource List is an index: resync reads its parts too
    styled = read_with_resync(monkeypatch, styled_source, plain=False)
    assert len(styled["description"]) == 3 and len(styled["capabilitylist"]) == 3
    assert len(styled["resourcelist"]) == 1 + Item.objects.filter(is_public=True).count() > 3
    assert {r[5] for r in styled["changelist"][:-1]} >= {"updated", "deleted"}
    assert styled == read_with_resync(monkeypatch, styled_source, plain=True)


#: The documents a person is likeliest to open, by the name of their screenshot.
OPENED = {
    "source-description": "/.well-known/resourcesync",
    "capabilitylist": "/resourcesync/bitstreams/capabilitylist.xml",
    "resourcelist": "/resourcesync/bitstreams/resourcelist.xml",
    "changelist": "/resourcesync/metadata/changelist.xml",
    "resourcedump": "/resourcesync/bitstreams/resourcedump.xml",
}


def test_chromium_shows_each_document_as_a_page_with_a_table_of_its_entries(styled_source, seed, browser):
    """Chromium applies the stylesheet (it shows a banner saying XSLT is to go; the page is below
    it) to the XML, which a browser gets with ``?format=xml`` (without, the page the server makes:
    tests/test_pages.py)."""
    publish_example(seed, items=3)
    for name, path in OPENED.items():
        with urllib.request.urlopen(styled_source + path, timeout=30) as response:
            body = response.read()
        assert body.startswith(XML_DECLARATION + instruction(OWN)), path
        doc = etree.fromstring(body)
        listed = [entry.find(f"{{{SM}}}loc").text for entry in entries(doc)]
        if name == "changelist":
            assert md(doc).get("until") is None and {md(e)["change"] for e in entries(doc)} >= {"updated", "deleted"}
        browser.get(styled_source + path + "?format=xml")
        assert "through the Source's stylesheet" in browser.find("footer").text, path
        assert browser.find("h1").text == heading(doc), path
        assert browser.driver.title == f"{heading(doc)} (ResourceSync)"
        assert len(browser.find_all("table tbody tr")) == len(listed) > 0, path
        assert [a.get_attribute("href") for a in browser.find_all("table tbody tr td.loc a")] == listed, path
        assert browser.find("p.count").text == f"{len(listed)} entr{'y' if len(listed) == 1 else 'ies'}"
        if name != "source-description":
            assert browser.find("header dd a").get_attribute("href") == link(doc, "up")
            # Chromium's banner about XSLT covers the top of the page: closed, as a person
            # would, for the screenshots after the first.
            browser.driver.execute_script("document.querySelector('xslt-warning-banner')?.hidePopover?.()")
        browser.keep(name)


class _Files(http.server.BaseHTTPRequestHandler):
    """Serves ``files`` ({path: (body, content type)}): a document and the stylesheet, from one origin."""

    files = {}

    def do_GET(self):
        if self.path not in self.files:
            self.send_error(404)
            return
        body, content_type = self.files[self.path]
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.slow
def test_chromium_shows_a_document_of_50000_entries(browser):
    """The most entries a document holds: every one is a row, the last one too (the page says
    how long it took to open)."""
    writer = DocumentWriter()
    for number in range(50_000):
        writer.add(resource_entry(
            f"https://repository.example.org/items/{number}/files/{number}/report-{number}.pdf", lastmod="2024-05-01T12:00:00Z",
            md5="d41d8cd98f00b204e9800998ecf8427e", sha256="e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            length=number * 997, media_type="application/pdf",
            links=[{"rel": "collection", "href": f"https://repository.example.org/items/{number}/"}],
        ))
    out = io.BytesIO()
    writer.finish(out, md={"capability": "resourcelist", "at": "2024-05-01T12:00:00Z", "completed": "2024-05-01T12:05:00Z"},
                  links=[{"rel": "up", "href": "https://repository.example.org/resourcesync/files/capabilitylist.xml"}],
                  stylesheet=OWN)
    handler = type("Handler", (_Files,), {"files": {
        "/resourcelist.xml": (out.getvalue(), "application/xml"),
        OWN: (stylesheet_bytes(), "application/xslt+xml"),
    }})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        browser.driver.set_page_load_timeout(300)
        started = time.monotonic()
        browser.get(f"http://127.0.0.1:{server.server_address[1]}/resourcelist.xml")
        opened = time.monotonic() - started
        assert browser.find("h1").text == "Resource List"
        assert browser.find("p.count").text == "50,000 entries"
        assert browser.driver.execute_script("return document.querySelectorAll('tbody tr').length") == 50_000
        last = browser.driver.execute_script("const a = document.querySelectorAll('td.loc a'); return a[a.length - 1].href")
        assert last == "https://repository.example.org/items/49999/files/49999/report-49999.pdf"
        print(f"50,000 entries: the page opened in {opened:.1f} s")
        browser.keep("50000-entries")
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "value, expected",
    [
        (1, ["resourcesync.E027"]),
        ("  ", ["resourcesync.E027"]),
        ("https://elsewhere.example.org/sheet.xsl", ["resourcesync.W012"]),
        ("http://testserver/static/sheet.xsl", []),
        ("/static/sheet.xsl", []),
        (True, []),
        (None, []),
    ],
)
def test_a_stylesheet_setting_a_browser_cannot_use_is_a_check_with_a_hint(settings, value, expected):
    from django.core import checks

    from django_resourcesync.xml.writer import stylesheet_href

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "STYLESHEET": value}
    found = [m for m in checks.run_checks() if m.id in ("resourcesync.E027", "resourcesync.W012", "resourcesync.W013")]
    assert [m.id for m in found] == expected
    assert all(m.hint for m in found)
    if expected == ["resourcesync.E027"]:
        assert stylesheet_href() is None  # never written as href="1"


def test_the_stylesheet_with_documents_served_by_redirect_is_a_warning(settings):
    from django.core import checks

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "STYLESHEET": True, "SERVE_BY_REDIRECT": True}
    assert [m.id for m in checks.run_checks() if m.id == "resourcesync.W013"] == ["resourcesync.W013"]
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "STYLESHEET": None, "SERVE_BY_REDIRECT": True}
    assert not [m for m in checks.run_checks() if m.id == "resourcesync.W013"]
