"""Nothing lost, nothing leaked: one bad object, private bytes in dumps, failed writes."""

import io
import logging
import zipfile

import pytest
from django.core.files.base import ContentFile
from django.core.management import call_command
from django.db import transaction

from django_resourcesync import tracking
from django_resourcesync.builders.changedump import package_changes
from django_resourcesync.models import Build, ChangeDumpPackage, Document, LeftOut, PendingChange
from django_resourcesync.rebuild import rebuild_set
from example_project.repository.models import Item, ItemFile

from .helpers import fetch, path_of
from .xmlcheck import SM, check_document, entries, md

pytestmark = pytest.mark.django_db

DUMPS = ["resourcelist", "changelist", "resourcedump", "changedump"]


@pytest.fixture
def tracked(seed, bitstreams, metadata, committing):
    for resource_set in (bitstreams, metadata):
        resource_set.capabilities = DUMPS
        resource_set.save()
    with committing():
        seed(6)
    rebuild_set(bitstreams)
    rebuild_set(metadata)
    return bitstreams, metadata


def changes(resource_set):
    status, body, _ = fetch(f"/resourcesync/{resource_set.slug}/changelist.xml")
    assert status == 200
    return [(md(e)["change"], e.find(f"{{{SM}}}loc").text) for e in entries(check_document(body, "changelist"))]


def listed(resource_set, capability):
    """The locs of a dump's packages, and each package's member bytes by loc."""
    status, body, _ = fetch(f"/resourcesync/{resource_set.slug}/{capability}.xml")
    if status == 404:
        return {}
    assert status == 200
    found = {}
    for entry in entries(check_document(body, capability)):
        loc = entry.find(f"{{{SM}}}loc").text
        status, package, _ = fetch(path_of(loc))
        assert status == 200, f"{loc} is listed but answers {status}"
        archive = zipfile.ZipFile(io.BytesIO(package))
        manifest = check_document(archive.read("manifest.xml"), f"{capability}-manifest")
        found[loc] = {
            e.find(f"{{{SM}}}loc").text: archive.read(md(e)["path"][1:]) for e in entries(manifest) if "path" in md(e)
        }
    return found


def test_one_bad_object_is_left_out_and_reported_and_the_rest_is_processed(tracked, committing, caplog):
    bitstreams, metadata = tracked
    bad, hidden = Item.objects.order_by("pk")[0], Item.objects.order_by("pk")[1]
    bad_file = bad.files.first()
    hidden_files = [f.get_absolute_url() for f in hidden.files.all()]
    caplog.set_level(logging.ERROR, logger="django_resourcesync")
    with committing(), transaction.atomic():
        # Its URL cannot be made (the URL pattern takes no newline): NoReverseMatch.
        ItemFile.objects.filter(pk=bad_file.pk).update(name="new\nline.txt")
        tracking.changed(model=ItemFile, pks=[bad_file.pk])
        hidden.is_public = False
        hidden.save()
    assert not PendingChange.objects.exists()
    found = changes(bitstreams)
    assert [(c, path_of(loc)) for c, loc in found if path_of(loc) in hidden_files] == [("deleted", u) for u in hidden_files]
    assert ("deleted", "http://testserver" + bad_file.get_absolute_url()) in found, "what cannot be listed is not listed"
    (left_out,) = LeftOut.objects.filter(resource_set=bitstreams)
    assert left_out.object_pk == str(bad_file.pk) and "NoReverseMatch" in left_out.reason
    assert any("left out" in record.getMessage() for record in caplog.records)
    # Every rebuild and reconcile of the set goes on, and the builds report the object.
    call_command("resourcesync_rebuild", "--set", "bitstreams", verbosity=0)
    call_command("resourcesync_reconcile", "--set", "bitstreams", verbosity=0)
    resource_list = Build.objects.filter(resource_set=bitstreams, capability="resourcelist").order_by("-pk").first()
    assert resource_list.status == Build.Status.PUBLISHED
    assert resource_list.report["left_out"] == 1
    assert resource_list.report["left_out_objects"][0]["object"] == str(bad_file.pk)
    # Fixed, it is published again and no longer reported.
    with committing():
        ItemFile.objects.filter(pk=bad_file.pk).update(name="fixed.txt")
        tracking.changed(model=ItemFile, pks=[bad_file.pk])
    assert not LeftOut.objects.exists()
    assert changes(bitstreams)[-1][0] == "created"


def test_pending_changes_stay_until_every_set_has_written_them(tracked, committing, monkeypatch):
    bitstreams, metadata = tracked
    item = Item.objects.order_by("pk")[0]
    from django_resourcesync.tracking import processing

    real = processing._apply

    def failing(resource_set, *args):
        if resource_set.slug == "metadata":
            raise RuntimeError("this set is broken today")
        return real(resource_set, *args)

    monkeypatch.setattr(processing, "_apply", failing)
    with committing():
        item.title = "Renamed while a set is broken"
        item.save()
    assert PendingChange.objects.filter(source="metadata").exists(), "kept for the next run"
    counts = tracking.process_pending()
    assert counts.failed_sets == 1 and PendingChange.objects.exists()
    monkeypatch.setattr(processing, "_apply", real)
    tracking.process_pending()
    assert not PendingChange.objects.exists()
    assert ("updated", "http://testserver" + item.get_metadata_url()) in changes(metadata)


def storage_files(documents_storage):
    return {str(p.relative_to(documents_storage)) for p in documents_storage.rglob("*") if p.is_file()}


def test_a_private_items_bytes_leave_every_dump_within_one_processing_round(tracked, committing, settings, documents_storage):
    bitstreams, metadata = tracked
    hidden = Item.objects.order_by("pk")[2]
    hidden_file = hidden.files.first()
    hidden_uri = "http://testserver" + hidden_file.get_absolute_url()
    with committing():
        hidden_file.file.save("v2.txt", ContentFile(b"secret once public"), save=True)
    package_changes(bitstreams)
    rebuild_set(bitstreams)  # a second Resource Dump: the first is retired (KEEP_BUILDS = 1)
    assert Build.objects.filter(resource_set=bitstreams, capability="resourcedump", status=Build.Status.RETIRED).exists()
    held = [loc for loc, members in listed(bitstreams, "resourcedump").items() if hidden_uri in members]
    held_changes = [loc for loc, members in listed(bitstreams, "changedump").items() if hidden_uri in members]
    assert held and held_changes
    retired_packages = list(
        Document.objects.filter(build__status=Build.Status.RETIRED, build__resource_set=bitstreams, name__endswith=".zip")
        .values_list("name", flat=True)
    )
    assert retired_packages
    with committing():
        hidden.is_public = False
        hidden.save()
    # One processing round later nothing serves those bytes: the packages answer 410 Gone, the
    # dumps are valid and list only what is still served, the files are gone from storage.
    for loc in held + held_changes:
        assert fetch(path_of(loc))[0] == 410
    for name in retired_packages:
        assert fetch(f"/resourcesync/bitstreams/{name}")[0] in (404, 410)
    for capability in ("resourcedump", "changedump"):
        assert all(hidden_uri not in members for members in listed(bitstreams, capability).values())

    stored = storage_files(documents_storage)
    for document in Document.objects.filter(withdrawn__isnull=False):
        assert document.storage_name not in stored
    for package in ChangeDumpPackage.objects.filter(withdrawn__isnull=False):
        assert package.storage_name not in stored and package.manifest_storage_name not in stored
    # The next rebuild packs the withdrawn Change Dump package again, without the private bytes.
    rebuild_set(bitstreams)
    assert not ChangeDumpPackage.objects.filter(withdrawn__isnull=False).exists()
    change_packages = listed(bitstreams, "changedump")
    assert len(change_packages) == ChangeDumpPackage.objects.filter(resource_set=bitstreams).count()
    assert all(hidden_uri not in members for members in change_packages.values())


def test_a_dump_being_built_leaves_out_what_left_the_set_meanwhile(tracked, committing, monkeypatch):
    from django_resourcesync.builders import resourcedump

    bitstreams, _metadata = tracked
    hidden = Item.objects.order_by("pk")[3]
    hidden_uri = "http://testserver" + hidden.files.first().get_absolute_url()
    real = resourcedump.finish

    def finish_after_a_change(context, done):
        with committing():  # made private after its bytes were packed, before publication
            Item.objects.filter(pk=hidden.pk).update(is_public=False)
            tracking.changed(model=Item, pks=[hidden.pk])
        return real(context, done)

    monkeypatch.setattr(resourcedump, "finish", finish_after_a_change)
    rebuild_set(bitstreams, only=["resourcedump"])
    build = Build.objects.filter(resource_set=bitstreams, capability="resourcedump").order_by("-pk").first()
    assert build.status == Build.Status.PUBLISHED and build.report["withdrawn_packages"] >= 1
    assert all(hidden_uri not in members for members in listed(bitstreams, "resourcedump").values())


def test_the_source_description_date_never_goes_back_when_a_set_is_deleted(tracked, monkeypatch):
    import datetime

    from django.utils import timezone
    from django.utils.http import parse_http_date

    bitstreams, metadata = tracked
    metadata.save()  # the newest configuration: the Source Description's date is its date
    later = timezone.now() + datetime.timedelta(seconds=2)
    monkeypatch.setattr(timezone, "now", lambda: later)
    before = parse_http_date(fetch("/.well-known/resourcesync")[2]["Last-Modified"])
    metadata.delete()
    monkeypatch.setattr(timezone, "now", lambda: later + datetime.timedelta(seconds=2))
    status, body, response = fetch("/.well-known/resourcesync")
    assert status == 200 and b"/resourcesync/metadata/" not in body
    assert parse_http_date(response["Last-Modified"]) > before, "a client's If-Modified-Since must see the deletion"
    assert fetch("/.well-known/resourcesync", **{"If-Modified-Since": response["Last-Modified"]})[0] == 304


def test_a_package_thrown_away_on_a_full_disk_leaves_no_file(bitstreams, documents_storage):
    import errno

    from django_resourcesync import storage
    from django_resourcesync.packaging import PackageWriter

    writer = PackageWriter(storage.storage_name("bitstreams", "1", "part.zip"))
    writer.add("resources/a", [b"x" * 100_000])
    assert storage_files(documents_storage)

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    real_close = writer._raw.close
    writer._zip.close = full
    writer._raw.close = full
    writer.abort()
    assert not storage_files(documents_storage)
    writer._zip.close = lambda: None  # (what the garbage collector calls, and the descriptor)
    real_close()


def test_a_document_write_that_fails_leaves_no_file(bitstreams, seed, documents_storage, monkeypatch):
    import errno

    from django.core.files.storage import FileSystemStorage

    seed(2)
    real = FileSystemStorage._save

    def half_then_full(self, name, content):
        real(self, name, ContentFile(b"<?xml half a document"))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(FileSystemStorage, "_save", half_then_full)
    with pytest.raises(OSError):
        rebuild_set(bitstreams, only=["resourcelist"])
    assert not storage_files(documents_storage), "nothing half-written stays"
    assert Build.objects.get(resource_set=bitstreams).status == Build.Status.FAILED



@pytest.mark.parametrize("permissions", [None, 0o640])
def test_a_document_is_moved_into_the_filesystem_storage_with_the_storages_file_mode(
    bitstreams, seed, documents_storage, settings, monkeypatch, permissions
):
    """A document is written once, beside the storage's files, and moved into place (no second
    copy); it gets the mode any file the storage saves gets, not a temporary file's 0600, and
    nothing stays behind it. A scratch file a killed process left is swept like any orphan."""
    import os
    import time

    from django_resourcesync import storage, sweep

    settings.FILE_UPLOAD_PERMISSIONS = permissions
    seed(2)
    renamed = []
    rename = os.rename
    monkeypatch.setattr(os, "rename", lambda source, target: renamed.append((source, target)) or rename(source, target))
    rebuild_set(bitstreams, only=["resourcelist", "changelist"])
    published = Document.objects.get(resource_set=bitstreams, name="resourcelist.xml")
    path = documents_storage / published.storage_name
    scratch = documents_storage / storage.storage_name(storage.SCRATCH)
    assert [target for source, target in renamed if source.startswith(str(scratch))] == [str(path)]
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == (0o666 & ~umask if permissions is None else permissions)
    assert path.read_bytes().startswith(b"<?xml") and not list(scratch.iterdir())
    left = scratch / "left-by-a-killed-build"
    left.write_bytes(b"<?xml half a document")
    old = time.time() - 7200
    os.utime(left, (old, old))
    assert sweep.sweep().deleted == 1 and not left.exists()

def test_the_sweep_removes_what_no_record_refers_to(tracked, documents_storage):
    import os
    import time

    from django.utils import timezone

    from django_resourcesync import sweep
    from django_resourcesync.builders import BuildContext, build_lock

    bitstreams, _metadata = tracked
    recorded = storage_files(documents_storage)
    orphan = documents_storage / "documents" / "bitstreams" / "999" / "part-00001.zip"
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"left by a killed build")
    with build_lock(bitstreams, "resourcedump"):
        running = BuildContext(bitstreams, "resourcedump", at=timezone.now())
        in_progress = documents_storage / "documents" / "bitstreams" / str(running.build.pk) / "part-00001.zip"
        in_progress.parent.mkdir(parents=True)
        in_progress.write_bytes(b"being written")
        assert sweep.sweep().deleted == 0, "younger than the grace period"
        old = time.time() - 7200
        for path in (orphan, in_progress):
            os.utime(path, (old, old))
        counts = sweep.sweep()
        assert counts.deleted == 1 and not orphan.exists() and in_progress.exists(), "a running build's files stay"
        assert storage_files(documents_storage) == recorded | {str(in_progress.relative_to(documents_storage))}
    # Its lock gone, the build left running is failed by the next sweep, its files removed.
    assert sweep.sweep().failed_builds == 1
    running.build.refresh_from_db()
    assert running.build.status == Build.Status.FAILED and "no lock" in running.build.error
    sweep.sweep(grace=0)
    assert storage_files(documents_storage) == recorded


def test_a_lock_whose_process_is_gone_is_taken_over_at_once(tracked):
    import datetime
    import subprocess
    import sys

    from django.utils import timezone

    from django_resourcesync.builders import HOST, BuildContext, BuildInProgress, build_lock
    from django_resourcesync.models import BuildLock

    bitstreams, _metadata = tracked
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        BuildLock.objects.create(resource_set=bitstreams, capability="resourcelist", holder="alive", host=HOST, pid=alive.pid,
                                 expires=timezone.now() + datetime.timedelta(seconds=15))
        with pytest.raises(BuildInProgress):
            with build_lock(bitstreams, "resourcelist"):
                pass
    finally:
        alive.kill()
        alive.wait()
    left = BuildContext(bitstreams, "resourcelist", at=timezone.now()).build  # its process was killed
    (published,) = rebuild_set(bitstreams, only=["resourcelist"])  # no waiting for the lock to expire
    assert published.status == Build.Status.PUBLISHED
    left.refresh_from_db()
    assert left.status == Build.Status.FAILED and f"process {alive.pid}" in left.error
    assert not BuildLock.objects.exists()


def test_a_rebuild_delivered_again_goes_past_a_running_build_to_the_one_its_dead_planner_left(tracked):
    """The worker running a rebuild died while it planned the Resource Dump in parts, after it
    had sent the Resource List's parts: delivered again, the rebuild leaves the list to its
    running build, fails the dump's half-planned one (a part of it was never sent) and builds the
    dump again, then says which capability it left."""
    import datetime
    import subprocess
    import sys

    from django.utils import timezone

    from django_resourcesync.builders import HOST, BuildContext, BuildInProgress
    from django_resourcesync.models import BuildLock, BuildPart

    bitstreams, _metadata = tracked
    BuildLock.objects.create(resource_set=bitstreams, capability="resourcelist", holder="the list's parts", pid=None,
                             expires=timezone.now() + datetime.timedelta(hours=1))
    running_list = BuildContext(bitstreams, "resourcelist", at=timezone.now()).build
    killed = subprocess.Popen([sys.executable, "-c", "pass"])
    killed.wait()
    BuildLock.objects.create(resource_set=bitstreams, capability="resourcedump", holder="the killed planner", host=HOST,
                             pid=killed.pid, expires=timezone.now() + datetime.timedelta(seconds=15))
    half_planned = BuildContext(bitstreams, "resourcedump", at=timezone.now()).build
    BuildPart.objects.create(build=half_planned, number=1, after_pk=0, last_pk=1)
    with pytest.raises(BuildInProgress, match="resourcelist"):
        rebuild_set(bitstreams)
    half_planned.refresh_from_db()
    assert half_planned.status == Build.Status.FAILED and f"process {killed.pid}" in half_planned.error
    dump = Build.objects.filter(resource_set=bitstreams, capability="resourcedump").latest("pk")
    assert dump.pk > half_planned.pk and dump.status == Build.Status.PUBLISHED
    running_list.refresh_from_db()
    assert running_list.status == Build.Status.RUNNING, "left to its parts"
    assert list(BuildLock.objects.values_list("holder", flat=True)) == ["the list's parts"]


def test_a_new_base_url_renders_every_entry_again(tracked, settings):
    from django.core.checks import run_checks

    bitstreams, _metadata = tracked
    assert bitstreams.resources.exists()
    bitstreams.refresh_from_db()
    assert bitstreams.base_url == "http://testserver"
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BASE_URL": "https://repository.example.org"}
    warned = [m for m in run_checks(databases=["default"]) if m.id == "resourcesync.W006"]
    assert {m.obj for m in warned} == set(tracked), "the operator is told to rebuild"
    rebuild_set(bitstreams)
    uris = list(bitstreams.resources.values_list("uri", flat=True))
    assert uris and all(uri.startswith("https://repository.example.org/") for uri in uris), "one host in the record"
    status, body, _ = fetch("/resourcesync/bitstreams/resourcelist.xml")
    locs = [e.find(f"{{{SM}}}loc").text for e in entries(check_document(body, "resourcelist"))]
    assert sorted(locs) == sorted(uris)
    found = changes(bitstreams)
    assert sorted(loc for c, loc in found if c == "created") == sorted(uris)
    assert {c for c, loc in found if loc.startswith("http://testserver/")} == {"deleted"}
    assert [m.obj for m in run_checks(databases=["default"]) if m.id == "resourcesync.W006"] == [_metadata]


def test_a_file_missing_on_disk_flags_the_build_with_its_name(sizes_from_the_storage, tracked, caplog):
    # Sizes from the storage: the fingerprint sees the file gone (a size recorded on the row does not).
    import os

    bitstreams, _metadata = tracked
    missing = ItemFile.objects.order_by("pk")[0]
    os.remove(missing.file.path)
    caplog.set_level(logging.ERROR, logger="django_resourcesync")
    builds = {b.capability: b for b in rebuild_set(bitstreams)}
    for capability in ("resourcelist", "resourcedump"):
        report = builds[capability].report
        assert builds[capability].status == Build.Status.PUBLISHED and report["left_out"] == 1, report
        (entry,) = report["left_out_objects"]
        assert entry["object"] == str(missing.pk) and missing.file.name in entry["reason"]
    assert any(missing.file.name in record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR)


def test_a_left_out_object_deleted_behind_the_signals_is_no_longer_reported(tracked, committing):
    bitstreams, _metadata = tracked
    bad = ItemFile.objects.order_by("pk")[0]
    with committing():
        ItemFile.objects.filter(pk=bad.pk).update(name="new\nline.txt")
        tracking.changed(model=ItemFile, pks=[bad.pk])
    left_out = LeftOut.objects.filter(resource_set=bitstreams, object_pk=str(bad.pk))
    assert left_out.exists()
    ItemFile.objects.filter(pk=bad.pk).delete()
    PendingChange.objects.all().delete()  # as if deleted by raw SQL: no pending change says so
    tracking.reconcile(bitstreams)
    assert not left_out.exists()


def test_the_change_dump_date_moves_when_an_earlier_package_is_withdrawn(tracked, committing):
    from django_resourcesync.builders import changedump

    bitstreams, _metadata = tracked
    for n in range(2):
        with committing():
            first = ItemFile.objects.order_by("pk")[n]
            first.file.save(f"v{n}.txt", ContentFile(b"changed %d" % n), save=True)
        package_changes(bitstreams)
    older, newer = ChangeDumpPackage.objects.filter(resource_set=bitstreams).order_by("number")
    assert changedump.render(bitstreams)[1] == newer.written
    changedump.withdraw_packages(ChangeDumpPackage.objects.filter(pk=older.pk))
    older.refresh_from_db()
    assert older.withdrawn > newer.written and changedump.render(bitstreams)[1] == older.withdrawn


def test_a_withdrawal_keeps_the_dump_document_on_a_storage_that_overwrites(tracked, committing, settings):
    bitstreams, _metadata = tracked
    settings.STORAGES = {**settings.STORAGES, "resourcesync": {**settings.STORAGES["resourcesync"]}}
    settings.STORAGES["resourcesync"]["OPTIONS"] = {**settings.STORAGES["resourcesync"]["OPTIONS"], "allow_overwrite": True}
    hidden = Item.objects.order_by("pk")[1]
    with committing():
        hidden.is_public = False
        hidden.save()
    status, body, _ = fetch("/resourcesync/bitstreams/resourcedump.xml")
    assert status == 200 and check_document(body, "resourcedump") is not None


def test_a_storage_failure_while_the_dump_is_rewritten_does_not_undo_the_withdrawal(
    tracked, committing, monkeypatch, documents_storage
):
    from django_resourcesync.builders import resourcedump

    bitstreams, _metadata = tracked
    hidden = Item.objects.order_by("pk")[1]
    hidden_uri = "http://testserver" + hidden.files.first().get_absolute_url()
    (held,) = [loc for loc, members in listed(bitstreams, "resourcedump").items() if hidden_uri in members]

    def full(build):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(resourcedump, "rewrite_dump", full)
    before = storage_files(documents_storage)
    with committing():
        hidden.is_public = False
        hidden.save()
    assert fetch(path_of(held))[0] in (404, 410), "withdrawn with the change, whatever the storage does"
    assert ("deleted", hidden_uri) in changes(bitstreams)
    # No dump rather than one that leaves out what the Resource List lists: none is offered
    # until the next rebuild, and nothing written for the failed attempt stays in storage.
    assert b"resourcedump.xml" not in fetch("/resourcesync/bitstreams/capabilitylist.xml")[1]
    recorded = set(Document.objects.values_list("storage_name", flat=True))
    assert storage_files(documents_storage) - before - recorded == set()
    monkeypatch.undo()
    rebuild_set(bitstreams)
    assert all(hidden_uri not in members for members in listed(bitstreams, "resourcedump").values())


def test_change_dump_packages_go_with_the_change_events_they_hold(tracked, committing, settings, monkeypatch):
    """A package cut after midnight holds changes of the list that closed at midnight: when that
    list passes retention, the package goes too (else nothing could find it to withdraw it)."""
    import datetime

    from django.utils import timezone

    from django_resourcesync.tracking.changelog import close_due, period_end

    bitstreams, _metadata = tracked
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "CHANGELIST_PERIOD": 60, "CHANGELIST_RETENTION": 600}
    files = ItemFile.objects.order_by("pk")
    with committing():
        files[0].file.save("v2.txt", ContentFile(b"before the boundary"), save=True)
    boundary = period_end(timezone.now())
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + (boundary - real_now()) + datetime.timedelta(seconds=30))
    with committing():
        files[1].file.save("v2.txt", ContentFile(b"after the boundary"), save=True)
    package = package_changes(bitstreams)
    assert package.until > boundary + datetime.timedelta(seconds=1)
    close_due(bitstreams, now=boundary + datetime.timedelta(seconds=601))  # the first list is past retention
    assert not bitstreams.changelists.filter(until=boundary).exists()
    assert not ChangeDumpPackage.objects.filter(pk=package.pk).exists(), "no package outlives the events that find it"


def test_a_broken_disabled_set_holds_up_no_pending_change(tracked, committing):
    from django_resourcesync.models import ResourceSet

    bitstreams, metadata = tracked
    ResourceSet.objects.create(name="Broken", slug="broken", source="metadata", lookups={"no_such_field": 1}, enabled=False)
    with committing():
        item = Item.objects.order_by("pk")[0]
        item.title = "Renamed"
        item.save()
    assert not PendingChange.objects.exists()
    assert ("updated", "http://testserver" + item.get_metadata_url()) in changes(metadata)


def test_a_batch_whose_every_object_fails_fails_whole(tracked, monkeypatch):
    from django_resourcesync.tracking import writer

    bitstreams, _metadata = tracked
    monkeypatch.setattr(writer, "SYSTEMIC_FAILURE", 3)
    before = set(bitstreams.resources.values_list("uri", flat=True))

    def storage_down(*args, **kwargs):
        raise OSError("the storage is down")

    monkeypatch.setattr(writer, "entry_values", storage_down)
    from django_resourcesync.models import Resource

    Resource.objects.filter(resource_set=bitstreams).update(fingerprint="")  # every object is described again
    with pytest.raises(writer.SourceUnavailable):
        tracking.reconcile(bitstreams)
    assert set(bitstreams.resources.values_list("uri", flat=True)) == before, "nothing taken out of the set"
    assert not LeftOut.objects.exists()
