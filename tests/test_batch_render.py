"""The batch render hook: ``ResourceSource.contents(objects)`` renders the bytes of many objects
at once (the example's metadata records: one query, no request handling), and gives exactly
what the per-object way (``content()``, the site's own view) gives."""

import hashlib
import logging

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from django_resourcesync import sources, tracking
from django_resourcesync.models import ChangeEvent, LeftOut, Resource, ResourceSet
from django_resourcesync.rendering import render_location
from example_project.repository import resourcesync as demo_sources
from example_project.repository import views
from example_project.repository.models import Collection, Item

from .helpers import build, fetch

pytestmark = pytest.mark.django_db

ALL = ["resourcelist", "changelist"]

#: Odd but control-character-free text: XML's special characters, entity-like and
#: template-like text, non-ASCII of several scripts and planes, invisible and combining ones.
ODD = [
    'Ça & <b>"ça"</b> & \'l\'autre\' &amp; &#x41; ]]> <![CDATA[x]]> <!-- no --> <?pi?>',
    "{{ item.title }} {% now 'Y' %} \\ back\\slash % 100%",
    "日本語の題名 — Ελληνικά — עברית (rtl) — العربية — 😀🧪 — e\u0301 combining — \u00a0nbsp — zero\u200bwidth",
    "\u2028line separator\u2029paragraph separator \ufeff bom \U0001d11e clef",
    "   leading and trailing spaces   ",
]

FIELDS = ("uri", "lastmod", "changefreq", "md5", "sha256", "length", "media_type", "links", "encoding", "fingerprint",
          "entry_xml")


class PlainRecordSource(demo_sources.MetadataRecordSource):
    """The example's record source without its hook: every record through the view."""

    name = "metadata-plain"
    contents = sources.ResourceSource.contents


@pytest.fixture
def plain():
    """A set of the record source without the hook, next to the example's ``metadata`` set."""
    sources.register(PlainRecordSource)
    try:
        yield ResourceSet.objects.create(name="Plain records", slug="plain", source="metadata-plain", capabilities=ALL)
    finally:
        sources.registry.unregister("metadata-plain")


@pytest.fixture
def metadata_set(metadata):
    metadata.capabilities = ALL
    metadata.save()
    return metadata


def make_items(n, start=0, odd=True):
    """``n`` public items, without telling change tracking (``bulk_create``), odd text in some."""
    collection, _ = Collection.objects.get_or_create(slug="odd", defaults={"name": 'Les « odd » & <co>'})
    return Item.objects.bulk_create(
        Item(
            collection=collection,
            title=(ODD[i % len(ODD)] if odd else "Title") + f" {i}",
            creator=ODD[(i + 1) % len(ODD)] if odd else f"Author {i}",
            abstract=ODD[(i + 2) % len(ODD)] if odd else f"Abstract {i}",
        )
        for i in range(start, start + n)
    )


def records(resource_set):
    return {row["object_pk"]: row for row in Resource.objects.filter(resource_set=resource_set).values("object_pk", *FIELDS)}


def events(resource_set):
    return sorted(
        ChangeEvent.objects.filter(resource_set=resource_set).values_list(
            "object_pk", "change", "uri", "md5", "sha256", "length", "media_type", "entry_xml"
        )
    )


def update_all(suffix):
    """Change every item's title behind the app's back, then tell it through the bulk API."""
    from django.db.models import F, Value
    from django.db.models.functions import Concat

    Item.objects.update(title=Concat(F("title"), Value(suffix)))
    return tracking.changed(Item.objects.all())


@pytest.fixture
def counted(monkeypatch):
    """The objects of each call of the example's hook."""
    calls = []
    real = demo_sources.MetadataRecordSource.contents

    def counting(self, objects):
        calls.append(len(objects))
        return real(self, objects)

    monkeypatch.setattr(demo_sources.MetadataRecordSource, "contents", counting)
    return calls


def test_the_hook_gives_the_bytes_the_view_serves_to_an_anonymous_client(metadata_set):
    items = make_items(len(ODD) * 2)
    source = sources.registry.get("metadata")
    given = list(source.items())
    rendered = source.contents(given)
    assert set(rendered) == {item.pk for item in items}
    client = Client()
    for item in given:
        body, content_type = rendered[item.pk]
        status, served, response = fetch(item.get_metadata_url(), client)
        # What the view serves through the whole MIDDLEWARE (no middleware changes the bytes).
        assert status == 200 and not response.has_header("Content-Encoding")
        assert body == served, item.pk
        assert content_type == response["Content-Type"]
        # And what the per-object way renders (the request handling, in process).
        assert (body, content_type) == render_location(item.get_metadata_url()) == source.content(item)
    text = rendered[items[0].pk][0].decode()
    assert "&lt;b&gt;&quot;ça&quot;&lt;/b&gt; &amp; &#x27;l&#x27;autre&#x27; &amp;amp;" in text
    # A client that accepts compression gets the same bytes (nothing compresses them).
    assert fetch(items[0].get_metadata_url(), client, accept_encoding="gzip, br")[1] == rendered[items[0].pk][0]


def test_items_read_without_their_collection_are_read_again_in_one_query(metadata_set):
    items = make_items(8)
    Item.objects.filter(pk=items[2].pk).update(is_public=False)
    source = sources.registry.get("metadata")
    expected = source.contents(list(source.items()))
    plain_objects = list(Item.objects.all())  # no select_related: each would cost a query
    with CaptureQueriesContext(connection) as captured:
        rendered = source.contents(plain_objects)
    sql = [query["sql"] for query in captured.captured_queries]
    read = [text for text in sql if text.startswith("SELECT") and "repository_" in text]
    assert len(read) == 1 and "repository_collection" in read[0], "the items with their collections, together"
    assert rendered == expected and items[2].pk not in rendered, "a private item is left to content(): 404"
    with pytest.raises(sources.UnpublishableResource, match="answered 404"):
        source.content(items[2])


def test_the_records_are_well_formed_xml(metadata_set):
    from xml.etree import ElementTree

    make_items(len(ODD))
    source = sources.registry.get("metadata")
    for item in source.items():
        body, _type = source.contents([item])[item.pk]
        root = ElementTree.fromstring(body)
        title = root.find("{http://purl.org/dc/elements/1.1/}title").text
        assert title == item.title


def test_an_update_of_300_records_makes_the_same_records_as_without_the_hook(metadata_set, plain, counted):
    make_items(300)
    build(metadata_set)
    build(plain)
    assert len(records(metadata_set)) == 300
    assert counted == [300], "the baseline (a reconcile) renders them in one call too"
    assert records(metadata_set) == records(plain)
    counted.clear()

    assert update_all(" (revised & <odd>)") >= 600
    counts = tracking.process_pending(["metadata", "metadata-plain"], batch_size=128)
    assert counts.updated == 600 and counts.skipped == 0
    assert counted == [128, 128, 44], "one call per batch"
    hooked, without = records(metadata_set), records(plain)
    assert len(hooked) == 300 and hooked == without
    assert all(row["sha256"] and row["length"] and row["media_type"] == "application/xml" for row in hooked.values())
    assert len(events(metadata_set)) == 300 and events(metadata_set) == events(plain)
    # And they are the bytes served.
    item = Item.objects.order_by("pk")[7]
    body = fetch(item.get_metadata_url())[1]
    row = hooked[str(item.pk)]
    assert (row["sha256"], row["length"]) == (hashlib.sha256(body).hexdigest(), len(body))
    assert b"(revised &amp; &lt;odd&gt;)" in body


def test_the_hook_is_called_once_a_batch_and_its_queries_do_not_grow_with_the_batch(metadata_set, counted):
    def queries_to_process(n):
        with tracking.paused():
            Item.objects.all().delete()
        make_items(n, odd=False)
        build(metadata_set)
        update_all(" again")
        counted.clear()
        with CaptureQueriesContext(connection) as captured:
            counts = tracking.process_pending(["metadata"])
        assert counts.updated == n and counted == [n]
        sql = [query["sql"] for query in captured.captured_queries]
        writes = [text for text in sql if text.startswith(("INSERT", "COPY"))]
        return len(sql) - len(writes), len(writes)

    (reads_10, writes_10), (reads_60, writes_60), (reads_250, writes_250) = map(queries_to_process, (10, 60, 250))
    assert reads_10 == reads_60 == reads_250, (reads_10, reads_60, reads_250)
    # The rows are written in bulk: an INSERT per ~70 rows on SQLite (its limit on parameters), COPY
    # on PostgreSQL; a few statements, never one per object.
    assert max(writes_10, writes_60, writes_250) <= 10, (writes_10, writes_60, writes_250)


def test_without_the_hook_each_record_costs_queries(plain):
    # The contrast of the test above: the view reads its item, once per record.
    def queries_to_process(n):
        with tracking.paused():
            Item.objects.all().delete()
        make_items(n, odd=False)
        build(plain)
        update_all(" again")
        with CaptureQueriesContext(connection) as captured:
            assert tracking.process_pending(["metadata-plain"]).updated == n
        return len(captured.captured_queries)

    small, large = queries_to_process(10), queries_to_process(40)
    assert large - small >= 30


def test_a_record_that_fails_to_render_is_left_out_with_its_reason_and_the_others_published(
    metadata_set, plain, counted, monkeypatch
):
    items = make_items(30)
    build(metadata_set)
    build(plain)
    bad = items[11]
    real = views.render_record

    def failing(item):
        if item.pk == bad.pk:
            raise ValueError("this record cannot be rendered")
        return real(item)

    monkeypatch.setattr(views, "render_record", failing)
    update_all(" (changed)")
    counted.clear()
    counts = tracking.process_pending(["metadata", "metadata-plain"])
    assert counted == [30]
    assert counts.skipped == 2 and counts.updated == 2 * 29 and counts.deleted == 2
    hooked, without = records(metadata_set), records(plain)
    assert str(bad.pk) not in hooked and len(hooked) == 29 and hooked == without
    reasons = dict(LeftOut.objects.values_list("resource_set__slug", "reason"))
    # Reported as the per-object way reports it: the view answered 500.
    assert reasons == {"metadata": f"{bad.get_metadata_url()} answered 500", "plain": f"{bad.get_metadata_url()} answered 500"}
    assert ("deleted", f"http://testserver{bad.get_metadata_url()}") in [(e[1], e[2]) for e in events(metadata_set)]


def test_a_hook_that_fails_as_a_whole_leaves_every_object_to_content(metadata_set, plain, monkeypatch, caplog):
    make_items(25)
    build(metadata_set)
    build(plain)

    def broken(self, objects):
        raise RuntimeError("the renderer is down")

    monkeypatch.setattr(demo_sources.MetadataRecordSource, "contents", broken)
    update_all(" (once more)")
    with caplog.at_level(logging.WARNING, logger="django_resourcesync"):
        counts = tracking.process_pending(["metadata", "metadata-plain"])
    assert counts.updated == 50 and counts.skipped == 0
    assert records(metadata_set) == records(plain)
    assert "MetadataRecordSource.contents() failed for a batch of 25 objects" in caplog.text


def test_an_answer_that_leaves_objects_out_or_gives_none_falls_back_to_content(metadata_set, plain, monkeypatch):
    items = make_items(20)
    build(metadata_set)
    build(plain)
    real = demo_sources.MetadataRecordSource.contents
    rendered_alone = []
    real_content = demo_sources.MetadataRecordSource.content

    def partial(self, objects):
        found = real(self, objects)
        found.pop(items[3].pk)
        found[items[4].pk] = None
        return {str(key): value for key, value in found.items()}  # keys as strings are taken too

    def content(self, obj):
        rendered_alone.append(obj.pk)
        return real_content(self, obj)

    monkeypatch.setattr(demo_sources.MetadataRecordSource, "contents", partial)
    monkeypatch.setattr(demo_sources.MetadataRecordSource, "content", content)
    update_all(" (partly)")
    assert tracking.process_pending(["metadata", "metadata-plain"]).updated == 40
    # Every record of the plain set, and the two the hook did not answer for.
    assert sorted(rendered_alone) == sorted([item.pk for item in items] + [items[3].pk, items[4].pk])
    assert records(metadata_set) == records(plain)


def test_a_record_whose_uri_is_not_its_view_is_not_rendered_by_the_hook(metadata_set, monkeypatch):
    items = make_items(3)
    monkeypatch.setattr(
        demo_sources.MetadataRecordSource, "location",
        lambda self, obj: obj.get_metadata_url() if obj.pk != items[1].pk else "/no/such/page",
    )
    build(metadata_set)
    assert sorted(records(metadata_set)) == sorted(str(item.pk) for item in (items[0], items[2]))
    assert LeftOut.objects.get().reason == "/no/such/page answered 404"


def test_the_version_store_keeps_the_bytes_the_hook_rendered(metadata_set, counted):
    from django_resourcesync import versions

    metadata_set.prior_versions = True
    metadata_set.save()
    assert versions.keeps(metadata_set)
    make_items(12)
    build(metadata_set)
    update_all(" (kept)")
    counted.clear()
    assert tracking.process_pending(["metadata"]).updated == 12
    assert counted == [12]
    for item in Item.objects.all():
        served = fetch(item.get_metadata_url())[1]
        digest = Resource.objects.get(resource_set=metadata_set, object_pk=str(item.pk)).sha256
        assert digest == hashlib.sha256(served).hexdigest()
        chunks, length = versions.open_bytes(digest)
        assert b"".join(chunks) == served and length == len(served)


def test_sources_without_the_hook_still_work(plain, pages, seed):
    pages.capabilities = ALL
    pages.save()
    seed(3)
    build(plain)
    build(pages)
    assert sources.registry.get("pages").batch_contents(list(Item.objects.all())) == {}
    assert sources.registry.get("bitstreams").batch_contents(list(sources.registry.get("bitstreams").items())) == {}
    assert len(records(plain)) == 3 and len(records(pages)) == 3
    assert all(row["sha256"] for row in records(pages).values())
