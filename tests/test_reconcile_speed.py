"""Reconcile near the read limit: fingerprints made and compared in the database, file sizes from
the storage's listing, and the same changes found as before."""

import hashlib
import importlib
import os
import socket
import subprocess
import sys
import time

import pytest
from django.db.models.signals import post_init

from django_resourcesync import tracking
from django_resourcesync.models import ChangeEvent, Resource
from example_project.repository.models import Collection, Item, ItemFile

from .helpers import build

pytestmark = pytest.mark.django_db
reconciling = importlib.import_module("django_resourcesync.tracking.reconcile")  # the module, not the function

ALL = ["resourcelist", "changelist"]


@pytest.fixture
def tracked(seed, bitstreams, metadata, django_capture_on_commit_callbacks):
    for resource_set in (bitstreams, metadata):
        resource_set.capabilities = ALL
        resource_set.save()
    with django_capture_on_commit_callbacks(execute=True):
        seed(6)
    build(bitstreams)
    build(metadata)
    return bitstreams, metadata


class Built:
    """Counts the model instances built (post_init) while it is open."""

    def __init__(self):
        self.objects = []

    def __call__(self, sender, instance, **kwargs):
        self.objects.append((sender, instance.pk))

    def __enter__(self):
        for model in (Item, ItemFile, Collection):
            post_init.connect(self, sender=model)
        return self

    def __exit__(self, *exc):
        for model in (Item, ItemFile, Collection):
            post_init.disconnect(self, sender=model)


def events(resource_set):
    return list(ChangeEvent.objects.filter(resource_set=resource_set).order_by("id").values_list("change", "object_pk"))


def test_both_example_sources_are_compared_in_the_database(tracked):
    for resource_set in tracked:
        source = resource_set.get_source()
        assert reconciling._compared_in_database(resource_set, source, source.queryset(resource_set.lookups))


def test_nothing_changed_builds_nothing_and_finds_nothing(tracked, committing):
    before = [events(resource_set) for resource_set in tracked]
    with Built() as built, committing():
        counts = [tracking.reconcile(resource_set) for resource_set in tracked]
    assert built.objects == []
    assert [events(resource_set) for resource_set in tracked] == before
    assert [c.unchanged for c in counts] == [ItemFile.objects.count(), Item.objects.count()]
    assert all(c.created == c.updated == c.deleted == 0 for c in counts)


def test_changes_made_behind_the_signals_are_found_in_the_database(sizes_from_the_storage, tracked, committing):
    # Sizes from the storage (a source whose model records none): bytes rewritten in place are found.
    bitstreams, metadata = tracked
    first, second = ItemFile.objects.order_by("pk")[:2]
    item = Item.objects.order_by("pk").last()
    with tracking.paused():
        # A field of fingerprint_fields, by queryset.update() (no signal).
        ItemFile.objects.filter(pk=first.pk).update(media_type="text/csv")
        # A file's bytes rewritten under the same name with another size.
        with second.file.open("wb") as out:
            out.write(b"other bytes, another length\n")
        # A related object's field: the collection's name the record shows.
        Collection.objects.filter(pk=item.collection_id).update(name="Renamed behind the app's back")
    before = {rs.pk: len(events(rs)) for rs in tracked}
    with Built() as built, committing():
        file_counts = tracking.reconcile(bitstreams)
        record_counts = tracking.reconcile(metadata)
    renamed = set(Item.objects.filter(collection_id=item.collection_id).values_list("pk", flat=True))
    assert {pk for model, pk in built.objects if model is ItemFile} == {first.pk, second.pk}
    assert {pk for model, pk in built.objects if model is Item} == renamed
    assert file_counts.updated == 2 and record_counts.updated == len(renamed)
    assert set(events(bitstreams)[before[bitstreams.pk]:]) == {("updated", str(first.pk)), ("updated", str(second.pk))}
    assert set(events(metadata)[before[metadata.pk]:]) == {("updated", str(pk)) for pk in renamed}
    second_record = Resource.objects.get(resource_set=bitstreams, object_pk=str(second.pk))
    assert second_record.length == len(b"other bytes, another length\n")
    # Found once: the next reconcile finds nothing more.
    with Built() as built, committing():
        assert tracking.reconcile(bitstreams).updated == 0 and tracking.reconcile(metadata).updated == 0
    assert built.objects == []


def test_deleted_and_added_objects_are_still_found(tracked, committing):
    bitstreams, metadata = tracked
    item = Item.objects.order_by("pk").first()
    files = list(item.files.values_list("pk", flat=True))
    with tracking.paused():
        Item.objects.filter(pk=item.pk).delete()
    with committing():
        assert tracking.reconcile(bitstreams).deleted == len(files)
        assert tracking.reconcile(metadata).deleted == 1
    assert not Resource.objects.filter(resource_set=metadata, object_pk=str(item.pk)).exists()
    with tracking.paused():  # as if added by raw SQL: nothing told
        added = ItemFile.objects.create(item=Item.objects.order_by("pk").last(), name="added.txt",
                                        media_type="text/plain", file="items/added.txt")
    with open(os.path.join(added.file.storage.location, "items", "added.txt"), "wb") as out:
        out.write(b"added\n")
    with committing():
        assert tracking.reconcile(bitstreams).created == 1
    assert Resource.objects.filter(resource_set=bitstreams, object_pk=str(added.pk)).exists()


def test_as_many_records_as_objects_leave_none_gone_without_the_search(tracked, committing, monkeypatch):
    """With nothing left out, a set with as many records as objects has no record whose object
    is gone: the anti-join that looks for them is not run. One record more, and it is."""
    searched = []
    search = reconciling._gone_keys
    monkeypatch.setattr(reconciling, "_gone_keys", lambda resource_set, *args: searched.append(resource_set.slug)
                        or search(resource_set, *args))
    with committing():
        for resource_set in tracked:
            tracking.reconcile(resource_set)
    assert searched == []
    item = Item.objects.order_by("pk").first()
    files = item.files.count()
    with tracking.paused():
        Item.objects.filter(pk=item.pk).delete()
    with committing():
        assert [tracking.reconcile(resource_set).deleted for resource_set in tracked] == [files, 1]
    assert searched == ["bitstreams", "metadata"]
    with committing():  # the path that reads the fingerprints out counts nothing: it searches
        tracking.reconcile(tracked[0], in_database=False)
    assert searched[2:] == ["bitstreams"]


def test_a_left_out_object_does_not_hide_a_gone_record(tracked, committing):
    """An object left out has no record: with one record gone besides, the counts agree, and
    the search for gone records runs all the same."""
    from django_resourcesync.models import LeftOut

    bitstreams, _metadata = tracked
    with tracking.paused():  # its bytes are nowhere: no entry can be made of it
        ItemFile.objects.create(item=Item.objects.order_by("pk").last(), name="missing.txt",
                                media_type="text/plain", file="items/missing.txt")
    with committing():
        tracking.reconcile(bitstreams)
    assert LeftOut.objects.filter(resource_set=bitstreams).count() == 1
    gone = ItemFile.objects.exclude(name="missing.txt").order_by("pk").first()
    with tracking.paused():
        ItemFile.objects.filter(pk=gone.pk).delete()
    objects = bitstreams.get_source().queryset(bitstreams.lookups)
    assert Resource.objects.filter(resource_set=bitstreams).count() == objects.count()
    with committing():
        assert tracking.reconcile(bitstreams).deleted == 1
    assert not Resource.objects.filter(resource_set=bitstreams, object_pk=str(gone.pk)).exists()


def test_a_query_that_may_give_an_object_twice_is_not_counted_on():
    one_each = [
        ItemFile.objects.filter(item__is_public=True),
        Item.objects.filter(collection__name="Theses"),
        Item.objects.filter(files__name="item-1.txt").distinct(),
    ]
    twice = [
        Item.objects.filter(files__media_type="text/plain"),  # an item with two such files
        Item.objects.filter(pk=1).union(Item.objects.filter(pk=1), all=True),
    ]
    assert [reconciling._one_row_per_object(queryset) for queryset in one_each] == [True] * 3
    assert [reconciling._one_row_per_object(queryset) for queryset in twice] == [False] * 2


def test_every_path_stores_the_same_fingerprint(tracked, committing):
    """Change processing, one object's fingerprint and reconcile agree, so none of them makes
    the others describe an object again."""
    for resource_set in tracked:
        source = resource_set.get_source()
        queryset = source.queryset(resource_set.lookups)
        recorded = dict(Resource.objects.filter(resource_set=resource_set).values_list("object_pk", "fingerprint"))
        batch = tracking.fingerprints_of_rows(source, queryset.values_list("pk", *source.fingerprint_fields))
        assert batch == recorded and all(batch.values())
        assert {str(obj.pk): tracking.fingerprint_of(source, obj) for obj in queryset} == batch


def test_the_first_reconcile_after_the_fingerprint_changed_form_writes_no_event(tracked, committing):
    """An upgrade changes the stored fingerprints' form: the first reconcile then describes every
    object again, and writes no change event for one whose entry did not change."""
    before = [events(resource_set) for resource_set in tracked]
    for resource_set in tracked:
        for record in Resource.objects.filter(resource_set=resource_set):
            Resource.objects.filter(pk=record.pk).update(fingerprint="0" * 64)  # an older form
    with Built() as built, committing():
        # Small batches: the pass stops when one is full and resumes after it.
        counts = [tracking.reconcile(resource_set, batch_size=3) for resource_set in tracked]
    assert {model for model, _pk in built.objects} >= {Item, ItemFile}, "every object described again"
    assert counts[0].unchanged == ItemFile.objects.count() and counts[1].unchanged == Item.objects.count()
    assert [events(resource_set) for resource_set in tracked] == before
    assert all(c.created == c.updated == c.deleted == 0 for c in counts)
    with Built() as built, committing():
        [tracking.reconcile(resource_set) for resource_set in tracked]
    assert built.objects == [], "the new fingerprints stored"


def test_a_size_field_stands_for_the_file_without_asking_the_storage(tracked, committing, monkeypatch):
    """``fingerprint_file_sizes`` names the field that records a file's size: it is read in the
    database with the others, and the storage is not asked."""
    from django_resourcesync import listing

    bitstreams = tracked[0]
    source = bitstreams.get_source()
    # Any to-one column shows that the storage is not asked (the example's files name their own
    # size field: tests/test_file_sizes.py).
    monkeypatch.setattr(type(source), "fingerprint_file_sizes", {"file": "item_id"})
    source.__dict__.pop("_fingerprint_digest", None)
    try:
        assert source.fingerprint_expression()[1] == []
        monkeypatch.setattr(listing.FileSizes, "size", lambda self, name: pytest.fail("the storage was asked"))
        with committing():
            tracking.reconcile(bitstreams)  # the fingerprints' form changed: every file described once
        with Built() as built, committing():
            counts = tracking.reconcile(bitstreams)
        assert built.objects == [] and counts.unchanged == ItemFile.objects.count()
    finally:
        source.__dict__.pop("_fingerprint_digest", None)


def test_a_source_without_fingerprint_fields_takes_the_python_path(tracked, committing, pages):
    pages.capabilities = ALL
    pages.save()
    build(pages)
    source = pages.get_source()
    assert not source.fingerprint_fields
    assert not reconciling._compared_in_database(pages, source, source.queryset(pages.lookups))
    item = Item.objects.order_by("pk").first()
    with tracking.paused():
        Item.objects.filter(pk=item.pk).update(title="Retitled behind the app's back")
    with committing():
        counts = tracking.reconcile(pages)
    assert counts.updated == 1 and counts.unchanged == Item.objects.count() - 1
    with tracking.paused():
        Item.objects.filter(pk=item.pk).delete()
    with committing():
        assert tracking.reconcile(pages).deleted == 1


def test_the_python_path_finds_what_the_database_path_finds(tracked, committing):
    bitstreams, metadata = tracked
    f = ItemFile.objects.order_by("pk").first()
    with tracking.paused():
        ItemFile.objects.filter(pk=f.pk).update(name="renamed.txt")
    with Built() as built, committing():
        counts = tracking.reconcile(bitstreams, in_database=False)
        assert tracking.reconcile(metadata, in_database=False).updated == 0
    assert {pk for model, pk in built.objects if model is ItemFile} == {f.pk}
    assert counts.deleted == 1 and counts.created == 1  # moved: deleted at the old URI, created at the new


# -- S3: sizes from the listing ---------------------------------------------------------------


@pytest.fixture(scope="module")
def s3_endpoint():
    pytest.importorskip("boto3")
    pytest.importorskip("storages")
    if os.environ.get("TEST_S3_ENDPOINT_URL"):
        yield os.environ["TEST_S3_ENDPOINT_URL"].rstrip("/")
        return
    try:
        import moto.server  # noqa: F401
    except ImportError:
        pytest.skip("moto's server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                pytest.skip("moto's S3 server did not start")
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}"
    server.terminate()
    server.wait(timeout=30)


@pytest.fixture
def s3_media(settings, s3_endpoint):
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                          region_name="us-east-1")
    bucket = f"media-{time.monotonic_ns()}"
    client.create_bucket(Bucket=bucket)
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {"bucket_name": bucket, "endpoint_url": s3_endpoint, "access_key": "test", "secret_key": "test",
                        "region_name": "us-east-1", "file_overwrite": True},
        },
    }
    return client, bucket


FILES = 2_500


def test_file_sizes_on_s3_come_from_the_listing_not_a_request_per_file(sizes_from_the_storage, seed, bitstreams, s3_media,
                                                                        committing):
    """2,500 files: a reconcile asks S3 for a few listing pages, not 2,500 HEADs (for a source
    whose model records no file size: the example's files set records them, and asks nothing)."""
    from concurrent.futures import ThreadPoolExecutor

    from django.core.files.storage import default_storage

    from django_resourcesync.tracking.writer import RECORD_FIELDS, entry_values

    client, bucket = s3_media
    with tracking.paused():
        seed(1, file_size=16)  # one item and its files, through the storage
    item = Item.objects.get()
    # Many more files of that item, put straight into the bucket (a few at a time), the rows
    # in bulk: seeding 2,500 through the app's saves would take minutes of moto's time.
    names = [f"items/{item.pk}/bulk-{n:05}.txt" for n in range(FILES - ItemFile.objects.count())]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda name: client.put_object(Bucket=bucket, Key=name, Body=b"x" * (16 + len(name) % 7)), names))
    with tracking.paused():
        ItemFile.objects.bulk_create(
            ItemFile(item=item, name=name.rsplit("/", 1)[1], media_type="text/plain", file=name) for name in names
        )
    assert ItemFile.objects.count() == FILES
    # The baseline: the records a reconcile writes, but without reading 2,500 files' bytes
    # (a GET each from moto): their hashes are made up, the fingerprints are the source's own.
    source = bitstreams.get_source()
    queryset = source.queryset(bitstreams.lookups)
    fingerprints = tracking.fingerprints_of_rows(source, queryset.values_list("pk", *source.fingerprint_fields))
    rows = []
    for obj in queryset.order_by("pk"):
        known = {"fingerprint": fingerprints[str(obj.pk)], "md5": "0" * 32, "sha256": "0" * 64, "length": 0,
                 "media_type": "text/plain"}
        values = entry_values(source, obj, known, fingerprints[str(obj.pk)])
        rows.append(Resource(resource_set=bitstreams, object_pk=str(obj.pk), **values))
    Resource.objects.bulk_create(rows)
    assert set(RECORD_FIELDS) - {"resource_set_id", "object_pk", "recorded"} <= set(values)

    s3 = default_storage.bucket.meta.client
    requests = []

    def count(request=None, **kwargs):
        requests.append(getattr(request, "method", "?"))

    s3.meta.events.register("before-send.s3", count)
    try:
        with Built() as built, committing():
            counts = tracking.reconcile(bitstreams)
        assert built.objects == [] and counts.unchanged == FILES
        assert 1 <= len(requests) <= 5, requests  # three pages of 1,000 keys
        assert set(requests) == {"GET"}
        # A file rewritten with another size under the same name is found through the listing.
        changed = ItemFile.objects.order_by("pk")[FILES // 2]
        client.put_object(Bucket=bucket, Key=changed.file.name, Body=b"y" * 100)
        requests.clear()
        with committing():
            counts = tracking.reconcile(bitstreams)
        assert counts.updated == 1 and counts.unchanged == FILES - 1
        assert Resource.objects.get(resource_set=bitstreams, object_pk=str(changed.pk)).length == 100
        assert len(requests) <= 10, requests  # the listing, then the one file read
    finally:
        s3.meta.events.unregister("before-send.s3", count)


def test_sqlite_keeps_a_short_text_as_its_own_fingerprint_and_upgrades_digests_without_reading(
    tracked, committing, monkeypatch
):
    """On SQLite a short text of the values is the fingerprint (no Python digest a row); the
    records an older version wrote, its MD5 digest, are rewritten by the next reconcile with no
    event and no object's bytes read again (their hashes still stand)."""
    from django.db import connection
    from django.db.models import F

    from django_resourcesync import fingerprints

    if connection.vendor != "sqlite":
        pytest.skip("the short form is SQLite's")
    bitstreams, _metadata = tracked
    source = bitstreams.get_source()
    lookups = source._fingerprint_digest[0]
    old_form = fingerprints.MD5(fingerprints._Joined(*(fingerprints._Quoted(F(lookup)) for lookup in lookups)))
    queryset = source.queryset(bitstreams.lookups)
    digests = dict(queryset.annotate(old=old_form).values_list("pk", "old"))
    records = Resource.objects.filter(resource_set=bitstreams)
    recorded = dict(records.values_list("object_pk", "fingerprint"))
    assert recorded and all(fingerprint.startswith("=") for fingerprint in recorded.values())
    # The old form is what SQLite's MD5 made of the same text.
    assert {key: fingerprints.digested_form(fp) for key, fp in recorded.items()} == {str(k): v for k, v in digests.items()}
    for key, fingerprint in recorded.items():
        records.filter(object_pk=key).update(fingerprint=fingerprints.digested_form(fingerprint))
    before = events(bitstreams)
    read = []
    original = type(source).bitstream
    monkeypatch.setattr(type(source), "bitstream", lambda self, obj: read.append(obj.pk) or original(self, obj))
    with committing():
        counts = tracking.reconcile(bitstreams)
    assert counts.unchanged == len(recorded) and counts.created == counts.updated == counts.deleted == 0
    assert read == [], "no bytes read again"
    assert events(bitstreams) == before
    assert dict(records.values_list("object_pk", "fingerprint")) == recorded


def test_the_digested_form_of_a_short_fingerprint_keeps_the_sizes_apart():
    from django_resourcesync.fingerprints import digested_form

    assert digested_form("0" * 32) is None  # a digest already
    assert digested_form("='a:1',5") == hashlib.md5(b"'a:1',5").hexdigest()  # a colon inside a literal
    assert digested_form("='a',5:12,") == hashlib.md5(b"'a',5").hexdigest() + ":12,"  # the sizes of two files
    assert digested_form("='a',NULL:") == hashlib.md5(b"'a',NULL").hexdigest() + ":"  # no file


# --- A reconcile in one process: the differing rows read on threads beside the writing one --------


def reading_threads():
    """The threads that read a reconcile's differing rows in one process, by their names: two on
    PostgreSQL, one on SQLite (the test database is a file in write-ahead-log mode)."""
    from django.db import connection

    count = 2 if connection.vendor == "postgresql" else 1
    return {f"resourcesync-reconcile_{index}" for index in range(count)}


@pytest.fixture
def read_on_threads(transactional_db, settings, seed, bitstreams, django_capture_on_commit_callbacks, monkeypatch):
    """The files' set recorded, with ranges of 4 keys (several of the 9 files' ranges) and
    reading threads; returns ``(set, [(range bounds, thread name)])``, what each range was read
    by. With two threads, the first two ranges are read at once (or the test fails in 30 s)."""
    import threading

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 4, "BUILD_THREADS": 2}
    bitstreams.capabilities = ALL
    bitstreams.save()
    with django_capture_on_commit_callbacks(execute=True):
        seed(7)  # 9 files
    build(bitstreams)
    seen = []
    together = len(reading_threads())
    meeting = threading.Barrier(together, timeout=30)
    real = reconciling._in_range

    def spy(rows, bounds):
        seen.append((bounds, threading.current_thread().name))
        if len(seen) <= together:
            meeting.wait()
        return real(rows, bounds)

    monkeypatch.setattr(reconciling, "_in_range", spy)
    return bitstreams, seen


def threads_left():
    """The threads of a reconcile (its reading threads, its count) still running."""
    import threading

    names = ("resourcesync-reconcile", "resourcesync-count")
    return [thread for thread in threading.enumerate() if thread.name.startswith(names)]


def change_every_other_file():
    files = list(ItemFile.objects.order_by("pk").values_list("pk", flat=True))[::2]
    ItemFile.objects.filter(pk__in=files).update(media_type="text/csv")
    return {str(pk) for pk in files}


def test_a_reconcile_reads_the_differing_rows_on_threads_and_finds_every_change_once(read_on_threads):
    bitstreams, seen = read_on_threads
    changed = change_every_other_file()
    counts = tracking.reconcile(bitstreams)
    assert counts.updated == len(changed) == 5 and counts.unchanged == 4
    assert {key for change, key in events(bitstreams)} == changed, "each change once"
    csv = Resource.objects.filter(resource_set=bitstreams, media_type="text/csv")
    assert changed <= set(csv.values_list("object_pk", flat=True))
    assert len(seen) >= 3 and {name for _bounds, name in seen} == reading_threads(), seen
    assert not threads_left()
    assert tracking.reconcile(bitstreams).updated == 0


def test_a_reading_thread_that_fails_fails_the_reconcile_and_the_next_one_finds_the_rest(
    read_on_threads, monkeypatch
):
    import threading

    bitstreams, seen = read_on_threads
    changed = change_every_other_file()
    spy = reconciling._in_range

    def fails_on_the_third(rows, bounds):
        if len(seen) == 2:
            seen.append((bounds, threading.current_thread().name))
            raise ConnectionError("the database went away")
        return spy(rows, bounds)

    monkeypatch.setattr(reconciling, "_in_range", fails_on_the_third)
    with pytest.raises(ConnectionError, match="went away"):
        tracking.reconcile(bitstreams)
    assert not threads_left()
    monkeypatch.setattr(reconciling, "_in_range", spy)
    tracking.reconcile(bitstreams)
    assert sorted(key for change, key in events(bitstreams)) == sorted(changed), "each change once"


def test_a_write_that_fails_stops_the_reading_threads(read_on_threads, monkeypatch):
    bitstreams, seen = read_on_threads
    change_every_other_file()

    def broken(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(reconciling, "_apply_batch", broken)
    with pytest.raises(OSError, match="No space"):
        tracking.reconcile(bitstreams)
    assert {name for _bounds, name in seen} == reading_threads(), "read on threads"
    assert not threads_left()


def test_a_range_of_a_reconcile_in_parts_is_read_by_its_worker_alone(read_on_threads, monkeypatch):
    """The workers share a reconcile's ranges: one range is not cut into ranges for threads again."""
    import threading

    bitstreams, seen = read_on_threads
    seen.extend([None, None])  # past the first two ranges: no thread waits for another
    changed = change_every_other_file()
    cut = []
    monkeypatch.setattr(reconciling, "_key_ranges", lambda *args: cut.append(args) or [])
    read_by = []
    batches = reconciling._batches
    monkeypatch.setattr(reconciling, "_batches",
                        lambda *args: read_by.append(threading.current_thread().name) or batches(*args))
    options = {"after": None, "last": None, "record_events": True, "batch_size": 100}
    counts = reconciling._reconcile_range(bitstreams, options, lambda: None)
    assert counts["updated"] == len(changed) and cut == [] and set(read_by) == {"MainThread"}


def test_on_sqlite_the_reading_thread_fetches_each_page_of_rows_at_once(read_on_threads, monkeypatch):
    """One step of the SQLite library a page, not one a row: between rows the reading thread
    would wait for the interpreter, which the writing thread holds."""
    import threading

    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("pages are fetched at once on SQLite")
    bitstreams, _seen = read_on_threads
    fetched_by = []
    real = reconciling._fetched_at_once

    def spy(page):
        fetched_by.append(threading.current_thread().name)
        return real(page)

    monkeypatch.setattr(reconciling, "_fetched_at_once", spy)
    changed = change_every_other_file()
    counts = tracking.reconcile(bitstreams)
    assert counts.updated == len(changed) and set(fetched_by) == {"resourcesync-reconcile_0"}
    assert {key for change, key in events(bitstreams)} == changed


def test_on_sqlite_a_page_fetched_at_once_is_the_page_fetched_row_by_row(seed, bitstreams):
    """Odd names (quotes, non-ASCII, control characters, a name long enough to be digested),
    a missing size: the JSON the page travels in gives back the same values, in key order."""
    from django.db import connection

    from django_resourcesync import fingerprints

    if not reconciling._fetches_at_once(connection.alias):
        pytest.skip("pages are fetched at once on SQLite")
    seed(4)
    odd = ["it's \"quoted\", twice ''", "Ünïcødé ✓ 文件.txt", "tab\there\x01\x7f", "x" * 300]
    for pk, name in zip(ItemFile.objects.order_by("-pk").values_list("pk", flat=True), odd):
        ItemFile.objects.filter(pk=pk).update(name=name, size=None)
    source = bitstreams.get_source()
    expression, _files = source.fingerprint_expression(connection.alias)
    rows = source.queryset(bitstreams.lookups).annotate(**fingerprints.annotations(expression))
    rows = rows.values_list("pk", "_rs_fingerprint").order_by("pk")
    fetched = reconciling._fetched_at_once(rows[:100])
    assert fetched == list(rows[:100]) and len(fetched) == ItemFile.objects.count()
    assert reconciling._fetched_at_once(rows[:3]) == list(rows[:3])
    assert reconciling._fetched_at_once(rows.filter(pk__lt=0)[:3]) == []
    assert sum(not fingerprint.startswith("=") for _pk, fingerprint in fetched) == 1, "the long name digested"


def test_a_reconcile_reads_in_its_writing_thread_where_a_reader_could_not_go_on_beside_it(
    transactional_db, settings, monkeypatch
):
    from django.db import connection, transaction

    from django_resourcesync import threads

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BUILD_THREADS": 2}
    assert threads.beside_a_writer("default") == len(reading_threads())
    with transaction.atomic():
        assert threads.beside_a_writer("default") == 0, "another connection would not see this transaction's rows"
    if connection.vendor == "sqlite":
        # Outside write-ahead-log mode a reader holds up the writer's commits.
        monkeypatch.setattr(threads, "_journal_mode", lambda connection: "delete")
        assert threads.beside_a_writer("default") == 0
        monkeypatch.undo()
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BUILD_THREADS": 1}
    assert threads.beside_a_writer("default") == 0


@pytest.mark.parametrize("processed", [True, False], ids=["processed", "unprocessed"])
@pytest.mark.parametrize("in_parts", [False, True], ids=["one-pass", "in-parts"])
def test_a_change_written_between_the_reading_of_an_object_and_its_batch_is_not_undone(
    tracked, committing, monkeypatch, settings, in_parts, processed
):
    """A reconcile reads the objects it found changed, then takes the set's lock to write them:
    a save in between, written into the set by a worker or not yet, must not be overwritten by
    the state read before it, nor published after it as the latest change. In parts, a range
    describes its objects before it takes the lock: what it described of the older state is
    not used."""
    bitstreams, _metadata = tracked
    if in_parts:
        settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 3}
    f = ItemFile.objects.order_by("pk").first()
    ItemFile.objects.filter(pk=f.pk).update(media_type="text/csv")  # behind the signals: the reconcile finds it
    real = reconciling._objects_of

    def read_then_saved_elsewhere(*args, **kwargs):
        objects = real(*args, **kwargs)
        with committing():
            ItemFile.objects.filter(pk=f.pk).update(media_type="text/tab-separated-values")
            if processed:
                tracking.changed(model=ItemFile, pks=[f.pk])
                tracking.process_pending()
        return objects

    monkeypatch.setattr(reconciling, "_objects_of", read_then_saved_elsewhere)
    with committing():
        tracking.reconcile(bitstreams, parallel=in_parts)
    record = Resource.objects.get(resource_set=bitstreams, object_pk=str(f.pk))
    assert record.media_type == "text/tab-separated-values"
    last = ChangeEvent.objects.filter(resource_set=bitstreams, object_pk=str(f.pk)).order_by("-id").first()
    assert last.media_type == "text/tab-separated-values"
