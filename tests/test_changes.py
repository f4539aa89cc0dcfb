"""Change tracking and Change Lists: every change reaches Destinations, oldest first."""

import datetime
import hashlib
import importlib

import pytest
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from django_resourcesync import tracking
from django_resourcesync.models import ChangeEvent, ChangeList, PendingChange, Resource
from django_resourcesync.tracking import changelog
from example_project.repository.models import Collection, Item, ItemFile

from .conftest import demo_set
from .helpers import build, fetch, path_of, resource_list_entries
from .xmlcheck import SM, W3C_UTC, check_document, entries, link, md

pytestmark = pytest.mark.django_db

ALL = ["resourcelist", "changelist"]


@pytest.fixture
def tracked(seed, bitstreams, metadata, django_capture_on_commit_callbacks):
    """Both demo sets offering Resource and Change Lists, seeded with 6 items and baselined. The
    example's set for partners is there as after its migration (a flush of an earlier test may
    have taken it), so that every test counts the same sources."""
    demo_set("all-records")
    for resource_set in (bitstreams, metadata):
        resource_set.capabilities = ALL
        resource_set.save()
    with django_capture_on_commit_callbacks(execute=True):
        seed(6)
    build(bitstreams)
    build(metadata)
    return bitstreams, metadata


def changes(resource_set, name="changelist.xml"):
    """[(change, loc, md)] of a served Change List, checked against schema and spec rules."""
    status, body, _ = fetch(f"/resourcesync/{resource_set.slug}/{name}")
    assert status == 200
    doc = check_document(body, "changelist")
    assert doc.tag == f"{{{SM}}}urlset"
    found = []
    previous = None
    for entry in entries(doc):
        meta = md(entry)
        assert W3C_UTC.match(meta["datetime"])
        assert previous is None or meta["datetime"] >= previous, "oldest first"
        previous = meta["datetime"]
        assert meta["datetime"] >= md(doc)["from"]
        if meta["change"] == "deleted":
            assert set(meta) == {"change", "datetime"}, "a deletion says nothing of what was removed"
            assert entry.find(f"{{{SM}}}lastmod") is None and not entry.findall("{http://www.openarchives.org/rs/terms/}ln")
        else:
            assert {"hash", "length", "type"} <= set(meta)
        found.append((meta["change"], entry.find(f"{{{SM}}}loc").text, meta))
    return found


def test_baseline_records_no_events_and_opens_a_change_list(tracked):
    bitstreams, metadata = tracked
    assert ChangeEvent.objects.count() == 0
    assert changes(metadata) == []
    _, body, _ = fetch("/resourcesync/metadata/capabilitylist.xml")
    kinds = [md(e)["capability"] for e in entries(check_document(body, "capabilitylist"))]
    assert kinds == ["resourcelist", "changelist"]
    _, body, _ = fetch("/resourcesync/metadata/changelist.xml")
    doc = check_document(body, "changelist")
    assert "until" not in md(doc) and link(doc, "up") == "http://testserver/resourcesync/metadata/capabilitylist.xml"
    assert link(doc, "index") is None


def test_a_save_that_changes_the_bytes_is_an_update(tracked, committing):
    item = Item.objects.order_by("pk")[0]
    with committing():
        item.title = "A new title"
        item.save()
    (event,) = changes(tracked[1])
    change, loc, meta = event
    assert (change, loc) == ("updated", f"http://testserver{item.get_metadata_url()}")
    status, body, _ = fetch(item.get_metadata_url())
    assert meta["hash"].split()[1] == "sha-256:" + hashlib.sha256(body).hexdigest() and b"A new title" in body
    assert changes(tracked[0]) == [], "the item's files did not change"


def test_a_save_that_changes_nothing_published_records_nothing(tracked, committing):
    item = Item.objects.order_by("pk")[0]
    with committing():
        item.save()
        item.files.first().save()
    assert ChangeEvent.objects.count() == 0
    assert PendingChange.objects.count() == 0


def test_a_rolled_back_transaction_leaves_nothing(tracked, committing):
    item = Item.objects.order_by("pk")[0]
    with committing():
        with pytest.raises(RuntimeError):
            with transaction.atomic():
                item.title = "Never committed"
                item.save()
                Item.objects.order_by("pk")[1].delete()
                raise RuntimeError
    assert PendingChange.objects.count() == 0 and ChangeEvent.objects.count() == 0
    tracking.process_pending()
    assert ChangeEvent.objects.count() == 0


def test_delete_and_made_private_are_deletions_and_no_longer_served(tracked, committing):
    bitstreams, metadata = tracked
    gone, hidden = Item.objects.order_by("pk")[0], Item.objects.order_by("pk")[2]
    gone_pk = gone.pk
    gone_files = [f.get_absolute_url() for f in gone.files.all()]
    hidden_files = [f.get_absolute_url() for f in hidden.files.all()]
    with committing():
        gone.delete()
    with committing():
        hidden.is_public = False
        hidden.save()
    assert [(c, loc) for c, loc, _ in changes(metadata)] == [
        ("deleted", f"http://testserver/items/{gone_pk}/metadata.xml"),
        ("deleted", f"http://testserver/items/{hidden.pk}/metadata.xml"),
    ]
    assert [(c, path_of(loc)) for c, loc, _ in changes(bitstreams)] == [("deleted", u) for u in gone_files + hidden_files]
    for url in hidden_files + [hidden.get_metadata_url(), hidden.get_absolute_url()]:
        assert fetch(url)[0] == 404
    with committing():
        hidden.is_public = True
        hidden.save()
    assert [c for c, _loc, _ in changes(metadata)][-1] == "created"


def test_renaming_a_collection_updates_its_records(tracked, committing):
    collection = Collection.objects.get(slug="theses")
    with committing():
        collection.name = "Doctoral theses"
        collection.save()
    updated = {loc for c, loc, _ in changes(tracked[1]) if c == "updated"}
    assert updated == {f"http://testserver{i.get_metadata_url()}" for i in collection.items.all()} and len(updated) == 2


def test_queryset_update_then_reconcile(tracked, committing):
    Item.objects.filter(collection__slug="articles").update(title="Bulk title")
    assert ChangeEvent.objects.count() == 0, "queryset.update() sends no signal"
    with committing():
        call_command("resourcesync_reconcile", verbosity=0)
    updated = {loc for c, loc, _ in changes(tracked[1])}
    assert updated == {f"http://testserver{i.get_metadata_url()}" for i in Item.objects.filter(collection__slug="articles")}
    with committing():
        call_command("resourcesync_reconcile", verbosity=0)
    assert len(changes(tracked[1])) == len(updated), "a second reconcile finds nothing new"


def test_bulk_api_after_update(tracked, committing):
    with committing():
        Item.objects.filter(collection__slug="datasets").update(title="Bulk again")
        # Two records, two landing pages, two partners' records, and the two items' files (a
        # source tracking items as a related model).
        assert tracking.changed(Item.objects.filter(collection__slug="datasets")) == 8
    assert [c for c, _loc, _ in changes(tracked[1])] == ["updated", "updated"]


def test_bulk_api_after_raw_delete(tracked, committing):
    doomed = list(Item.objects.order_by("pk").values_list("pk", flat=True)[:2])
    with committing():
        with tracking.paused():
            Item.objects.filter(pk__in=doomed).delete()
        assert PendingChange.objects.count() == 0
        tracking.changed(model=Item, pks=doomed)
        tracking.changed(model=ItemFile, pks=list(Resource.objects.filter(resource_set=tracked[0]).exclude(
            object_pk__in=[str(pk) for pk in ItemFile.objects.values_list("pk", flat=True)]).values_list("object_pk", flat=True)))
    assert [c for c, _loc, _ in changes(tracked[1])] == ["deleted", "deleted"]
    assert {c for c, _loc, _ in changes(tracked[0])} == {"deleted"}


def test_seeding_reports_created(tracked, committing):
    with committing():
        call_command("seed_repository", items=3, verbosity=0)
    created = [loc for c, loc, _ in changes(tracked[1]) if c == "created"]
    assert len(created) == 3
    assert len([1 for c, _loc, _ in changes(tracked[0]) if c == "created"]) == 4  # item 9 has two files


def test_fixture_loading_is_tracked(tracked, committing, tmp_path):
    fixture = tmp_path / "items.json"
    collection = Collection.objects.first()
    fixture.write_text(
        '[{"model": "repository.item", "pk": 9001, "fields": {"collection": %d, "title": "From a fixture", '
        '"is_public": true, "created": "2026-01-01T00:00:00Z", "modified": "2026-01-01T00:00:00Z"}}]' % collection.pk
    )
    with committing():
        call_command("loaddata", str(fixture), verbosity=0)
    assert [(c, loc) for c, loc, _ in changes(tracked[1])] == [("created", "http://testserver/items/9001/metadata.xml")]


def test_an_item_changed_twice_is_listed_twice(tracked, committing):
    item = Item.objects.order_by("pk")[0]
    for title in ("First", "Second"):
        with committing():
            item.title = title
            item.save()
    assert [c for c, _loc, _ in changes(tracked[1])] == ["updated", "updated"]


def test_datetimes_never_go_backwards_when_the_clock_does(tracked, committing, monkeypatch):
    items = list(Item.objects.order_by("pk")[:3])
    with committing():
        items[0].title = "x"
        items[0].save()
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() - datetime.timedelta(hours=3))
    for item in items[1:]:
        with committing():
            item.title = "y"
            item.save()
    events = list(ChangeEvent.objects.order_by("id"))
    assert [e.datetime for e in events] == sorted(e.datetime for e in events)
    changes(tracked[1])  # ordered, and none before `from`


def test_change_list_closes_at_the_entry_limit_and_gets_an_index(tracked, committing, settings, documents_storage):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 4}
    metadata = tracked[1]
    for n, item in enumerate(Item.objects.order_by("pk")):
        with committing():
            item.title = f"Title {n}"
            item.save()
    with committing():
        Item.objects.order_by("pk")[0].delete()
    # 7 events: lists of 4 and 3; the second is still open.
    status, body, _ = fetch("/resourcesync/metadata/changelist.xml")
    index = check_document(body, "changelist")
    assert index.tag == f"{{{SM}}}sitemapindex"
    assert "until" not in md(index), "the log is still being extended"
    assert link(index, "up") == "http://testserver/resourcesync/metadata/capabilitylist.xml"
    lists = entries(index)
    assert len(lists) == 2
    first, second = (md(s) for s in lists)
    assert first["until"] == second["from"] and "until" not in second
    assert first["from"] <= first["until"]
    seen = []
    for sitemap in lists:
        name = path_of(sitemap.find(f"{{{SM}}}loc").text).split("/resourcesync/metadata/")[1]
        listed = changes(metadata, name)
        _, body, _ = fetch(f"/resourcesync/metadata/{name}")
        doc = check_document(body, "changelist")
        assert link(doc, "index") == "http://testserver/resourcesync/metadata/changelist.xml"
        assert md(doc).get("until") == md(sitemap).get("until") and md(doc)["from"] == md(sitemap)["from"]
        if "until" in md(doc):
            assert all(meta["datetime"] <= md(doc)["until"] for _c, _l, meta in listed)
        seen += listed
    assert [c for c, _l, _m in seen] == ["updated"] * 6 + ["deleted"]
    closed = ChangeList.objects.get(resource_set=metadata, number=1)
    assert closed.until and (documents_storage / closed.storage_name).exists()
    # A closed list is an immutable file: it does not change when more happens.
    _, before, _ = fetch("/resourcesync/metadata/changelist/1.xml")
    with committing():
        Item.objects.order_by("pk")[0].delete()
    assert fetch("/resourcesync/metadata/changelist/1.xml")[1] == before


def test_change_list_closes_when_its_period_is_over(tracked, committing, settings, monkeypatch):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "CHANGELIST_PERIOD": "hourly"}
    item = Item.objects.order_by("pk")[0]
    with committing():
        item.title = "Before the hour"
        item.save()
    last = ChangeEvent.objects.get().datetime
    boundary = changelog.period_end(last)
    later = boundary + datetime.timedelta(minutes=5)
    monkeypatch.setattr(timezone, "now", lambda: later)
    with committing():
        item.title = "After the hour"
        item.save()
    first, second = ChangeList.objects.filter(resource_set=tracked[1]).order_by("number")
    assert first.until == boundary == second.from_time and second.until is None
    assert boundary.minute == 0 and boundary.second == 0
    # Beat closes a list whose period is over even when nothing else happens.
    from django_resourcesync.tasks import close_changelists_task

    monkeypatch.setattr(timezone, "now", lambda: later + datetime.timedelta(hours=2))
    close_changelists_task()
    assert ChangeList.objects.filter(resource_set=tracked[1]).count() == 3
    assert ChangeList.objects.get(resource_set=tracked[1], number=2).until == boundary + datetime.timedelta(hours=1)


def test_retention_drops_old_closed_lists(tracked, committing, settings, monkeypatch, documents_storage):
    # A period that does not end in the two hours the test moves the clock (a daily one would,
    # late in the day, and close the open list too).
    settings.RESOURCESYNC = {
        **settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 1, "CHANGELIST_RETENTION": 3600, "CHANGELIST_PERIOD": 3650 * 86400
    }
    for title in ("a", "b", "c"):
        with committing():
            item = Item.objects.order_by("pk")[0]
            item.title = title
            item.save()
    closed = list(ChangeList.objects.filter(resource_set=tracked[1], until__isnull=False))
    assert len(closed) == 2
    files = [documents_storage / c.storage_name for c in closed]
    assert all(f.exists() for f in files)
    from django_resourcesync.tasks import close_changelists_task

    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + datetime.timedelta(hours=2))
    with committing():
        close_changelists_task()
    remaining = list(ChangeList.objects.filter(resource_set=tracked[1]))
    assert [c.until for c in remaining] == [None]
    assert not any(f.exists() for f in files)
    _, body, _ = fetch("/resourcesync/metadata/changelist.xml")
    doc = check_document(body, "changelist")
    assert md(doc)["from"] == remaining[0].from_time.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "from tells how far back the log goes"


def test_open_change_list_conditional_get(tracked, committing):
    status, _, response = fetch("/resourcesync/metadata/changelist.xml")
    etag = response["ETag"]
    assert fetch("/resourcesync/metadata/changelist.xml", **{"If-None-Match": etag})[0] == 304
    with committing():
        item = Item.objects.order_by("pk")[0]
        item.title = "changed"
        item.save()
    assert fetch("/resourcesync/metadata/changelist.xml", **{"If-None-Match": etag})[0] == 200


def test_change_list_capability_off_answers_404(tracked):
    metadata = tracked[1]
    metadata.capabilities = ["resourcelist"]
    metadata.save()
    assert fetch("/resourcesync/metadata/changelist.xml")[0] == 404
    _, body, _ = fetch("/resourcesync/metadata/capabilitylist.xml")
    assert [md(e)["capability"] for e in entries(check_document(body, "capabilitylist"))] == ["resourcelist"]


def test_change_log_admin(tracked, committing, admin_client):
    with committing():
        item = Item.objects.order_by("pk")[0]
        item.title = "changed"
        item.save()
    page = admin_client.get("/admin/resourcesync/changeevent/?change__exact=updated")
    assert page.status_code == 200 and item.get_metadata_url().encode() in page.content
    assert admin_client.get("/admin/resourcesync/changelist/").status_code == 200
    response = admin_client.post(
        "/admin/resourcesync/resourceset/", {"action": "reconcile", "_selected_action": [tracked[1].pk]}, follow=True
    )
    assert response.status_code == 200 and b"Reconciled 1 set." in response.content


@pytest.fixture
def background(tracked, monkeypatch, transactional_db):
    """Tasks sent to a broker (recorded here instead), so autocommit saves go through the
    dispatcher thread."""
    from django_resourcesync.tracking import outbox

    sent = []
    monkeypatch.setattr(outbox, "in_background", lambda task: True)
    monkeypatch.setattr(outbox, "send", lambda task, sources: sent.append(sorted(sources)))
    yield sent
    outbox.dispatcher.flush()


def test_autocommit_saves_reach_the_outbox_through_the_dispatcher(pages, tracked, background):
    from django_resourcesync.tracking import outbox

    items = list(Item.objects.order_by("pk")[:3])
    for item in items:
        item.title += " (autocommit)"
        item.save()
    assert outbox.dispatcher.flush()
    rows = set(PendingChange.objects.values_list("source", "object_pk", "related"))
    assert rows == (
        {(source, str(i.pk), "") for i in items for source in ("all-records", "metadata", "pages")}
        | {("bitstreams", str(i.pk), "repository.item") for i in items}
    )
    # Each save committed before the task was queued, and one task may serve several saves.
    sources = ["all-records", "bitstreams", "metadata", "pages"]
    assert background and len(background) <= len(items) and all(s == sources for s in background)
    counts = tracking.process_pending()
    files = ItemFile.objects.filter(item__in=items).count()
    assert (counts.updated, counts.unchanged) == (9, files), (
        "records (public and partners') and landing pages changed; the items' files did not"
    )
    assert PendingChange.objects.count() == 0


def test_transaction_saves_write_in_the_transaction_and_queue_at_commit(tracked, background):
    from django_resourcesync.tracking import outbox

    item = Item.objects.order_by("pk").first()
    with transaction.atomic():
        item.title += " (atomic)"
        item.save()
        assert PendingChange.objects.filter(source="metadata", object_pk=str(item.pk)).exists(), "written in the transaction"
        assert outbox.dispatcher.flush() and background == [], "nothing queued before the commit"
    assert outbox.dispatcher.flush() and background == [["all-records", "bitstreams", "metadata", "pages"]]
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            item.title += " (rolled back)"
            item.save()
            raise RuntimeError
    assert outbox.dispatcher.flush() and len(background) == 1
    assert PendingChange.objects.count() == 4  # the record, the partners' record, the landing page, the files (related)


def test_making_an_item_private_reaches_its_files_through_the_related_lookup(tracked, committing):
    item = Item.objects.order_by("pk").first()
    with committing():
        item.is_public = False
        item.save()
    assert {(c, loc) for c, loc, _ in changes(tracked[0])} == {
        ("deleted", f"http://testserver{f.get_absolute_url()}") for f in item.files.all()
    }


def test_reconcile_trusts_a_fingerprint_that_covers_the_entry(tracked, committing, monkeypatch):
    described = []
    from django_resourcesync.tracking import writer

    original = writer.entry_values
    monkeypatch.setattr(writer, "entry_values", lambda *a, **k: described.append(a[1]) or original(*a, **k))
    with committing():
        # The sets whose fingerprints cover their entries (landing pages are rendered every time).
        call_command("resourcesync_reconcile", "--set", "bitstreams", "--set", "metadata", verbosity=0)
    assert described == [], "nothing changed: no object described again"
    f = ItemFile.objects.order_by("pk").first()
    ItemFile.objects.filter(pk=f.pk).update(media_type="text/csv")  # no signal, no new lastmod
    with committing():
        call_command("resourcesync_reconcile", "--set", "bitstreams", "--set", "metadata", verbosity=0)
    assert [obj.pk for obj in described] == [f.pk]
    [(change, loc, meta)] = changes(tracked[0])
    assert (change, loc, meta["type"]) == ("updated", f"http://testserver{f.get_absolute_url()}", "text/csv")


def test_a_changed_record_keeps_its_key(tracked, committing):
    """Builds plan their parts by ranges of record keys: a change must not move a record."""
    item = Item.objects.order_by("pk").first()
    before = Resource.objects.get(resource_set=tracked[1], object_pk=str(item.pk))
    with committing():
        item.title += " (revised)"
        item.save()
    after = Resource.objects.get(resource_set=tracked[1], object_pk=str(item.pk))
    assert after.pk == before.pk and after.sha256 != before.sha256



def test_records_written_again_in_one_batch_are_those_a_first_record_would_write(tracked, committing):
    """Records are written again in place (an UPDATE where the database writes only the indexes
    of what changed): in one batch, a record changed at its URI, one moved to another, one of a
    new object and one removed; each record left is the one a set recorded from nothing has, and
    those written again keep their keys."""
    bitstreams = tracked[0]
    changed, moved, removed = ItemFile.objects.order_by("pk")[:3]
    keys = dict(Resource.objects.filter(resource_set=bitstreams).values_list("object_pk", "pk"))
    with tracking.paused():
        ItemFile.objects.filter(pk=changed.pk).update(media_type="text/csv")
        ItemFile.objects.filter(pk=moved.pk).update(name="moved.txt")
        ItemFile.objects.filter(pk=removed.pk).delete()
        added = ItemFile.objects.create(item=changed.item, name="added.txt", file=changed.file.name)
    with committing():
        tracking.changed(model=ItemFile, pks=[changed.pk, moved.pk, removed.pk, added.pk])
        tracking.process_pending()
    fields = ["object_pk", "uri", "lastmod", "md5", "sha256", "length", "media_type", "links", "fingerprint", "entry_xml"]
    written = {row["object_pk"]: row for row in Resource.objects.filter(resource_set=bitstreams).values("pk", *fields)}
    assert written[str(changed.pk)]["media_type"] == "text/csv"
    assert written[str(moved.pk)]["uri"].endswith("/moved.txt")
    assert str(removed.pk) not in written and str(added.pk) in written
    assert {key: row["pk"] for key, row in written.items() if key in (str(changed.pk), str(moved.pk))} == {
        str(changed.pk): keys[str(changed.pk)], str(moved.pk): keys[str(moved.pk)]
    }
    with committing():
        Resource.objects.filter(resource_set=bitstreams).delete()
        tracking.reconcile(bitstreams)
    fresh = {row["object_pk"]: row for row in Resource.objects.filter(resource_set=bitstreams).values(*fields)}
    assert {key: {name: row[name] for name in fields} for key, row in written.items()} == fresh
    # The URI the moved record left is free: another object may take it.
    old_uri = f"http://testserver{moved.get_absolute_url()}"
    assert not Resource.objects.filter(resource_set=bitstreams, uri=old_uri).exists()

def test_reconcile_builds_only_the_objects_whose_fingerprint_fields_changed(sizes_from_the_storage, tracked, committing):
    """The example's sources read their fingerprints as values: a reconcile builds no model
    instance of an unchanged object, and a file rewritten in place (same name, new length) is
    still found, the file field standing for its name and size (from the storage, for a source
    whose model records no size)."""
    from django.db.models.signals import post_init

    built = []

    def count(sender, instance, **kwargs):
        built.append((sender, instance.pk))

    f = ItemFile.objects.order_by("pk").first()
    item = Item.objects.order_by("pk").last()
    post_init.connect(count, sender=ItemFile)
    post_init.connect(count, sender=Item)
    try:
        with committing():
            call_command("resourcesync_reconcile", "--set", "bitstreams", "--set", "metadata", verbosity=0)
        assert built == [], "nothing changed: no object built"
        with f.file.open("wb") as out:
            out.write(b"rewritten in place, longer than before\n")
        Item.objects.filter(pk=item.pk).update(title="Changed behind the app's back")
        with committing():
            call_command("resourcesync_reconcile", "--set", "bitstreams", "--set", "metadata", verbosity=0)
    finally:
        post_init.disconnect(count, sender=ItemFile)
        post_init.disconnect(count, sender=Item)
    assert set(built) == {(ItemFile, f.pk), (Item, item.pk)}
    [(change, loc, meta)] = changes(tracked[0])
    assert (change, loc, int(meta["length"])) == ("updated", f"http://testserver{f.get_absolute_url()}", 39)
    assert meta["hash"].startswith("md5:")
    [(change, loc, _meta)] = changes(tracked[1])
    assert (change, loc) == ("updated", f"http://testserver{item.get_metadata_url()}")


def test_a_fingerprint_of_one_object_equals_that_of_its_batch(tracked):
    from django_resourcesync.sources import registry

    for name in ("bitstreams", "metadata"):
        source = registry.get(name)
        queryset = source.items()
        rows = queryset.values_list("pk", *source.fingerprint_fields)
        batch = tracking.fingerprints_of_rows(source, rows)
        assert len(batch) == queryset.count() and all(batch.values())
        assert {str(obj.pk): tracking.fingerprint_of(source, obj) for obj in queryset} == batch


def test_filter_in_passes_many_and_odd_values_as_one_parameter(tracked):
    """The shortcut change tracking takes for long IN lists finds exactly what the ORM does."""
    from django_resourcesync import bulk

    records = Resource.objects.filter(resource_set=tracked[1])
    uris = list(records.values_list("uri", flat=True))
    odd = ['http://testserver/it"em\'s/é/\u2603', "back\\slash", "", "%s", "?"]
    by_uri = bulk.filter_in(records, "uri", uris + odd)
    assert sorted(by_uri.values_list("uri", flat=True)) == sorted(uris)
    pks = list(records.values_list("pk", flat=True))
    assert set(
        bulk.filter_in(Resource.objects.all(), "pk", [str(pk) for pk in pks] + list(range(10**6, 10**6 + 40_000)))
    ) == set(records)
    assert bulk.filter_in(Resource.objects.all(), "resource_set", [tracked[1].pk]).count() == len(pks)
    files = bulk.filter_in(ItemFile.objects.all(), "item__collection", list(Collection.objects.values_list("pk", flat=True)))
    assert files.count() == ItemFile.objects.count()  # across a relation: the ORM's way


@pytest.mark.django_db
def test_filter_in_is_no_join_the_planner_can_misjudge_on_postgresql():
    """Just after a bulk changed() the pending changes' table holds thousands of rows the
    planner has never counted: a long key list must be a plain test of each row (an array the
    planner knows the length of), not a join with a subquery it guesses holds one row, which
    made it compare every row with every key (seconds a batch)."""
    from django.db import connection

    from django_resourcesync import bulk

    if connection.vendor != "postgresql":
        pytest.skip("the planner's choice is PostgreSQL's")
    PendingChange.objects.bulk_create(PendingChange(source="metadata", object_pk=str(n)) for n in range(5000))
    keys = [str(n) for n in range(0, 5000, 2)]
    queryset = bulk.filter_in(PendingChange.objects.all(), "object_pk", keys)
    sql, params = queryset.values_list("pk").query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Join" not in plan and "Nested Loop" not in plan, plan
    assert queryset.count() == len(keys)


def test_reconcile_drops_records_whose_key_is_no_integer_of_an_object(tracked, committing):
    """Records left by an earlier source of the set, with keys that are not str() of an
    integer key, are gone: never cast to a key they are not (on SQLite "12abc" would be 12)."""
    metadata = tracked[1]
    pk = Item.objects.order_by("pk").first().pk
    odd = [f"{pk}f0e4c2-uuid", f"00{pk}", "slug-of-old-source", f"{pk}.0"]
    for n, key in enumerate(odd):
        Resource.objects.create(resource_set=metadata, object_pk=key, uri=f"http://testserver/old/{n}", entry_xml="<url/>")
    with committing():
        call_command("resourcesync_reconcile", verbosity=0)
    assert not Resource.objects.filter(resource_set=metadata, object_pk__in=odd).exists()
    assert Resource.objects.filter(resource_set=metadata, object_pk=str(pk)).exists()
    assert {loc for c, loc, _ in changes(metadata) if c == "deleted"} == {f"http://testserver/old/{n}" for n in range(len(odd))}


def test_reconcile_drops_records_whose_key_reads_as_an_integer_but_is_not_the_objects(tracked, committing, monkeypatch):
    """Keys that every database would cast to an object's key ("007", "+7", " 7") are not that
    object's: str() of its key is. Where every key casts (PostgreSQL's quicker search for gone
    records), they are found gone all the same, as is a key of no object."""
    from django.db import connection

    reconcile = importlib.import_module("django_resourcesync.tracking.reconcile")
    metadata = tracked[1]
    pk = Item.objects.order_by("pk").first().pk
    odd = [f"00{pk}", f"+{pk}", f" {pk}", "987654321"]
    for n, key in enumerate(odd):
        Resource.objects.create(resource_set=metadata, object_pk=key, uri=f"http://testserver/odd/{n}", entry_xml="<url/>")
    searched = []
    original = reconcile._gone_integer_keys_postgresql

    def spied(*args):
        searched.append(original(*args))
        return searched[-1]

    monkeypatch.setattr(reconcile, "_gone_integer_keys_postgresql", spied)
    with committing():
        call_command("resourcesync_reconcile", verbosity=0)
    assert not Resource.objects.filter(resource_set=metadata, object_pk__in=odd).exists()
    assert Resource.objects.filter(resource_set=metadata, object_pk=str(pk)).exists()
    assert {loc for c, loc, _ in changes(metadata) if c == "deleted"} == {f"http://testserver/odd/{n}" for n in range(len(odd))}
    if connection.vendor == "postgresql":  # the quick search found them, no fallback
        assert searched
        assert all(found is not None for found in searched)
        assert set(odd) <= {key for found in searched for key in found}


def test_a_change_committed_after_the_objects_were_read_is_not_hidden(tracked, committing, monkeypatch):
    """A fingerprint newer than the object it is stored with would make the next comparison
    find nothing to do: fingerprints are read before the objects, so a rename committed by
    another process once the objects were read still arrives."""
    bitstreams = tracked[0]
    f = ItemFile.objects.order_by("pk").first()
    original = tracking.SetWriter.apply
    renamed = []

    def rename_then_apply(self, objects, *args, **kwargs):
        if self.resource_set == bitstreams and not renamed:  # the objects are read: rename now
            renamed.append(f.pk)
            with tracking.paused():
                ItemFile.objects.filter(pk=f.pk).update(name="renamed.txt")
            tracking.changed(model=ItemFile, pks=[f.pk])
        return original(self, objects, *args, **kwargs)

    monkeypatch.setattr(tracking.SetWriter, "apply", rename_then_apply)
    with committing():
        tracking.changed(model=ItemFile, pks=[f.pk])
    assert renamed
    monkeypatch.undo()
    with committing():
        tracking.process_pending()
        call_command("resourcesync_reconcile", verbosity=0)
    f.refresh_from_db()
    record = Resource.objects.get(resource_set=bitstreams, object_pk=str(f.pk))
    assert record.uri == f"http://testserver{f.get_absolute_url()}" and record.uri.endswith("/renamed.txt")
    assert ("created", record.uri) in {(c, loc) for c, loc, _ in changes(bitstreams)}


@pytest.mark.django_db
def test_an_object_given_the_uri_of_another_is_left_out_and_the_owner_keeps_publishing_it(seed, metadata, monkeypatch, caplog):
    seed(3)
    tracking.reconcile(metadata)
    first, second, _third = Item.objects.order_by("pk")
    records = dict(Resource.objects.filter(resource_set=metadata).values_list("object_pk", "uri"))
    source = metadata.get_source()
    location = type(source).location
    # A site whose second item now claims the page of the first.
    monkeypatch.setattr(type(source), "location",
                        lambda self, obj: location(self, first) if obj.pk == second.pk else location(self, obj))
    both = Item.objects.filter(pk__in=[first.pk, second.pk])
    both.update(title="Both retitled")
    tracking.changed(both)
    after = ChangeEvent.objects.filter(resource_set=metadata).order_by("-id").values_list("id", flat=True).first() or 0
    tracking.process_pending()
    # The first item keeps its URI and publishes its change; the second keeps its record as it
    # was (no event: a Destination hears of nothing it cannot fetch), and the log says why.
    assert dict(Resource.objects.filter(resource_set=metadata).values_list("object_pk", "uri")) == records
    new = ChangeEvent.objects.filter(resource_set=metadata, id__gt=after)
    assert list(new.values_list("object_pk", "change", "uri")) == [(str(first.pk), "updated", records[str(first.pk)])]
    assert f"object {second.pk} has the URI {records[str(first.pk)]} of object {first.pk}; not published" in caplog.text


@pytest.mark.parametrize("year", [1, 999])
def test_a_lastmod_before_the_year_1000_is_written_with_the_four_digits_the_schema_asks(tracked, year):
    """xs:dateTime years have four digits at least; the C library's %Y writes 999 as "999"."""
    bitstreams, _metadata = tracked
    early = datetime.datetime(year, 3, 4, 5, 6, 7, 890000, tzinfo=datetime.timezone.utc)
    changed = ItemFile.objects.order_by("pk").first()
    # No signal: the reconcile finds it. A new type too: a change of lastmod alone is no event.
    ItemFile.objects.filter(pk=changed.pk).update(modified=early, media_type="application/x-early")
    build(bitstreams)
    written = f"{year:04d}-03-04T05:06:07.890000Z"
    listed = {entry.find(f"{{{SM}}}loc").text: entry.find(f"{{{SM}}}lastmod").text for entry in resource_list_entries(bitstreams)}
    assert listed["http://testserver" + changed.get_absolute_url()] == written
    status, body, _ = fetch("/resourcesync/bitstreams/changelist.xml")
    (entry,) = [entry for entry in entries(check_document(body, "changelist")) if md(entry)["change"] == "updated"]
    assert entry.find(f"{{{SM}}}lastmod").text == written
