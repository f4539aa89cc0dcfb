"""The example's files record their sizes (``ItemFile.size``), and its files set names that field in
``fingerprint_file_sizes``: a reconcile makes every fingerprint in the database, and asks the
storage for nothing."""

import importlib
import os
import types

import pytest
from django.apps import apps
from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage
from django.db import connection
from django.db.models.signals import post_init

from django_resourcesync import listing, tracking
from django_resourcesync.models import ChangeEvent, Resource
from example_project.repository.models import ItemFile

from .helpers import build

pytestmark = pytest.mark.django_db
reconciling = importlib.import_module("django_resourcesync.tracking.reconcile")
migration = importlib.import_module("example_project.repository.migrations.0004_itemfile_size")


@pytest.fixture
def tracked(seed, bitstreams, committing):
    bitstreams.capabilities = ["resourcelist", "changelist"]
    bitstreams.save()
    with committing():
        seed(6)
    build(bitstreams)
    return bitstreams


@pytest.fixture
def storage_calls(monkeypatch):
    """The calls that ask a storage about its files (size, listing, stat, S3 listing), counted."""
    calls = []

    def counting(cls, name):
        original = getattr(cls, name)

        def counted(self, *args, **kwargs):
            calls.append((cls.__name__, name, args))
            return original(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, counted)

    for name in ("size", "listdir", "exists", "get_modified_time"):
        counting(FileSystemStorage, name)
    for name in ("size", "prepare", "_stat", "_list"):
        counting(listing.FileSizes, name)
    return calls


def sizes_in_storage():
    return {f.pk: f.file.storage.size(f.file.name) for f in ItemFile.objects.all()}


def updated_events(resource_set):
    return list(ChangeEvent.objects.filter(resource_set=resource_set, change="updated").values_list("object_pk", flat=True))


def test_seeding_records_each_files_size(seed):
    seed(4, file_size=100)
    files = list(ItemFile.objects.all())
    assert len(files) > 4  # every third item has a second file
    assert {f.size for f in files} == {100}
    assert {f.pk: f.size for f in files} == sizes_in_storage()


def test_a_reconcile_with_sizes_recorded_asks_the_storage_nothing(tracked, committing, storage_calls):
    source = tracked.get_source()
    queryset = source.queryset(tracked.lookups)
    assert reconciling._compared_in_database(tracked, source, queryset)
    assert source.fingerprint_expression(queryset.db)[1] == [], "no file's size comes from the storage"
    assert None not in set(ItemFile.objects.values_list("size", flat=True))
    built = []

    def count(sender, instance, **kwargs):
        built.append(instance.pk)

    post_init.connect(count, sender=ItemFile)
    try:
        with committing():
            counts = tracking.reconcile(tracked)
    finally:
        post_init.disconnect(count, sender=ItemFile)
    assert storage_calls == []
    assert built == []
    assert counts.unchanged == ItemFile.objects.count()
    assert counts.created == counts.updated == counts.deleted == 0


def test_a_file_changed_through_the_model_is_found_by_reconcile(tracked, committing):
    f = ItemFile.objects.order_by("pk").first()
    data = b"new bytes, of another length than the seeded ones\n"
    assert f.size != len(data)
    with tracking.paused():  # as a change nothing was told of: only the reconcile finds it
        f.file.save("replacement.txt", ContentFile(data))
    f.refresh_from_db()
    assert f.size == len(data) == f.file.storage.size(f.file.name)
    with committing():
        counts = tracking.reconcile(tracked)
    assert counts.updated == 1 and counts.unchanged == ItemFile.objects.count() - 1
    assert updated_events(tracked) == [str(f.pk)]
    assert Resource.objects.get(resource_set=tracked, object_pk=str(f.pk)).length == len(data)
    with committing():
        assert tracking.reconcile(tracked).updated == 0, "found once"


def test_the_recorded_size_stands_for_the_bytes(tracked, committing):
    """Bytes replaced in place (same name, the row's other fields untouched), their size then
    recorded (as the source's comment asks of whoever writes files that way): found, from the
    size alone."""
    f = ItemFile.objects.order_by("pk").first()
    data = b"rewritten in place\n"
    with open(f.file.path, "wb") as out:
        out.write(data)
    with tracking.paused():
        ItemFile.objects.filter(pk=f.pk).update(size=len(data))  # no signal, "modified" unchanged
    with committing():
        counts = tracking.reconcile(tracked)
    assert counts.updated == 1
    assert updated_events(tracked) == [str(f.pk)]
    assert Resource.objects.get(resource_set=tracked, object_pk=str(f.pk)).length == len(data)


def test_save_records_the_size_of_the_file_it_is_given(seed, committing):
    seed(1)
    item = ItemFile.objects.get(name="item-1.txt").item
    with tracking.paused():
        # A new upload: its size is known before it is stored.
        upload = ItemFile(item=item, name="upload.txt", media_type="text/plain")
        upload.file = ContentFile(b"twelve bytes", name="upload.txt")
        upload.save()
        assert ItemFile.objects.get(pk=upload.pk).size == 12
        # Bytes replaced in place, then any save of the row (even of another field alone).
        with open(upload.file.path, "wb") as out:
            out.write(b"five!")
        upload.media_type = "text/csv"
        upload.save(update_fields=["media_type"])
        assert ItemFile.objects.get(pk=upload.pk).size == 5
        # A file missing from the storage: no size.
        os.remove(upload.file.path)
        upload.save()
        assert ItemFile.objects.get(pk=upload.pk).size is None
        # No file at all: no size either.
        empty = ItemFile.objects.create(item=item, name="empty.txt", file="")
        assert ItemFile.objects.get(pk=empty.pk).size is None


def test_a_row_without_a_size_has_another_fingerprint(tracked):
    source = tracked.get_source()
    f = ItemFile.objects.order_by("pk").first()
    before = source.fingerprint(f)
    with tracking.paused():
        ItemFile.objects.filter(pk=f.pk).update(size=None)
    assert source.fingerprint(f) not in (before, None)


def test_the_migration_fills_the_sizes_of_the_files_there_are(seed, monkeypatch):
    seed(5)
    sizes = sizes_in_storage()
    missing = ItemFile.objects.order_by("pk").last()
    os.remove(missing.file.path)
    modified = dict(ItemFile.objects.values_list("pk", "modified"))
    ItemFile.objects.update(size=None)
    monkeypatch.setattr(migration, "BATCH", 2)  # several batches
    migration.fill_sizes(apps, types.SimpleNamespace(connection=connection))
    filled = dict(ItemFile.objects.values_list("pk", "size"))
    assert filled == {**sizes, missing.pk: None}
    assert dict(ItemFile.objects.values_list("pk", "modified")) == modified, "no row's lastmod changed"
    # Run again: nothing to fill but the missing file, still missing.
    migration.fill_sizes(apps, types.SimpleNamespace(connection=connection))
    assert dict(ItemFile.objects.values_list("pk", "size")) == filled
