"""Every link the Source publishes resolves: a crawler starts at the Source Description of a Source
set up as the demo is (every capability, prior versions on), and follows each ``<loc>`` and
``rs:ln href`` it reaches, in the documents, in the manifests inside the dump packages, in the
Memento TimeMaps and in the ``Link`` headers, breadth first, each URL once, on the Source's own
origin only; then it lists every URL that answered 4xx or 5xx, with the pages that link it.

What a change entry says of a time before a resource left the set need not resolve after: a
Change List entry or a Change Dump manifest entry at ``T`` tells what a change at ``T`` left. When
the Change Lists record that a URI was deleted since (its latest change), that URI, and the links
of its entries of changes made before, may answer 404: the resource, its mementos, TimeMap and
TimeGate are not served once it has left the set (docs/versions.rst, "What leaves a set").
Nothing else is excused: a Resource List (current or archived) and a Resource Dump leave out a
resource as soon as it leaves the set (docs/dumps.rst, "When a resource leaves the set").
"""

import collections
import datetime
import io
import re
import zipfile
from dataclasses import dataclass
from urllib.parse import urljoin

import pytest
from django.core.files.base import ContentFile
from django.core.management import call_command
from django.test import Client
from lxml import etree

from django_resourcesync.builders import changedump
from django_resourcesync.models import ResourceSet
from django_resourcesync.rebuild import rebuild_set
from example_project.repository.models import Item, ItemFile

from .conftest import demo_set

ORIGIN = "http://testserver"
SM = "http://www.sitemaps.org/schemas/sitemap/0.9"
RS = "http://www.openarchives.org/rs/terms/"
LINK_FORMAT = "application/link-format"
#: One link of a TimeMap or a ``Link`` header (RFC 6690, RFC 8288): ``<uri>`` and its parameters.
LINK_VALUE = re.compile(r'<([^>]*)>((?:\s*;\s*[\w*-]+(?:\s*=\s*(?:"[^"]*"|[^,;]*))?)*)')
REL = re.compile(r';\s*rel\s*=\s*(?:"([^"]*)"|([^;,\s]+))')


@dataclass(frozen=True)
class Link:
    target: str
    page: str  #: the URL whose answer holds it
    rel: str = ""
    at: datetime.datetime | None = None  #: the time the entry holding it describes, if any
    about: str = ""  #: the ``<loc>`` of the entry holding it


def _moment(value):
    return datetime.datetime.fromisoformat(value) if value else None


def _xml_links(page, root):
    """The links of a ResourceSync document (or a manifest): each entry's ``<loc>`` and ``rs:ln``
    with the time of the change the entry tells of (its ``datetime``; none for a snapshot's
    entry), the document's own ``rs:ln`` and its stylesheet."""
    found = []
    for ln in root.findall(f"{{{RS}}}ln"):
        found.append(Link(ln.get("href"), page, ln.get("rel", "")))
    for entry in [*root.findall(f"{{{SM}}}url"), *root.findall(f"{{{SM}}}sitemap")]:
        loc = entry.findtext(f"{{{SM}}}loc").strip()
        md = entry.find(f"{{{RS}}}md")
        when = _moment(md.get("datetime")) if md is not None and md.get("datetime") else None
        found.append(Link(loc, page, "", when, loc))
        for ln in entry.findall(f"{{{RS}}}ln"):
            found.append(Link(ln.get("href"), page, ln.get("rel", ""), when, loc))
    for node in root.itersiblings(preceding=True):
        if isinstance(node, etree._ProcessingInstruction) and node.target == "xml-stylesheet":
            found.append(Link(urljoin(page, node.get("href")), page, "stylesheet"))
    return found


def _changes(root):
    """``[(loc, change, datetime)]`` of the entries of a Change List or Change Dump manifest."""
    found = []
    for entry in root.findall(f"{{{SM}}}url"):
        md = entry.find(f"{{{RS}}}md")
        if md is not None and md.get("change") and md.get("datetime"):
            found.append((entry.findtext(f"{{{SM}}}loc").strip(), md.get("change"), _moment(md.get("datetime"))))
    return found


def _link_values(page, text):
    found = []
    for match in LINK_VALUE.finditer(text):
        rel = REL.search(match.group(2) or "")
        found.append(Link(urljoin(page, match.group(1)), page, (rel.group(1) or rel.group(2)) if rel else ""))
    return found


@dataclass
class Crawl:
    statuses: dict  #: ``{url: response}``
    links: list  #: every :class:`Link` found, same-origin or not
    changes: list  #: every ``(loc, change, datetime)`` of the Change Lists and Change Dump manifests

    def gone(self):
        """``{uri: datetime}`` of the URIs whose latest recorded change is a deletion."""
        latest = {}
        for loc, change, moment in sorted(self.changes, key=lambda c: c[2]):
            latest[loc] = (change, moment)
        return {loc: moment for loc, (change, moment) in latest.items() if change == "deleted"}

    def dead(self):
        """``{url: (status, [pages linking it])}`` of the URLs that answer 4xx or 5xx to a link
        that is not excused (see the module's docstring)."""
        gone = self.gone()

        def excused(link, response):
            if link.rel == "hub":  # WebSub: subscription requests are POSTed to the hub
                return response.status_code == 405 and "POST" in response.get("Allow", "")
            if link.at is None or response.status_code not in (404, 410):
                return False
            left = [gone[uri] for uri in (link.target, link.about) if uri in gone]
            return any(link.at <= moment for moment in left)

        found = collections.defaultdict(list)
        for link in self.links:
            url = link.target.split("#")[0]
            response = self.statuses.get(url)  # None: not on the Source's origin, not fetched
            if response is not None and response.status_code >= 400 and not excused(link, response):
                if link.page not in found[url]:
                    found[url].append(link.page)
        return {url: (self.statuses[url].status_code, pages) for url, pages in found.items()}


def crawl(client, start):
    """Fetch ``start`` and every same-origin URL reachable from it, breadth first, each once."""
    result = Crawl({}, [], [])
    queue = collections.deque([start])
    seen = {start}
    while queue:
        page = queue.popleft()
        response = client.get(page[len(ORIGIN):])
        body = b"".join(response.streaming_content) if response.streaming else response.content
        result.statuses[page] = response
        found = _link_values(page, response.get("Link", ""))
        if 300 <= response.status_code < 400:
            found.append(Link(urljoin(page, response["Location"]), page, "location"))
        content_type = response.get("Content-Type", "").split(";")[0].strip()
        if response.status_code == 200:
            root = None
            if content_type.endswith("xml"):
                root = etree.fromstring(body)
            elif content_type == "application/zip":
                with zipfile.ZipFile(io.BytesIO(body)) as package:
                    root = etree.fromstring(package.read("manifest.xml"))
            elif content_type == LINK_FORMAT:
                found += _link_values(page, body.decode())
            if root is not None:
                found += _xml_links(page, root)
                result.changes += _changes(root)
        result.links += found
        for link in found:
            target = link.target.split("#")[0]
            if target.startswith(ORIGIN + "/") and target not in seen:
                seen.add(target)
                queue.append(target)
    return result


@pytest.fixture
def demo_source(db, seed, committing, settings, tmp_path, documents_storage):
    """The demo as ``dev.py demo`` prepares it (every capability on every set, the dumps where
    the source gives bytes, prior versions where it gives bytes), a few items published, then
    changes of every kind (an update, a deletion, a creation) and the Change Dumps' packages."""
    settings.VAR_DIR = tmp_path
    for slug in ("bitstreams", "metadata", "pages", "all-records"):
        demo_set(slug)
    call_command("prepare_demo", stdout=io.StringIO())
    with committing():
        seed(4)
    sets = list(ResourceSet.objects.all())
    assert all(s.prior_versions for s in sets if s.slug in ("bitstreams", "metadata", "pages"))
    for resource_set in sets:
        rebuild_set(resource_set)
    files = list(ItemFile.objects.filter(item__is_public=True).order_by("pk"))
    with committing():
        files[0].file.save("rewritten.txt", ContentFile(b"the file, rewritten\n" * 50))
    with committing():
        Item.objects.filter(pk=files[-1].item_id).delete()
    with committing():
        seed(1)
    for resource_set in sets:
        while changedump.package_changes(resource_set) is not None:
            pass
    return sets


def _check(found):
    dead = found.dead()
    report = "\n".join(
        f"  {status} {url}\n      linked from {', '.join(pages)}" for url, (status, pages) in sorted(dead.items())
    )
    assert not dead, f"{len(dead)} of the {len(found.statuses)} URLs crawled answer 4xx/5xx:\n{report}"


@pytest.mark.parametrize("rebuilt", [False, True], ids=["between-rebuilds", "after-a-rebuild"])
def test_every_link_reachable_from_the_source_description_resolves(demo_source, rebuilt):
    if rebuilt:
        for resource_set in demo_source:
            rebuild_set(resource_set)
    found = crawl(Client(), f"{ORIGIN}/.well-known/resourcesync")

    # It went everywhere: the documents of every capability, dump packages, mementos, TimeMaps
    # and TimeGates of resources changed and not, the site's own files and pages.
    crawled = " ".join(found.statuses)
    for part in ("/capabilitylist.xml", "/resourcelist.xml", "/changelist.xml", "/resourcedump.xml", "/changedump/",
                 "-archive.xml", "/memento/", "/timemap/", "/timegate/", "/items/", "/files/", "/resourcesync/hub"):
        assert part in crawled, part
    if rebuilt:
        assert re.search(r"/resourcedump/\S+\.zip", crawled), "the Resource Dump's packages"
    assert [link for link in found.links if link.rel == "timemap" and link.about.endswith("/item-2.txt")], (
        "the TimeMap of a resource not changed since it was listed"
    )
    assert found.gone(), "the deletion, recorded in the Change Lists"
    _check(found)
