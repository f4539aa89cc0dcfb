"""Documents as pages (``RESOURCESYNC["HTML_PAGES"]``): a browser that opens a document gets a page
made on the server, every other client the XML as published, byte for byte."""

import io
import re
import time
import urllib.request

import pytest
from django.test import Client, RequestFactory
from lxml import etree, html
from resync.capability_list import CapabilityList
from resync.change_list import ChangeList
from resync.resource_list import ResourceList
from resync.source_description import SourceDescription

from django_resourcesync import access, pages
from django_resourcesync.rebuild import rebuild_set
from django_resourcesync.xml.writer import DocumentWriter, resource_entry, url_element
from example_project.repository.models import Item

from .conftest import demo_set
from .helpers import fetch
from .test_stylesheet import OPENED, PAYLOADS, cells, facts, heading, publish_every_kind, publish_example, walk
from .xmlcheck import RS, SM, entries, link, md

#: What Chromium sends for a page it opens (Firefox and Safari send the same ranking).
BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8"


def page_of(response):
    assert response.status_code == 200, response.status_code
    assert response["Content-Type"] == "text/html; charset=utf-8"
    return html.fromstring(response.content)


def browse(path, client=None, **headers):
    return (client or Client()).get(path, headers={"Accept": BROWSER, **headers})


# -- negotiation ----------------------------------------------------------------------------


@pytest.mark.parametrize("accept, page", [
    (BROWSER, True),
    ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", True),  # Firefox
    ("text/html", True),
    ("application/xhtml+xml", True),
    ("TEXT/HTML; charset=utf-8", True),
    (None, False),  # urllib, resync
    ("*/*", False),  # curl, requests
    ("application/xml", False),
    ("text/xml", False),
    ("application/xml, text/html", False),  # as much XML as HTML: the XML
    ("text/html;q=0.5, */*", False),
    ("text/html;q=0.5, text/*;q=0.1", True),
    ("text/html;q=0.5, text/*;q=0.1, text/xml", False),
    ("text/html;q=0, */*", False),
    ("text/html;q=2", False),  # no qvalue: left out
    ("text/*", False),
    ("", False),
    ("garbage", False),
])
def test_a_page_for_an_accept_that_ranks_html_above_xml_else_the_xml(settings, accept, page):
    headers = {} if accept is None else {"Accept": accept}
    assert pages.wanted(RequestFactory().get("/", headers=headers)) is page
    assert pages.wanted(RequestFactory().get("/?format=xml", headers=headers)) is False
    assert pages.wanted(RequestFactory().get("/?format=html", headers=headers)) is True
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "HTML_PAGES": False}
    assert pages.wanted(RequestFactory().get("/?format=html", headers=headers)) is False


# -- every document, through the views ------------------------------------------------------


def test_a_browser_gets_a_page_of_every_document_and_other_clients_the_xml_byte_for_byte(settings, seed, committing):
    publish_every_kind(settings, seed, committing, None)
    documents = walk()  # no Accept: what a Destination reads
    shown = set()
    for path, (body, content_type) in documents.items():
        for accept in ("*/*", "application/xml", "text/xml;q=0.9, application/xml"):
            status, again, response = fetch(path, Accept=accept)
            assert (status, again, response["Content-Type"]) == (200, body, content_type), (path, accept)
        status, again, response = fetch(path, Accept=BROWSER)
        capability = md(etree.fromstring(body))["capability"] if content_type == "application/xml" else None
        if content_type != "application/xml" or capability in PAYLOADS:
            # ZIP packages and notifications: what software reads, as it is, to anyone.
            assert (status, again, response["Content-Type"]) == (200, body, content_type), path
            continue
        assert "Accept" in response["Vary"], path
        assert fetch(path)[2]["Vary"] == response["Vary"], path
        page = page_of(response)
        doc = etree.fromstring(body)
        assert page.xpath("string(//h1)") == heading(doc), path
        assert page.xpath("string(//title)") == f"{heading(doc)} (ResourceSync)"
        listed = [entry.find(f"{{{SM}}}loc").text for entry in entries(doc)]
        assert page.xpath("//tbody/tr/td[@class='loc']/a/@href") == listed, path
        assert page.xpath("string(//p[@class='count'])") == f"{len(listed)} entr{'y' if len(listed) == 1 else 'ies'}"
        assert page.xpath("//header//dd/a/@href") == [ln.get("href") for ln in doc.findall(f"{{{RS}}}ln")]
        assert page.xpath("//a[@class='raw']/@href") == ["?format=xml"]
        assert b"<?xml-stylesheet" not in response.content
        shown.add(heading(doc))
        # The XML link gives the XML.
        assert fetch(path + "?format=xml", Accept=BROWSER)[1] == body
    assert {"Source Description", "Capability List", "Resource List Index", "Resource List", "Change List Index",
            "Change List", "Resource Dump", "Resource Dump Manifest", "Change Dump", "Change Dump Manifest",
            "Resource List Archive", "Change List Archive Index", "Change Dump Archive"} <= shown


def test_a_page_shows_sizes_dates_and_metadata_as_people_read_them(settings, seed, committing):
    publish_every_kind(settings, seed, committing, None)
    index = etree.fromstring(fetch("/resourcesync/bitstreams/resourcelist.xml")[1])
    path = index.find(f"{{{SM}}}sitemap/{{{SM}}}loc").text.removeprefix("http://testserver")
    body = fetch(path)[1]
    doc = etree.fromstring(body)
    page = page_of(browse(path))
    at = md(doc)["at"]
    assert facts(page)["As of (at)"] == f"{at[:10]} {at[11:19]} UTC"
    assert facts(page)["Capability"] == "resourcelist"
    assert facts(page)["Up (up)"] == link(doc, "up") and facts(page)["Index (index)"] == link(doc, "index")
    lengths = [md(entry)["length"] for entry in entries(doc)]
    assert cells(page, "length") == [pages._size(value)["shown"] for value in lengths]
    assert all(re.fullmatch(r"\d+ bytes|1 byte|\d+\.\d (KB|MB)", size) for size in cells(page, "length"))
    assert cells(page, "lastmod") == [
        entry.find(f"{{{SM}}}lastmod").text[:19].replace("T", " ") for entry in entries(doc)
    ]


def test_sizes_dates_hashes_and_links_in_words():
    assert [pages._size(str(n))["shown"] for n in (0, 1, 1023, 1024, 2150, 1536, 5 * 1024**2 + 1, 3 * 1024**3, 2 * 1024**4)] == [
        "0 bytes", "1 byte", "1,023 bytes", "1.0 KB", "2.1 KB", "1.5 KB", "5.0 MB", "3.0 GB", "2.0 TB"
    ]
    assert pages._size("1536")["bytes"] == "1,536 bytes"
    assert pages._when("2024-05-01T12:34:56.123456Z") == {
        "shown": "2024-05-01 12:34:56 UTC", "written": "2024-05-01T12:34:56.123456Z"
    }
    assert pages._when("2024-05-01T12:34:56+02:00", utc="")["shown"] == "2024-05-01 10:34:56"  # in UTC
    assert pages._when("2024-05-01")["shown"] == "2024-05-01"
    assert pages._when("yesterday")["shown"] == "yesterday"
    assert pages._hashes("md5:d41d8cd98f00b204e9800998ecf8427e sha-256:e3b0")["shown"] == ["md5 d41d8cd98f…", "sha-256 e3b0"]


def odd_document():
    writer = DocumentWriter()
    writer.add(resource_entry(
        'https://example.org/a?x=1&y="2"<b>', lastmod="2024-05-01T12:34:56Z", length=2150,
        media_type='text/html"><script>x</script>', md5="d41d8cd98f00b204e9800998ecf8427e",
        links=[{"rel": '"><script>alert(1)</script>', "href": "javascript:alert(2)"},
               {"rel": "describedby", "href": "https://example.org/m?a=1&b=<i>"}],
    ))
    writer.add(url_element("javascript:alert(1)"))
    writer.add(url_element(" JavaScript:alert(3)"))
    writer.add(url_element("data:text/html,<script>alert(4)</script>"))
    writer.add(url_element("HTTPS://example.org/upper"))
    out = io.BytesIO()
    writer.finish(out, md={"capability": "resourcelist", "at": "2024-05-01T00:00:00Z"},
                  links=[{"rel": "up", "href": "javascript:alert(5)"}, {"rel": "describedby", "href": "https://example.org/'about'"}])
    return out.getvalue()


def test_odd_values_are_escaped_and_only_http_uris_are_links():
    body = pages.render([odd_document()])
    assert b"<script" not in body.lower() and b"<b>" not in body and b"<i>" not in body
    page = html.fromstring(body)
    assert not page.xpath("//script") and not page.xpath("//*[@src]") and not page.xpath("//@*[starts-with(name(), 'on')]")
    hrefs = [href for href in page.xpath("//a/@href") if href != "?format=xml"]
    assert hrefs == [
        "https://example.org/'about'", 'https://example.org/a?x=1&y="2"<b>', "https://example.org/m?a=1&b=<i>",
        "HTTPS://example.org/upper",
    ]
    # What is not a link is there as text, as written.
    assert cells(page, "loc") == [
        'https://example.org/a?x=1&y="2"<b>', "javascript:alert(1)", "JavaScript:alert(3)",
        "data:text/html,<script>alert(4)</script>", "HTTPS://example.org/upper",
    ]
    assert cells(page, "type")[0] == 'text/html"><script>x</script>'
    assert cells(page, "links")[0] == '"><script>alert(1)</script> describedby'
    assert facts(page)["Up (up)"] == "javascript:alert(5)"


def test_a_document_that_is_no_sitemap_is_no_page():
    assert pages.render([b"<html><body>hi</body></html>"]) is None
    assert pages.render([b"<urlset xmlns='http://www.sitemaps.org/schemas/sitemap/0.9'><url>"]) is None
    assert pages.render([b'<!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]><x>&e;</x>']) is None


def test_a_long_document_shows_its_first_entries_and_says_how_many_more_the_xml_has(monkeypatch):
    writer = DocumentWriter()
    for number in range(2345):
        writer.add(url_element(f"https://example.org/{number}", lastmod="2024-05-01T00:00:00Z"))
    out = io.BytesIO()
    writer.finish(out, md={"capability": "resourcelist", "at": "2024-05-01T00:00:00Z"})
    body = out.getvalue()
    # In chunks of any size, as storage gives them.
    chunked = [body[start:start + 1000] for start in range(0, len(body), 1000)]
    page = html.fromstring(pages.render(chunked))
    assert page.xpath("//td[@class='loc']/a/@href") == [f"https://example.org/{number}" for number in range(pages.SHOWN)]
    assert page.xpath("string(//p[@class='count'])") == "2,345 entries"
    assert " ".join(page.xpath("string(//p[@class='cut'])").split()) == (
        "This page shows the first 1,000 entries. 1,345 more: download the XML."
    )
    assert page.xpath("//p[@class='cut']/a/@href") == ["?format=xml"]
    monkeypatch.setattr(pages, "SHOWN", 5000)
    page = html.fromstring(pages.render([body]))
    assert len(page.xpath("//tbody/tr")) == 2345 and not page.xpath("//p[@class='cut']")


# -- HTTP: validators, HEAD, Range, the setting ---------------------------------------------

STORED = "/resourcesync/metadata/resourcelist.xml"
LIVE = "/resourcesync/metadata/changelist.xml"
DESCRIPTION = "/.well-known/resourcesync"


@pytest.fixture
def published(seed, committing):
    with committing():
        seed(3)
    rebuild_set(demo_set("metadata"))
    # A document changed within the current second is served without Last-Modified (it may
    # change again within that second): both variants are asked for once that second is over.
    time.sleep(1.05)


@pytest.mark.parametrize("path", [STORED, LIVE, DESCRIPTION])
def test_the_page_has_an_etag_of_its_own_and_conditional_gets_answer_each_variant(published, path):
    xml = Client().get(path)
    page = browse(path)
    assert page["ETag"] != xml["ETag"] and page["ETag"].startswith(xml["ETag"][:-1] + "-html-")
    assert page.get("Last-Modified") == xml.get("Last-Modified")
    for response in (xml, page):
        assert "Accept" in response["Vary"]
    again = browse(path, **{"If-None-Match": page["ETag"]})
    assert again.status_code == 304 and again["ETag"] == page["ETag"] and "Accept" in again["Vary"]
    # The page's ETag is not the XML's: a client asking for the XML with it gets the XML.
    assert Client().get(path, headers={"If-None-Match": page["ETag"]}).status_code == 200
    assert browse(path, **{"If-None-Match": xml["ETag"]}).content == page.content
    assert Client().get(path, headers={"If-None-Match": xml["ETag"]}).status_code == 304
    if xml.get("Last-Modified"):
        assert browse(path, **{"If-Modified-Since": xml["Last-Modified"]}).status_code == 304
    head = Client().head(path, headers={"Accept": BROWSER})
    assert head.status_code == 200 and head["Content-Type"] == page["Content-Type"] and head["ETag"] == page["ETag"]
    assert head.content == b"" and "Accept" in head["Vary"]


def test_a_range_request_applies_to_the_xml_only(published):
    body = fetch(STORED)[1]
    status, part, response = fetch(STORED, Range="bytes=0-99")
    assert status == 206 and part == body[:100]
    response = browse(STORED, Range="bytes=0-99")
    assert response.status_code == 200 and "Content-Range" not in response and page_of(response).xpath("string(//h1)")


def test_with_html_pages_off_a_browser_gets_the_xml_and_nothing_varies(published, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "HTML_PAGES": False}
    for path in (STORED, LIVE, DESCRIPTION):
        status, body, response = fetch(path, Accept=BROWSER)
        assert status == 200 and body == fetch(path)[1] and response["Content-Type"] == "application/xml"
        assert "Accept" not in response.get("Vary", "")


def test_served_by_redirect_a_browser_still_gets_the_page(published, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "SERVE_BY_REDIRECT": True}
    response = Client().get("/resourcesync/metadata/resourcelist.xml")
    assert response.status_code == 302 and "Accept" in response["Vary"]
    assert page_of(browse(STORED)).xpath("string(//h1)") == "Resource List"


# -- sets for partners ----------------------------------------------------------------------


def test_a_partners_set_shows_its_page_to_a_token_for_it_only(seed, committing):
    with committing():
        seed(3)
    partners = demo_set("all-records")
    other = demo_set("metadata")
    other.access = "token"
    other.save()
    rebuild_set(partners)
    for name in ("capabilitylist.xml", "resourcelist.xml", "changelist.xml"):
        path = f"/resourcesync/all-records/{name}"
        refused = browse(path)
        assert refused.status_code == 401 and b"<url" not in refused.content and b"<tr" not in refused.content
        wrong = access.issue("Elsewhere", [other])[1]
        assert browse(path, Authorization=f"Bearer {wrong}").status_code == 403
        token = access.issue("Partner Library", [partners])[1]
        response = browse(path, Authorization=f"Bearer {token}")
        assert page_of(response).xpath("string(//h1)") == pages.kind(name.removesuffix(".xml"))
        assert "private" in response["Cache-Control"] and {"Accept", "Authorization"} <= {
            value.strip() for value in response["Vary"].split(",")
        }
        xml = Client().get(path, headers={"Authorization": f"Bearer {token}"})
        assert xml.status_code == 200 and xml["Content-Type"] == "application/xml"


# -- over HTTP: resync and urllib, and Chromium ---------------------------------------------


@pytest.fixture
def source(live_server, settings, transactional_db):
    """A running Source, with the app's stylesheet named in its documents too."""
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BASE_URL": live_server.url, "STYLESHEET": True}
    return live_server.url


def get(url, accept=None):
    request = urllib.request.Request(url, headers={} if accept is None else {"Accept": accept})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read(), response.headers


def test_resync_and_plain_clients_read_the_xml_as_published(source, seed, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 3}
    publish_example(seed)
    for path in OPENED.values():
        published = fetch(path)[1]
        for accept in (None, "*/*", "application/xml"):
            body, headers = get(source + path, accept)
            assert body == published and headers["Content-Type"] == "application/xml", (path, accept)
            assert "Accept" in headers["Vary"]
        body, headers = get(source + path, BROWSER)
        assert headers["Content-Type"] == "text/html; charset=utf-8" and body != published
    description = SourceDescription()
    description.read(uri=f"{source}/.well-known/resourcesync")
    assert len(description.resources) == 3
    capability_list = CapabilityList()
    capability_list.read(uri=f"{source}/resourcesync/metadata/capabilitylist.xml")
    assert capability_list.link("up")["href"] == f"{source}/.well-known/resourcesync"
    listing = ResourceList(allow_multifile=True)
    listing.read(uri=f"{source}/resourcesync/metadata/resourcelist.xml")  # an index: its parts too
    assert len(listing) == Item.objects.filter(is_public=True).count() > 3
    changes = ChangeList()
    changes.read(uri=f"{source}/resourcesync/metadata/changelist.xml")
    assert {change.change for change in changes} >= {"updated", "deleted"}


def test_chromium_opens_each_document_as_a_page_made_by_the_server_with_no_xslt(source, seed, browser, monkeypatch):
    publish_example(seed, items=3)
    for name, path in OPENED.items():
        body, headers = get(source + path, "*/*")  # what curl gets: the XML, naming the stylesheet
        assert headers["Content-Type"] == "application/xml" and b"<?xml-stylesheet" in body
        doc = etree.fromstring(body)
        listed = [entry.find(f"{{{SM}}}loc").text for entry in entries(doc)]
        browser.get(source + path)
        assert browser.driver.execute_script("return document.contentType") == "text/html"
        # No XSLT: no banner, no processing instruction, the page the server sent.
        assert browser.driver.execute_script(
            "return [...document.childNodes].some(n => n.nodeType === Node.PROCESSING_INSTRUCTION_NODE)"
        ) is False
        assert not browser.find_all("xslt-warning-banner")
        assert "xslt" not in browser.driver.page_source.lower()
        assert browser.find("h1").text == heading(doc)
        assert [a.get_attribute("href") for a in browser.find_all("table tbody tr td.loc a")] == listed, path
        assert browser.find("p.count").text == f"{len(listed)} entr{'y' if len(listed) == 1 else 'ies'}"
        if name != "source-description":
            assert browser.find("header dd a").get_attribute("href") == link(doc, "up")
        browser.keep(name)
    # A document longer than a page: its first entries, and how many more the XML has.
    monkeypatch.setattr(pages, "SHOWN", 2)
    browser.get(source + OPENED["changelist"])
    assert len(browser.find_all("table tbody tr")) == 2
    assert browser.find("p.cut").text == "This page shows the first 2 entries. 1 more: download the XML."
    browser.keep("cut")
    # Its XML link opens the XML (which the browser then shows through the stylesheet).
    browser.find("a.raw").click()
    browser.wait_for(lambda driver: driver.current_url.endswith("?format=xml"))
    assert "through the Source's stylesheet" in browser.find("footer").text  # the XSLT's page
