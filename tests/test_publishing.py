"""Source Description, Capability Lists and Resource Lists as a Destination sees them."""

import datetime
import hashlib

import pytest
from django.core.files.base import ContentFile

from django_resourcesync.models import Build, Document, ResourceSet
from example_project.repository.models import Item, ItemFile

from .helpers import build, fetch, path_of, resource_list_entries
from .xmlcheck import SM, check_document, entries, link, md

pytestmark = pytest.mark.django_db


def test_source_description_lists_each_published_set(seed, bitstreams, metadata):
    seed(5)
    build(bitstreams)
    build(metadata)
    status, body, response = fetch("/.well-known/resourcesync")
    assert status == 200 and response["Content-Type"] == "application/xml"
    doc = check_document(body, "description")
    locs = [e.find(f"{{{SM}}}loc").text for e in entries(doc)]
    assert locs == [
        "http://testserver/resourcesync/bitstreams/capabilitylist.xml",
        "http://testserver/resourcesync/metadata/capabilitylist.xml",
    ]


def test_capability_list_links_up_and_to_resource_list(seed, bitstreams):
    seed(2)
    bitstreams.describedby = "http://testserver/about/bitstreams"
    bitstreams.save()
    build(bitstreams)
    status, body, _ = fetch("/resourcesync/bitstreams/capabilitylist.xml")
    assert status == 200
    doc = check_document(body, "capabilitylist")
    assert link(doc, "up") == "http://testserver/.well-known/resourcesync"
    assert link(doc, "describedby") == "http://testserver/about/bitstreams"
    resource_list, change_list = entries(doc)
    assert resource_list.find(f"{{{SM}}}loc").text == "http://testserver/resourcesync/bitstreams/resourcelist.xml"
    assert md(resource_list) == {"capability": "resourcelist"}
    assert change_list.find(f"{{{SM}}}loc").text == "http://testserver/resourcesync/bitstreams/changelist.xml"
    assert md(change_list) == {"capability": "changelist"}
    # The Source Description carries the set's description link too.
    _, sd, _ = fetch("/.well-known/resourcesync")
    (sd_entry,) = [e for e in entries(check_document(sd, "description")) if "bitstreams" in e.find(f"{{{SM}}}loc").text]
    assert link(sd_entry, "describedby") == "http://testserver/about/bitstreams"


def test_resource_list_describes_every_public_file(seed, bitstreams):
    seed(9)
    result = build(bitstreams)
    assert result.status == Build.Status.PUBLISHED
    status, body, _ = fetch("/resourcesync/bitstreams/resourcelist.xml")
    doc = check_document(body, "resourcelist")
    top = md(doc)
    assert top["at"] <= top["completed"]
    assert link(doc, "up") == "http://testserver/resourcesync/bitstreams/capabilitylist.xml"
    assert link(doc, "index") is None
    listed = {e.find(f"{{{SM}}}loc").text: e for e in entries(doc)}
    files = list(ItemFile.objects.all())
    assert len(listed) == len(files) == 12  # 9 items, every third with a second file
    for f in files:
        data = f.file.open("rb").read()
        entry = listed["http://testserver" + f.get_absolute_url()]
        meta = md(entry)
        assert meta["hash"] == f"md5:{hashlib.md5(data).hexdigest()} sha-256:{hashlib.sha256(data).hexdigest()}"
        assert meta["length"] == str(len(data))
        assert meta["type"] == f.media_type
        assert entry.find(f"{{{SM}}}lastmod").text.endswith("Z")


def test_non_ascii_and_spaces_are_percent_encoded_and_resolve(seed, bitstreams):
    seed(3)
    build(bitstreams)
    locs = [e.find(f"{{{SM}}}loc").text for e in resource_list_entries(bitstreams)]
    encoded = [loc for loc in locs if "donn%C3%A9es%20brutes%203.csv" in loc]
    assert len(encoded) == 1
    status, body, response = fetch(path_of(encoded[0]))
    assert status == 200 and body.startswith(b"Data,values of item 3.")
    assert response["Content-Type"] == "text/csv"


def test_hostile_names_never_make_an_invalid_document(bitstreams, db):
    from example_project.repository.models import Collection

    collection = Collection.objects.create(name="C", slug="c")
    item = Item.objects.create(collection=collection, title="x")
    names = [
        "a&b<c>\"d'.txt", "tab\there.txt", "ctl\x01\x1f.txt", "emoji-😀.txt", "日本語 ファイル.txt", "%zz%.txt", "q?x=1#frag.txt"
    ]
    for name in names:
        row = ItemFile(item=item, name=name, media_type="text/plain; charset=utf-8")
        row.file.save("f.txt", ContentFile(b"bytes"), save=False)
        row.save()
    build(bitstreams)
    found = resource_list_entries(bitstreams)
    assert len(found) == len(names)
    for entry in found:
        assert md(entry)["type"] == "text/plain"


def test_private_items_are_neither_listed_nor_served(seed, bitstreams, metadata):
    seed(6)
    secret = Item.objects.order_by("pk")[2]
    secret.is_public = False
    secret.save()
    prefix = f"/items/{secret.pk}/"
    build(bitstreams)
    build(metadata)
    bitstream_locs = [e.find(f"{{{SM}}}loc").text for e in resource_list_entries(bitstreams)]
    metadata_locs = [e.find(f"{{{SM}}}loc").text for e in resource_list_entries(metadata)]
    assert not [loc for loc in bitstream_locs if prefix in loc]
    assert f"http://testserver{prefix}metadata.xml" not in metadata_locs
    assert len(metadata_locs) == 5
    for f in secret.files.all():
        assert fetch(f.get_absolute_url())[0] == 404
    assert fetch(f"{prefix}metadata.xml")[0] == 404
    assert fetch(prefix)[0] == 404


def test_metadata_record_bytes_match_the_served_view(seed, metadata):
    seed(4)
    build(metadata)
    for entry in resource_list_entries(metadata):
        status, body, response = fetch(path_of(entry.find(f"{{{SM}}}loc").text))
        assert status == 200
        meta = md(entry)
        assert meta["hash"].split()[1] == "sha-256:" + hashlib.sha256(body).hexdigest()
        assert int(meta["length"]) == len(body)
        assert meta["type"] == "application/xml"
        item = Item.objects.get(pk=int(entry.find(f"{{{SM}}}loc").text.split("/")[-2]))
        assert item.title.encode() in body


def test_rendering_a_record_sends_no_request_signals_and_keeps_the_transaction(seed, metadata):
    """Pages are rendered inside change tracking's transactions, by several threads of a worker
    at once: the request signals (whose receivers close the thread's database connections, and
    which a test client disconnects process-wide while it works) must not be involved."""
    from django.core.signals import request_finished, request_started
    from django.db import connection, transaction
    from django.urls import get_urlconf

    from django_resourcesync.rendering import render_location

    seed(2)
    sent = []

    def count(sender, **kwargs):
        sent.append(sender)

    request_started.connect(count)
    request_finished.connect(count)
    try:
        with transaction.atomic():
            item = Item.objects.select_for_update().order_by("pk").first()
            body, content_type = render_location(item.get_metadata_url())
            assert connection.in_atomic_block and not connection.needs_rollback
            assert Item.objects.filter(pk=item.pk).exists()
    finally:
        request_started.disconnect(count)
        request_finished.disconnect(count)
    assert sent == []
    assert item.title.encode() in body and content_type.startswith("application/xml")
    assert get_urlconf() is None, "the thread's URLconf is reset as after a request"


@pytest.mark.parametrize("limit", [1, 7, 10])
def test_resource_list_index_past_the_entry_limit(settings, seed, metadata, limit):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": limit}
    seed(10)
    result = build(metadata)
    status, body, _ = fetch("/resourcesync/metadata/resourcelist.xml")
    doc = check_document(body, "resourcelist")
    if limit >= 10:
        assert doc.tag == f"{{{SM}}}urlset" and len(entries(doc)) == 10
        return
    assert doc.tag == f"{{{SM}}}sitemapindex"
    top = md(doc)
    assert set(top) == {"capability", "at", "completed"}
    assert link(doc, "up") == "http://testserver/resourcesync/metadata/capabilitylist.xml"
    parts = entries(doc)
    assert len(parts) == -(-10 // limit) == result.documents - 1
    seen = []
    for sitemap in parts:
        assert md(sitemap)["at"] == top["at"]
        status, body, _ = fetch(path_of(sitemap.find(f"{{{SM}}}loc").text))
        part = check_document(body, "resourcelist", max_entries=limit)
        assert part.tag == f"{{{SM}}}urlset"
        assert link(part, "index") == "http://testserver/resourcesync/metadata/resourcelist.xml"
        assert link(part, "up") == "http://testserver/resourcesync/metadata/capabilitylist.xml"
        assert md(part)["at"] == top["at"]
        seen += [e.find(f"{{{SM}}}loc").text for e in entries(part)]
    assert len(seen) == len(set(seen)) == 10


@pytest.mark.parametrize("batch_size", [5_000, 7])
def test_resource_list_index_past_the_byte_limit(settings, seed, bitstreams, batch_size):
    """Entries are written a block of rows at a time; a block that would pass the limit is
    written an entry at a time. With blocks of 7 rows, some fit whole and some are split."""
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_DOCUMENT_BYTES": 10_000, "BATCH_SIZE": batch_size}
    seed(30)
    build(bitstreams)
    status, body, _ = fetch("/resourcesync/bitstreams/resourcelist.xml")
    doc = check_document(body, "resourcelist")
    assert doc.tag == f"{{{SM}}}sitemapindex"
    seen = []
    for sitemap in entries(doc):
        status, part, _ = fetch(path_of(sitemap.find(f"{{{SM}}}loc").text))
        assert len(part) <= 10_000
        seen += [entry.find(f"{{{SM}}}loc").text for entry in entries(check_document(part, "resourcelist"))]
    assert len(seen) == len(set(seen)) == ItemFile.objects.count()
    assert set(seen) == set(bitstreams.resources.values_list("uri", flat=True))


def test_empty_set_publishes_an_empty_list(bitstreams):
    """An empty Resource List (and an empty open Change List) is served as it is: valid
    ResourceSync, which a Destination reads as "nothing", although the sitemaps.org schema
    wants one entry at least (see xmlcheck.assert_schema_valid)."""
    from lxml import etree
    from resync.change_list import ChangeList as ResyncChangeList
    from resync.resource_list import ResourceList as ResyncResourceList

    from .xmlcheck import _schema

    bitstreams.capabilities = ["resourcelist", "changelist"]
    bitstreams.save()
    build(bitstreams)
    for name, capability, reader in (
        ("resourcelist.xml", "resourcelist", ResyncResourceList), ("changelist.xml", "changelist", ResyncChangeList)
    ):
        status, body, _ = fetch(f"/resourcesync/bitstreams/{name}")
        assert status == 200
        assert entries(check_document(body, capability)) == []
        assert not _schema("urlset").validate(etree.fromstring(body)), "the one thing the sitemap schema refuses"
        parsed = reader()
        parsed.parse(str=body.decode())
        assert len(parsed) == 0 and parsed.capability == capability, "the resync client reads it as empty"


def test_switch_over_keeps_the_previous_parts_and_never_mixes_builds(
    settings, seed, metadata, documents_storage, django_capture_on_commit_callbacks
):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 3, "KEEP_BUILDS": 1}
    seed(7)
    first = build(metadata)
    _, old_index, _ = fetch("/resourcesync/metadata/resourcelist.xml")
    old_parts = [s.find(f"{{{SM}}}loc").text for s in entries(check_document(old_index, "resourcelist"))]
    Item.objects.filter(pk=Item.objects.order_by("pk")[0].pk).update(title="Changed")
    second = build(metadata)
    _, new_index, _ = fetch("/resourcesync/metadata/resourcelist.xml")
    new_parts = [s.find(f"{{{SM}}}loc").text for s in entries(check_document(new_index, "resourcelist"))]
    assert not set(old_parts) & set(new_parts), "parts of two builds never share a URI"
    assert all(f"/{second.pk}/" in uri for uri in new_parts)
    # A Destination that read the old index just before the switch can still read its parts.
    for uri in old_parts:
        status, body, _ = fetch(path_of(uri))
        assert status == 200
        assert md(check_document(body, "resourcelist"))["at"] == md(check_document(old_index, "resourcelist"))["at"]
    # One more build retires the first one for good: its files are gone from storage too.
    first_files = list(Document.objects.filter(build=first).values_list("storage_name", flat=True))
    assert first_files and all((documents_storage / name).exists() for name in first_files)
    with django_capture_on_commit_callbacks(execute=True):
        third = build(metadata)
    assert not any((documents_storage / name).exists() for name in first_files)
    assert third.status == Build.Status.PUBLISHED
    for uri in old_parts:
        assert fetch(path_of(uri))[0] == 404
    assert not Document.objects.filter(build=first).exists()
    assert Build.objects.get(pk=second.pk).status == Build.Status.RETIRED


def test_a_failed_build_leaves_the_published_documents_served(seed, metadata, monkeypatch):
    seed(3)
    good = build(metadata)
    _, before, _ = fetch("/resourcesync/metadata/resourcelist.xml")

    from django_resourcesync.xml.writer import DocumentWriter

    calls = {"n": 0}
    real = DocumentWriter.add

    def failing(self, entry, count=1):  # the list's entries come in one block: the first write fails
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("disk full")
        return real(self, entry, count)

    monkeypatch.setattr(DocumentWriter, "add", failing)
    Item.objects.filter(pk=Item.objects.order_by("pk")[0].pk).update(title="Changed again")
    with pytest.raises(OSError):
        build(metadata)
    failed = Build.objects.filter(resource_set=metadata).order_by("-pk").first()
    assert failed.status == Build.Status.FAILED and "disk full" in failed.error
    assert not Document.objects.filter(build=failed).exists()
    status, after, _ = fetch("/resourcesync/metadata/resourcelist.xml")
    assert status == 200 and after == before
    assert Build.objects.get(pk=good.pk).status == Build.Status.PUBLISHED


def test_disabled_set_vanishes_and_answers_404(seed, bitstreams, metadata):
    seed(2)
    build(bitstreams)
    build(metadata)
    metadata.enabled = False
    metadata.save()
    _, body, _ = fetch("/.well-known/resourcesync")
    locs = [e.find(f"{{{SM}}}loc").text for e in entries(check_document(body, "description"))]
    assert locs == ["http://testserver/resourcesync/bitstreams/capabilitylist.xml"]
    assert fetch("/resourcesync/metadata/capabilitylist.xml")[0] == 404
    assert fetch("/resourcesync/metadata/resourcelist.xml")[0] == 404
    assert fetch("/resourcesync/nosuchset/capabilitylist.xml")[0] == 404
    assert fetch("/resourcesync/bitstreams/nosuchdocument.xml")[0] == 404


def test_capability_switched_off_is_no_longer_served(seed, bitstreams):
    seed(1)
    build(bitstreams)
    bitstreams.capabilities = []
    bitstreams.save()
    assert fetch("/resourcesync/bitstreams/resourcelist.xml")[0] == 404
    assert fetch("/resourcesync/bitstreams/capabilitylist.xml")[0] == 404
    _, body, _ = fetch("/.well-known/resourcesync")
    assert entries(check_document(body, "description")) == []


@pytest.mark.parametrize(
    "path",
    ["/.well-known/resourcesync", "/resourcesync/bitstreams/capabilitylist.xml", "/resourcesync/bitstreams/resourcelist.xml"]
)
def test_conditional_get(seed, bitstreams, path, monkeypatch):
    seed(2)
    build(bitstreams)
    # A document rendered live has a Last-Modified once the second of its last change is over.
    from django.utils import timezone

    later = timezone.now() + datetime.timedelta(seconds=1)
    monkeypatch.setattr(timezone, "now", lambda: later)
    status, body, response = fetch(path)
    assert status == 200
    etag, last_modified = response["ETag"], response["Last-Modified"]
    assert etag.startswith('"') and last_modified.endswith("GMT")
    assert fetch(path, **{"If-None-Match": etag})[0] == 304
    assert fetch(path, **{"If-Modified-Since": last_modified})[0] == 304
    assert fetch(path, **{"If-None-Match": '"something-else"'})[0] == 200
    from django.test import Client

    assert Client().head(path).status_code == 200
    assert Client().post(path).status_code == 405


def test_conditional_get_of_a_document_touches_no_storage(seed, bitstreams, monkeypatch):
    seed(1)
    build(bitstreams)
    _, _, response = fetch("/resourcesync/bitstreams/resourcelist.xml")
    from django_resourcesync import storage

    def no_storage():
        raise AssertionError("storage was touched")

    monkeypatch.setattr(storage, "get_storage", no_storage)
    assert fetch("/resourcesync/bitstreams/resourcelist.xml", **{"If-None-Match": response["ETag"]})[0] == 304


def test_served_etag_is_the_sha256_of_the_bytes(seed, bitstreams):
    seed(2)
    build(bitstreams)
    _, body, response = fetch("/resourcesync/bitstreams/resourcelist.xml")
    assert response["ETag"] == f'"{hashlib.sha256(body).hexdigest()}"'
    assert int(response["Content-Length"]) == len(body)


def test_set_filter_narrows_the_source(seed, db):
    seed(9)
    theses = ResourceSet.objects.create(
        name="Theses", slug="theses", source="metadata", lookups={"collection__slug": "theses"}, capabilities=["resourcelist"]
    )
    build(theses)
    locs = [e.find(f"{{{SM}}}loc").text for e in resource_list_entries(theses)]
    expected = {f"http://testserver/items/{i.pk}/metadata.xml" for i in Item.objects.filter(collection__slug="theses")}
    assert set(locs) == expected and len(locs) == 3


def test_reconcile_rehashes_only_what_changed(seed, bitstreams, monkeypatch):
    seed(4)
    build(bitstreams)
    from django_resourcesync import sources
    from django_resourcesync.sources import ResourceSource

    reads = []
    real, real_digest = ResourceSource.representation, sources._digest_files

    def counting(self, obj):
        reads.append(obj.pk)
        return real(self, obj)

    def counting_files(paths):  # the files read ahead, on the read-ahead threads
        reads.extend(by_path[path] for path in paths)
        return real_digest(paths)

    monkeypatch.setattr(ResourceSource, "representation", counting)
    monkeypatch.setattr(sources, "_digest_files", counting_files)
    changed = ItemFile.objects.order_by("pk")[0]
    changed.file.save("new.txt", ContentFile(b"new bytes"), save=True)
    by_path = {f.file.path: f.pk for f in ItemFile.objects.all()}
    build(bitstreams)
    assert reads == [changed.pk]
    entry = [e for e in resource_list_entries(bitstreams) if e.find(f"{{{SM}}}loc").text.endswith(changed.get_absolute_url())][0]
    assert md(entry)["length"] == "9"


def test_resources_whose_bytes_cannot_be_had_are_left_out(seed, bitstreams, metadata, monkeypatch):
    seed(4)
    first_file = ItemFile.objects.order_by("pk")[0]
    first_file.file.storage.delete(first_file.file.name)
    build(bitstreams)
    locs = [e.find(f"{{{SM}}}loc").text for e in resource_list_entries(bitstreams)]
    assert len(locs) == ItemFile.objects.count() - 1
    assert "http://testserver" + first_file.get_absolute_url() not in locs

    # A page that does not answer 200 is not listed either.
    from example_project.repository import resourcesync as demo_sources

    broken = Item.objects.order_by("pk")[1]
    monkeypatch.setattr(
        demo_sources.MetadataRecordSource, "location",
        lambda self, obj: obj.get_metadata_url() if obj.pk != broken.pk else "/no/such/page"
    )
    build(metadata)
    locs = [e.find(f"{{{SM}}}loc").text for e in resource_list_entries(metadata)]
    assert len(locs) == 3 and not [loc for loc in locs if "/no/such/page" in loc]


def test_deleting_a_set_removes_its_files(seed, metadata, documents_storage, django_capture_on_commit_callbacks):
    seed(2)
    build(metadata)
    names = list(Document.objects.filter(resource_set=metadata).values_list("storage_name", flat=True))
    assert names and all((documents_storage / name).exists() for name in names)
    with django_capture_on_commit_callbacks(execute=True):
        metadata.delete()
    assert not any((documents_storage / name).exists() for name in names)
