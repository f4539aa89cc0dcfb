"""Discovery (spec section 6.3) and links to related resources (section 14): Link headers on the
resources, <link rel="resourcesync"> on the landing pages, robots.txt, describedby, the
section 14 helpers, and a Source Description Index."""

import datetime
import re

import pytest
from django.core import checks
from django.db import DatabaseError
from django.http import HttpResponse
from django.test import Client, RequestFactory
from django.urls import NoReverseMatch
from django.utils import timezone
from lxml import etree

from django_resourcesync import discovery, links
from django_resourcesync.models import ResourceSet
from django_resourcesync.rebuild import rebuild_set
from example_project.repository.models import Item, ItemFile

from .conftest import demo_set
from .helpers import fetch, path_of, resource_list_entries
from .xmlcheck import RS, SM, check_document, entries, link

pytestmark = pytest.mark.django_db

CAPABILITY_LIST = "http://testserver/resourcesync/{}/capabilitylist.xml"
LINK_RE = re.compile(r'<([^>]+)>;\s*rel="resourcesync"')


@pytest.fixture
def published(seed, documents_storage):
    """The example's three sets, seeded with 8 items and built."""
    seed(8)
    sets = [demo_set(slug) for slug in ("bitstreams", "metadata", "pages")]
    for resource_set in sets:
        rebuild_set(resource_set)
    return sets


def resourcesync_links(response):
    return LINK_RE.findall(response.headers.get("Link", ""))


def sampled(resource_set, count=3):
    """Paths of a few resources of the set, as its Resource List lists them."""
    locs = [entry.find(f"{{{SM}}}loc").text for entry in resource_list_entries(resource_set)]
    assert locs, resource_set
    return [path_of(loc) for loc in locs[:: max(1, len(locs) // count)][:count]]


def test_every_listed_resource_answers_with_a_link_to_its_sets_capability_list(published):
    # The files' views send Last-Modified only once the second of their last change is over.
    ItemFile.objects.update(modified=timezone.now() - datetime.timedelta(seconds=2))
    client = Client()
    for resource_set in published:
        expected = [CAPABILITY_LIST.format(resource_set.slug)]
        for path in sampled(resource_set):
            get = client.get(path)
            assert get.status_code == 200, path
            assert resourcesync_links(get) == expected, (path, get.headers.get("Link"))
            head = client.head(path)
            assert head.status_code == 200 and resourcesync_links(head) == expected
            # A Destination fetching it again, unchanged, is told so: with the link still.
            validator = (
                {"if-none-match": get.headers["ETag"]} if "ETag" in get.headers
                else {"if-modified-since": get.headers["Last-Modified"]}
            )
            again = client.get(path, headers=validator)
            assert again.status_code == 304 and resourcesync_links(again) == expected, path


def test_pages_that_are_not_resources_and_the_documents_get_no_link(published):
    client = Client()
    for path in ("/", "/about/resourcesync/", "/.well-known/resourcesync", "/resourcesync/pages/resourcelist.xml",
                 "/items/99999/"):
        assert resourcesync_links(client.get(path)) == [], path


def test_a_private_item_and_its_files_get_no_link(published):
    item = Item.objects.order_by("pk").first()
    files = list(item.files.all())
    item.is_public = False
    item.save()
    client = Client()
    for path in [item.get_absolute_url(), item.get_metadata_url(), *(f.get_absolute_url() for f in files)]:
        response = client.get(path)
        assert response.status_code == 404 and resourcesync_links(response) == [], path
    assert "resourcesync" not in client.get(item.get_absolute_url()).content.decode()


def test_a_resource_in_two_sets_links_both(published):
    theses = ResourceSet.objects.create(
        name="Files of the theses", slug="theses-files", source="bitstreams", lookups={"item__collection__slug": "theses"},
        capabilities=["resourcelist"], position=5,
    )
    rebuild_set(theses)
    in_both = ItemFile.objects.filter(item__collection__slug="theses").order_by("pk").first()
    elsewhere = ItemFile.objects.exclude(item__collection__slug="theses").order_by("pk").first()
    assert resourcesync_links(Client().get(in_both.get_absolute_url())) == [
        CAPABILITY_LIST.format("bitstreams"), CAPABILITY_LIST.format("theses-files")
    ]
    assert resourcesync_links(Client().get(elsewhere.get_absolute_url())) == [CAPABILITY_LIST.format("bitstreams")]
    # A disabled set is not linked.
    ResourceSet.objects.filter(pk=theses.pk).update(enabled=False)
    assert resourcesync_links(Client().get(in_both.get_absolute_url())) == [CAPABILITY_LIST.format("bitstreams")]


def test_existing_link_headers_are_kept_and_the_decorator_links_one_view(published):
    path = sampled(published[1], 1)[0]
    request = RequestFactory().get(path)

    def view(request):
        response = HttpResponse("record")
        response["Link"] = '<http://testserver/licence>; rel="license"'
        return response

    response = discovery.link_resourcesync(view)(request)
    assert response.headers["Link"] == (
        f'<http://testserver/licence>; rel="license", <{CAPABILITY_LIST.format("metadata")}>; rel="resourcesync"'
    )
    # Through the middleware too, and never twice.
    response = discovery.ResourceSyncLinkMiddleware(discovery.link_resourcesync(view))(RequestFactory().get(path))
    assert resourcesync_links(response) == [CAPABILITY_LIST.format("metadata")]
    assert "license" in response.headers["Link"]


def test_the_lookup_is_one_query_per_response(published):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    path = sampled(published[0], 1)[0]
    middleware = discovery.ResourceSyncLinkMiddleware(lambda request: HttpResponse("bytes"))
    with CaptureQueriesContext(connection) as queries:
        response = middleware(RequestFactory().get(path))
    # The test's own transaction adds a savepoint around it; outside one, there is none.
    assert len([q for q in queries if not q["sql"].upper().startswith(("SAVEPOINT", "RELEASE"))]) == 1
    assert resourcesync_links(response) == [CAPABILITY_LIST.format("bitstreams")]


def test_the_lookup_probes_each_sets_records_by_uri_and_never_reads_them_all(published):
    """A response waits on the lookup: among many records it must find the URI through the
    records' (set, URI) index, set by set, even where the database was never told the tables'
    sizes (SQLite before ``ANALYZE``: a join let it read every record)."""
    from django.db import connection

    from django_resourcesync import access
    from django_resourcesync.models import Build, Resource

    bitstreams = published[0]
    Resource.objects.bulk_create([
        Resource(resource_set=bitstreams, object_pk=f"x{n}", uri=f"http://testserver/many/{n}", entry_xml="<url/>")
        for n in range(20000)
    ], batch_size=2000)
    params = [Build.Status.PUBLISHED, "http://testserver/many/5", True, access.TOKEN]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"ANALYZE {Resource._meta.db_table}")  # as autovacuum would after such a load
            cursor.execute("EXPLAIN " + discovery._lookup_sql(connection), params)
        else:
            cursor.execute("EXPLAIN QUERY PLAN " + discovery._lookup_sql(connection), params)
        plan = "\n".join(str(row[-1]) for row in cursor.fetchall())
    if connection.vendor == "postgresql":
        assert "resourcesync_resource_uri" in plan and f"Seq Scan on {Resource._meta.db_table} " not in plan, plan
    else:
        assert "SEARCH r USING" in plan and "resource_set_id=? AND uri=?" in plan and "SCAN r" not in plan, plan
    assert discovery.capability_lists_for("http://testserver/many/5") == [CAPABILITY_LIST.format("bitstreams")]


def test_landing_pages_carry_the_html_link_and_it_does_not_depend_on_their_records(published):
    pages = published[2]
    for path in sampled(pages):
        status, body, response = fetch(path)
        assert status == 200
        head = etree.HTML(body).find("head")
        assert [e.get("href") for e in head.iter("link") if e.get("rel") == "resourcesync"] == [CAPABILITY_LIST.format("pages")]
        assert resourcesync_links(response) == [CAPABILITY_LIST.format("pages")]
    # The page's bytes are those listed: the link is there whether the record is written yet or not.
    pages.resources.all().delete()
    for entry in resource_list_entries(pages):
        status, body, _ = fetch(path_of(entry.find(f"{{{SM}}}loc").text))
        md = entry.find(f"{{{RS}}}md")
        assert len(body) == int(md.get("length"))


def test_pages_rendered_in_one_batch_read_the_sets_once_and_a_change_shows_in_the_next(published):
    """A batch of changes renders many landing pages: they share one reading of the public sets
    (a query a page otherwise); a set disabled meanwhile is gone from the next batch's pages."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_resourcesync import rendering

    pages = published[2]
    items = list(Item.objects.filter(is_public=True).order_by("pk")[:4])
    source = pages.get_source()

    def rendered():
        with CaptureQueriesContext(connection) as queries, rendering.batch():
            bodies = [source.content(item)[0] for item in items]
        reads = [q for q in queries if 'FROM "resourcesync_resourceset"' in q["sql"]]
        return bodies, len(reads)

    bodies, reads = rendered()
    assert reads == 1
    assert all(CAPABILITY_LIST.format("pages").encode() in body for body in bodies)
    ResourceSet.objects.filter(pk=pages.pk).update(capabilities=[])  # no signal, no save: only read again
    bodies, reads = rendered()
    assert reads == 1
    assert not any(b'rel="resourcesync"' in body for body in bodies)


def test_the_context_processor_gives_the_links_of_the_current_page(published):
    from django_resourcesync.context_processors import resourcesync

    path = sampled(published[1], 1)[0]
    assert list(resourcesync(RequestFactory().get(path))["resourcesync_capability_lists"]) == [
        CAPABILITY_LIST.format("metadata")
    ]
    assert not resourcesync(RequestFactory().get("/"))["resourcesync_capability_lists"]


def test_a_client_from_a_resource_alone_reaches_the_source_description(published):
    """HTTP Link to the Capability List, its up link to the Source Description, which lists it."""
    path = sampled(published[0], 1)[0]
    (capability_list,) = resourcesync_links(Client().get(path))
    status, body, _ = fetch(path_of(capability_list))
    up = link(check_document(body, "capabilitylist"), "up")
    status, body, _ = fetch(path_of(up))
    assert status == 200
    description = check_document(body, "description")
    assert capability_list in [e.find(f"{{{SM}}}loc").text for e in entries(description)]


def test_robots_txt_lists_exactly_the_published_resource_lists_of_enabled_sets(published):
    lists = [f"http://testserver/resourcesync/{slug}/resourcelist.xml" for slug in ("bitstreams", "metadata", "pages")]
    response = Client().get("/robots.txt")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    body = response.content.decode()
    assert [line.split(" ", 1)[1] for line in body.splitlines() if line.startswith("Sitemap:")] == lists
    assert body.startswith("User-agent: *\n")
    ResourceSet.objects.filter(slug="metadata").update(enabled=False)
    ResourceSet.objects.create(name="Never built", slug="unbuilt", source="bitstreams", capabilities=["resourcelist"])
    assert discovery.robots_lines() == [f"Sitemap: {lists[0]}", f"Sitemap: {lists[2]}"]
    assert Client().post("/robots.txt").status_code == 405


def test_describedby_on_the_source_description_and_each_capability_list(published, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "SOURCE_DESCRIBEDBY": "/about/resourcesync/"}
    status, body, _ = fetch("/.well-known/resourcesync")
    description = check_document(body, "description")
    assert link(description, "describedby") == "http://testserver/about/resourcesync/"
    for entry in entries(description):
        slug = entry.find(f"{{{SM}}}loc").text.split("/")[-2]
        assert entry.find(f"{{{RS}}}ln").get("href") == f"http://testserver/about/sets/{slug}/"
        status, body, _ = fetch(f"/resourcesync/{slug}/capabilitylist.xml")
        assert link(check_document(body, "capabilitylist"), "describedby") == f"http://testserver/about/sets/{slug}/"
        assert fetch(f"/about/sets/{slug}/")[0] == 200
    assert fetch("/about/resourcesync/")[0] == 200


def test_the_set_form_takes_a_path_or_a_url_for_describedby(admin_client):
    from django_resourcesync.admin import ResourceSetForm

    values = {"name": "S", "slug": "s", "source": "bitstreams", "lookups": "{}", "capabilities": ["resourcelist"], "position": 0}
    for good in ("/about/s/", "https://example.org/about"):
        assert ResourceSetForm(data={**values, "describedby": good}).is_valid(), good
    for bad in ("javascript:alert(1)", "//elsewhere.example/x", "about"):
        form = ResourceSetForm(data={**values, "describedby": bad})
        assert not form.is_valid() and "describedby" in form.errors, bad


def test_the_records_carry_their_profile_and_the_pages_their_metadata(published):
    (record, *_) = resource_list_entries(published[1])
    found = {ln.get("rel"): ln.get("href") for ln in record.findall(f"{{{RS}}}ln")}
    assert found["profile"] == "http://www.openarchives.org/OAI/2.0/oai_dc/"
    assert found["describes"].startswith("http://testserver/items/")
    (page, *_) = resource_list_entries(published[2])
    (describedby,) = page.findall(f"{{{RS}}}ln")
    assert describedby.get("rel") == "describedby" and describedby.get("href").endswith("/metadata.xml")


# --- section 14 helpers -----------------------------------------------------------------------


def test_the_helpers_make_each_relation_of_section_14():
    moment = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    mirror = "https://mirror.example/a"
    assert links.duplicate(mirror, pri=1) == {"rel": "duplicate", "href": mirror, "pri": 1}
    assert links.alternate("/a.pdf", type="application/pdf")["type"] == "application/pdf"
    assert links.patch("/a.patch", type="application/json-patch", path="/changes/a.patch") == {
        "rel": "http://www.openarchives.org/rs/terms/patch", "href": "/a.patch", "type": "application/json-patch",
        "path": "/changes/a.patch",
    }
    assert links.memento("/a?v=1", modified=moment)["modified"] == moment
    for helper, rel in ((links.canonical, "canonical"), (links.collection, "collection"), (links.via, "via"),
                        (links.timegate, "timegate"), (links.timemap, "timemap"), (links.profile, "profile"),
                        (links.describedby, "describedby"), (links.describes, "describes")):
        assert helper("/x") == {"rel": rel, "href": "/x"}


@pytest.mark.parametrize("make, message", [
    (lambda: links.duplicate("/m", pri=0), "pri 0 is not an integer from 1 to 999999"),
    (lambda: links.patch("/p", type=None), "a patch link must give the media type"),
    (lambda: links.memento("/m", modified=None), "a memento link must give the datetime"),
    (lambda: links.memento("/m", modified=datetime.datetime(2026, 1, 1)), "is not an aware datetime"),
    (lambda: links.alternate("/a", type="pdf"), "is not a media type"),
    (lambda: links.patch("/p", type="text/x-diff", path="changes/"), "must start with '/'"),
    (lambda: links.link("Not A Rel", "/x"), "neither a registered relation type"),
    (lambda: links.link("via", "/x", colour="red"), "unknown attribute(s) colour"),
    (lambda: links.describedby("/x", hash="md5:xyz"), "hash 'md5:xyz'"),
    (lambda: links.via(""), "it has no href"),
])
def test_a_link_a_destination_could_not_use_is_refused_with_the_reason(make, message):
    with pytest.raises(links.InvalidLink, match=re.escape(message)):
        make()


def test_the_database_check_warns_of_a_source_whose_links_are_invalid(published, monkeypatch):
    from example_project.repository.resourcesync import MetadataRecordSource

    assert [e for e in checks.run_checks(databases=["default"]) if e.id == "resourcesync.W007"] == []
    monkeypatch.setattr(MetadataRecordSource, "links", lambda self, obj: [{"rel": "memento", "href": "/v1"}])
    (error,) = [e for e in checks.run_checks(databases=["default"]) if e.id == "resourcesync.W007" and e.obj.slug == "metadata"]
    assert "metadata" in error.msg and "memento link must give the datetime" in error.msg
    assert error.hint


# --- Source Description Index -----------------------------------------------------------------


def test_a_source_with_more_sets_than_one_document_lists_publishes_a_source_description_index(published, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 2}
    status, body, response = fetch("/.well-known/resourcesync")
    assert status == 200
    index = check_document(body, "description")
    assert index.tag == f"{{{SM}}}sitemapindex"
    listed = []
    for sitemap in entries(index):
        status, part_body, _ = fetch(path_of(sitemap.find(f"{{{SM}}}loc").text))
        assert status == 200
        part = check_document(part_body, "description", max_entries=2)
        assert part.tag == f"{{{SM}}}urlset"
        assert link(part, "index") == "http://testserver/.well-known/resourcesync"
        listed += [e.find(f"{{{SM}}}loc").text for e in entries(part)]
    assert listed == [CAPABILITY_LIST.format(slug) for slug in ("bitstreams", "metadata", "pages")]
    assert fetch("/.well-known/resourcesync/3.xml")[0] == 404
    # With fewer sets than the limit, a single document again, and the parts are gone.
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 50_000}
    assert check_document(fetch("/.well-known/resourcesync")[1], "description").tag == f"{{{SM}}}urlset"
    assert fetch("/.well-known/resourcesync/1.xml")[0] == 404



def test_the_encoding_hook_gives_rs_md_encoding_in_lists_and_changes(published, monkeypatch, django_capture_on_commit_callbacks):
    from example_project.repository.resourcesync import ItemPageSource

    pages = published[2]  # described again on every pass (its fingerprint does not cover the entry)
    monkeypatch.setattr(ItemPageSource, "encoding", lambda self, obj: "gzip" if obj.pk % 2 else "not a token")
    with django_capture_on_commit_callbacks(execute=True):
        rebuild_set(pages)
    encodings = {
        path_of(e.find(f"{{{SM}}}loc").text): e.find(f"{{{RS}}}md").get("encoding") for e in resource_list_entries(pages)
    }
    assert encodings == {item.get_absolute_url(): ("gzip" if item.pk % 2 else None) for item in Item.objects.all()}
    status, body, _ = fetch("/resourcesync/pages/changelist.xml")
    changed = [e.find(f"{{{RS}}}md") for e in entries(check_document(body, "changelist"))]
    assert len(changed) == Item.objects.count() // 2, "a change of encoding is an update of the resource"
    assert {(md.get("change"), md.get("encoding")) for md in changed} == {("updated", "gzip")}


@pytest.mark.parametrize("failure", [NoReverseMatch("the app's URLs are not included"), DatabaseError("connection lost")])
def test_a_lookup_that_fails_leaves_the_response_as_it_was(published, monkeypatch, failure):
    path = sampled(published[0], 1)[0]

    def fail(uri):
        raise failure

    monkeypatch.setattr(discovery, "capability_lists_for", fail)
    response = discovery.ResourceSyncLinkMiddleware(lambda request: HttpResponse("bytes"))(RequestFactory().get(path))
    assert response.status_code == 200 and "Link" not in response.headers


def test_a_set_that_has_published_nothing_yet_is_not_linked(published):
    """Its Capability List answers 404 until its first build: no header points there."""
    from django_resourcesync import tracking

    unbuilt = ResourceSet.objects.create(name="Unbuilt", slug="unbuilt", source="bitstreams", capabilities=["resourcelist"])
    tracking.reconcile(unbuilt)  # recorded, not built
    path = sampled(published[0], 1)[0]
    assert resourcesync_links(Client().get(path)) == [CAPABILITY_LIST.format("bitstreams")]
    rebuild_set(unbuilt)
    # In Source Description order: position, then slug (the new set's position is 0).
    assert resourcesync_links(Client().get(path)) == [CAPABILITY_LIST.format("unbuilt"), CAPABILITY_LIST.format("bitstreams")]


def test_a_landing_page_stays_up_when_a_set_of_its_source_is_broken(published):
    ResourceSet.objects.create(
        name="Broken", slug="broken-pages", source="pages", lookups={"no_such_field": 1}, capabilities=["resourcelist"]
    )
    item = Item.objects.order_by("pk").first()
    response = Client().get(item.get_absolute_url())
    assert response.status_code == 200
    assert resourcesync_links(response) == [CAPABILITY_LIST.format("pages")]
    assert CAPABILITY_LIST.format("pages") in response.content.decode()


def test_a_file_name_with_reserved_characters_gets_its_link(published, committing):
    from django.core.files.base import ContentFile

    item = Item.objects.order_by("pk").first()
    with committing():
        odd = ItemFile(item=item, name="a=b;c d.txt")
        odd.file.save("odd.txt", ContentFile(b"odd"), save=False)
        odd.save()
    rebuild_set(published[0])
    listed = [path_of(e.find(f"{{{SM}}}loc").text) for e in resource_list_entries(published[0])]
    (path,) = [p for p in listed if p.endswith(".txt") and "a=b" in p]
    assert resourcesync_links(Client().get(path)) == [CAPABILITY_LIST.format("bitstreams")]


def test_the_database_check_reports_a_helper_that_refuses_a_link(published, monkeypatch):
    from example_project.repository.resourcesync import MetadataRecordSource

    monkeypatch.setattr(MetadataRecordSource, "links", lambda self, obj: [links.memento("/v1", modified=None)])
    (warning,) = [e for e in checks.run_checks(databases=["default"]) if e.id == "resourcesync.W007" and e.obj.slug == "metadata"]
    assert "InvalidLink" in warning.msg and "memento link must give the datetime" in warning.msg


def test_a_patch_link_is_published_without_a_package_path(published, monkeypatch):
    """No entry the app writes has a package member for a change description to point at."""
    from example_project.repository.resourcesync import ItemPageSource

    monkeypatch.setattr(
        ItemPageSource, "links", lambda self, obj: [links.patch(f"/patches/{obj.pk}.diff", type="text/x-diff", path="/p.diff")]
    )
    rebuild_set(published[2])
    (page, *_) = resource_list_entries(published[2])
    (patch,) = page.findall(f"{{{RS}}}ln")
    first = Item.objects.order_by("pk").first()
    assert dict(patch.attrib) == {"rel": links.PATCH, "href": f"http://testserver/patches/{first.pk}.diff", "type": "text/x-diff"}


def test_the_source_description_is_split_by_its_bytes_too(published, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_DOCUMENT_BYTES": 10_000}
    long_path = "/about/" + "a" * 2000 + "/"
    ResourceSet.objects.filter(slug__in=["bitstreams", "metadata", "pages"]).update(describedby=long_path)
    status, body, _ = fetch("/.well-known/resourcesync")
    index = check_document(body, "description")
    assert index.tag == f"{{{SM}}}sitemapindex" and len(entries(index)) >= 2
    for sitemap in entries(index):
        status, part, _ = fetch(path_of(sitemap.find(f"{{{SM}}}loc").text))
        assert status == 200 and len(part) <= 10_000
        check_document(part, "description")


# --- the request's URI in the records' form, whatever characters a name has -------------------


ESCAPE_RE = re.compile(r"%[0-9A-Fa-f]{2}")
# Each name is escaped by reverse() as the records write it: "%" as %25, space, "?" and "#" escaped,
# the sub-delimiters (+ ; = ' ( ) ...) and "~" as themselves, other letters as their UTF-8 octets.
ODD_NAMES = ["100% cotton.txt", "50*.txt", "sp%20ace.txt", "a+b=c;d.txt", "it's (draft)~1.txt", "café über.txt",
             "what?#1.txt"]
# Served by the site and listed by no set. "50%2A.txt" decoded and encoded again as it was would
# be "50%2A.txt": the URI of "50*.txt", which is listed.
UNLISTED_NAMES = ["100% wool.txt", "50%2A.txt"]


def add_file(item, name):
    from django.core.files.base import ContentFile

    row = ItemFile(item=item, name=name)
    row.file.save("odd.txt", ContentFile(name.encode()), save=False)
    row.save()
    return row


def lower_escapes(path):
    return ESCAPE_RE.sub(lambda m: m.group().lower(), path)


def as_clients_write_it(path):
    """The path as clients may send it: as listed; with its escapes in lower case (RFC 3986 2.1:
    the same octets); with every character but letters, digits and "/" escaped, as
    urllib.parse.quote() writes a name (sub-delimiters and "~" too)."""
    from urllib.parse import quote, unquote

    return [path, lower_escapes(path), lower_escapes(quote(unquote(path), safe="/"))]


@pytest.fixture
def odd_files(published, committing):
    """Files whose names need escaping, listed by the bitstreams set, and two files the site
    serves that no set lists (saved with tracking paused, and no rebuild since)."""
    from django_resourcesync import tracking

    item = Item.objects.filter(is_public=True).order_by("pk").first()
    with committing():
        listed = [add_file(item, name) for name in ODD_NAMES]
    rebuild_set(published[0])
    with tracking.paused(), committing():
        unlisted = [add_file(item, name) for name in UNLISTED_NAMES]
    locs = {path_of(e.find(f"{{{SM}}}loc").text) for e in resource_list_entries(published[0])}
    assert {f.get_absolute_url() for f in listed} <= locs and not {f.get_absolute_url() for f in unlisted} & locs
    return listed, unlisted


def test_a_listed_file_whose_name_needs_escaping_gets_its_link_however_the_client_escapes_it(odd_files):
    listed, unlisted = odd_files
    expected = [CAPABILITY_LIST.format("bitstreams")]
    client = Client()
    for row in listed:
        path = row.get_absolute_url()
        for sent in as_clients_write_it(path):
            for response in (client.get(sent), client.head(sent)):
                assert response.status_code == 200 and resourcesync_links(response) == expected, (row.name, sent)
    for row in unlisted:
        for sent in as_clients_write_it(row.get_absolute_url()):
            response = client.get(sent)
            assert response.status_code == 200 and resourcesync_links(response) == [], (row.name, sent)


def test_a_query_is_compared_as_sent_with_its_escapes_in_either_case(published, monkeypatch):
    """A source's URI with a query: the query is not decoded (its "&", "=" and escapes mean what
    the site makes them mean), but the case of its escapes does not matter."""
    from example_project.repository.resourcesync import MetadataRecordSource

    query = "?format=oai_dc&t=100% sûr;x"
    monkeypatch.setattr(MetadataRecordSource, "location", lambda self, obj: obj.get_metadata_url() + query)
    published[1].resources.all().delete()  # described again, with the new locations
    rebuild_set(published[1])
    listed = [path_of(e.find(f"{{{SM}}}loc").text) for e in resource_list_entries(published[1])]
    assert listed[0].endswith("/metadata.xml?format=oai_dc&t=100%25%20s%C3%BBr;x")
    client = Client()
    for sent in (listed[0], lower_escapes(listed[0])):
        assert resourcesync_links(client.get(sent)) == [CAPABILITY_LIST.format("metadata")], sent
    path = listed[0].split("?")[0]
    for other in (path, path + "?format=oai_dc", listed[0].replace("&", "%26")):
        response = client.get(other)
        assert response.status_code == 200 and resourcesync_links(response) == [], other


def test_a_source_that_escapes_more_than_reverse_is_matched_on_the_target_as_sent(published, monkeypatch, committing):
    """A source whose locations escape the sub-delimiters (urllib.parse.quote()): the decoded path
    cannot tell "%3B" from ";", the request's target as the client wrote it can, where the server
    passes it on (gunicorn: RAW_URI; uWSGI, mod_wsgi: REQUEST_URI; ASGI: raw_path)."""
    import io
    from urllib.parse import quote, unquote

    from django.core.handlers.asgi import ASGIRequest

    from example_project.repository.resourcesync import BitstreamSource

    monkeypatch.setattr(
        BitstreamSource, "location", lambda self, obj: f"/items/{obj.item_id}/files/{obj.pk}/{quote(obj.name)}"
    )
    item = Item.objects.filter(is_public=True).order_by("pk").first()
    with committing():
        row = add_file(item, "x;y (1)+ü.txt")
    rebuild_set(published[0])
    locs = [path_of(e.find(f"{{{SM}}}loc").text) for e in resource_list_entries(published[0])]
    (path,) = [loc for loc in locs if "x%3By" in loc]
    assert path.endswith(f"/{row.pk}/x%3By%20%281%29%2B%C3%BC.txt")
    expected = [CAPABILITY_LIST.format("bitstreams")]
    client = Client()
    for sent in (path, lower_escapes(path)):
        for key in ("RAW_URI", "REQUEST_URI"):
            response = client.get(sent, **{key: sent})
            assert response.status_code == 200 and resourcesync_links(response) == expected, (key, sent)
        # As an ASGI server makes the scope: the path decoded as UTF-8, and the target as sent.
        scope = {"type": "http", "method": "GET", "path": unquote(sent), "raw_path": sent.encode(), "query_string": b"",
                 "headers": [(b"host", b"testserver")], "server": ("testserver", 80), "scheme": "http"}
        assert discovery.capability_lists(ASGIRequest(scope, io.BytesIO())) == expected, sent
    # A target that is not the path Django decoded (rewritten on the way) is not taken.
    response = client.get(path, RAW_URI=path.replace("x%3By", "x%3Bz"))
    assert response.status_code == 200 and resourcesync_links(response) == []


def test_every_form_of_the_requests_uri_is_looked_up_in_one_indexed_query(published):
    """Up to four forms of the URI (a query, a target as sent): still one query, which probes each
    set's (set, URI) index for each form among many records, and reads none of the others."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_resourcesync import access
    from django_resourcesync.models import Build, Resource

    path = sampled(published[0], 1)[0] + "?a=%c3%a9"
    # "/%69tems/..." is "/items/...": the target as sent, and as sent with upper-case escapes.
    request = RequestFactory().get(path, RAW_URI=path.replace("/i", "/%69", 1))
    forms = discovery.request_uris(request)
    assert len(forms) == len(set(forms)) == 4, forms
    Resource.objects.bulk_create([
        Resource(resource_set=published[0], object_pk=f"x{n}", uri=f"http://testserver/many/{n}", entry_xml="<url/>")
        for n in range(20000)
    ], batch_size=2000)
    Resource.objects.filter(resource_set=published[0], object_pk="x7").update(uri=forms[2])
    middleware = discovery.ResourceSyncLinkMiddleware(lambda request: HttpResponse("bytes"))
    with CaptureQueriesContext(connection) as queries:
        response = middleware(request)
    assert len([q for q in queries if not q["sql"].upper().startswith(("SAVEPOINT", "RELEASE"))]) == 1
    assert resourcesync_links(response) == [CAPABILITY_LIST.format("bitstreams")]
    params = [Build.Status.PUBLISHED, *forms, True, access.TOKEN]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"ANALYZE {Resource._meta.db_table}")
            # Whether the (set, URI) index can serve the query: at 20,000 rows the planner may
            # still find a scan cheaper (it does not at a million); without one it must show an
            # index path, or a scan it could not avoid.
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("EXPLAIN " + discovery._lookup_sql(connection, len(forms)), params)
        else:
            cursor.execute("EXPLAIN QUERY PLAN " + discovery._lookup_sql(connection, len(forms)), params)
        plan = "\n".join(str(row[-1]) for row in cursor.fetchall())
    if connection.vendor == "postgresql":
        assert "resourcesync_resource_uri" in plan and f"Seq Scan on {Resource._meta.db_table} " not in plan, plan
    else:
        assert "SEARCH r USING" in plan and "uri=?" in plan and "SCAN r" not in plan, plan


def test_over_http_a_listed_file_whose_name_needs_escaping_gets_its_link(live_server, settings, seed, transactional_db):
    """The same through a real server (its own decoding of the target), as a client sends it."""
    import urllib.request

    from django_resourcesync import tracking

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BASE_URL": live_server.url}
    seed(2)
    bitstreams = demo_set("bitstreams")
    item = Item.objects.filter(is_public=True).order_by("pk").first()
    listed = [add_file(item, name) for name in ODD_NAMES]
    rebuild_set(bitstreams)
    with tracking.paused():
        unlisted = [add_file(item, name) for name in UNLISTED_NAMES]
    expected = [f"{live_server.url}/resourcesync/bitstreams/capabilitylist.xml"]

    def links_of(path):
        with urllib.request.urlopen(live_server.url + path, timeout=30) as response:
            assert response.status == 200, path
            return LINK_RE.findall(response.headers.get("Link", ""))

    for row in listed:
        for sent in as_clients_write_it(row.get_absolute_url()):
            assert links_of(sent) == expected, (row.name, sent)
    for row in unlisted:
        for sent in as_clients_write_it(row.get_absolute_url()):
            assert links_of(sent) == [], (row.name, sent)
