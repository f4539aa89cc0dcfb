import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_resourcesync.models import Build, ResourceSet
from django_resourcesync.progress import ProgressBar

from .conftest import demo_set

pytestmark = pytest.mark.django_db


def test_rebuild_prints_progress_and_a_summary(seed, bitstreams, metadata, pages, capsys):
    demo_set("all-records")  # as migrated (an earlier test's flush may have taken it)
    seed(5)  # 6 files and 5 items: their records (public and partners') and landing pages
    call_command("resourcesync_rebuild", verbosity=2)
    captured = capsys.readouterr()
    assert "Built 4 capability document(s) for 4 set(s): 21 entries in 4 file(s)" in captured.out
    assert "reconcile" in captured.err and "resourcelist" in captured.err
    assert Build.objects.filter(status=Build.Status.PUBLISHED).count() == 4


def test_rebuild_one_set_with_small_batches(seed, bitstreams, metadata, capsys):
    seed(5)
    call_command("resourcesync_rebuild", "--set", "metadata", "--batch-size", "2", "--only", "resourcelist", verbosity=0)
    assert Build.objects.get().resource_set == metadata
    assert metadata.resources.count() == 5


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "nosuchset"], "No resource set with slug: nosuchset"),
        (["--only", "changelog"], "Unknown capability in --only: changelog"),
        (["--batch-size", "0"], "--batch-size must be positive"),
        (["--only", ""], "--only names no capability. Known: resourcelist, "),
        (["--only", ","], "--only names no capability"),
        (["--only", " "], "--only names no capability"),
    ],
)
def test_rebuild_refuses_bad_arguments(bitstreams, args, message):
    with pytest.raises(CommandError, match=message):
        call_command("resourcesync_rebuild", *args, verbosity=0)


def test_rebuild_refuses_a_disabled_set(metadata):
    ResourceSet.objects.filter(pk=metadata.pk).update(enabled=False)
    with pytest.raises(CommandError, match="Disabled resource set"):
        call_command("resourcesync_rebuild", "--set", "metadata", verbosity=0)


def test_rebuild_all_task_goes_on_after_a_failing_set(seed, bitstreams, metadata, pages):
    from django_resourcesync.tasks import rebuild_all_task

    demo_set("all-records")  # as migrated (an earlier test's flush may have taken it)
    seed(2)
    ResourceSet.objects.create(name="Ghost", slug="ghost", source="nosuchsource", position=0)
    summary = rebuild_all_task.delay().get()
    assert [(s["set"], s["status"]) for s in summary] == [
        ("ghost", "failed"), ("bitstreams", "published"), ("metadata", "published"), ("pages", "published"),
        ("all-records", "published"),
    ]


def test_seed_repository_adds_items_deterministically(db, capsys):
    from example_project.repository.management.commands.seed_repository import files_for
    from example_project.repository.models import Item, ItemFile

    call_command("seed_repository", items=4, file_size=100, verbosity=0)
    call_command("seed_repository", items=2, file_size=100, verbosity=0)
    assert Item.objects.count() == 6 and Item.objects.filter(is_public=True).count() == 6
    files = ItemFile.objects.order_by("pk")
    assert files.count() == 8
    first = files[0]
    assert first.name == "item-1.txt" and first.file.open("rb").read() == (b"Full text of item 1.\n" * 5)[:100]
    assert [f.name for f in files if not f.name.isascii()] == ["données brutes 3.csv", "données brutes 6.csv"]
    # Rows inserted as values: each file is its own item's, with the size of its bytes and the
    # times a save would give it.
    for item in Item.objects.order_by("pk"):
        number = int(item.title.split(":")[0].removeprefix("Item "))
        assert [f.name for f in item.files.order_by("pk")] == [name for name, _type, _data in files_for(number, 100)]
        assert item.created and item.modified
    for f in files:
        assert f.size == 100 == len(f.file.open("rb").read()) and f.file.name.startswith(f"items/{f.item_id}/")
        assert f.created and f.modified and f.media_type in ("text/plain", "text/csv")


def test_seeding_writes_files_on_threads_in_order_and_keeps_what_is_there(tmp_path):
    from django.core.files.storage import FileSystemStorage

    from example_project.repository.management.commands.seed_repository import write_files

    storage = FileSystemStorage(location=tmp_path)
    (tmp_path / "items" / "7").mkdir(parents=True)
    (tmp_path / "items" / "7" / "item-7.txt").write_bytes(b"left by an earlier item")
    files = [(f"items/{n}/item-{n}.txt", f"bytes of {n}".encode()) for n in range(1, 41)]
    names = write_files(storage, files)
    # In order, each under its own name but the one already taken, which the storage renames.
    assert names[:6] + names[7:] == [name for name, _data in files[:6] + files[7:]]
    assert names[6] != "items/7/item-7.txt" and names[6].startswith("items/7/item-7")
    for name, (_asked, data) in zip(names, files):
        assert storage.open(name).read() == data
    assert (tmp_path / "items" / "7" / "item-7.txt").read_bytes() == b"left by an earlier item"


def test_rebuild_only_dumps_shows_bytes_and_files(seed, bitstreams, capsys):
    bitstreams.capabilities = ["resourcelist", "changelist", "resourcedump", "changedump"]
    bitstreams.save()
    seed(3, file_size=1000)
    call_command("resourcesync_rebuild", "--only", "resourcedump,changedump", "--set", "bitstreams", verbosity=1)
    captured = capsys.readouterr()
    assert "resourcedump" in captured.err and "MB" in captured.err and "4 files" in captured.err
    assert [b.capability for b in Build.objects.filter(status=Build.Status.PUBLISHED)] == ["resourcedump"]


def test_a_set_whose_filter_breaks_is_recorded_as_failed(seed, bitstreams, capsys):
    seed(1)
    broken = ResourceSet.objects.create(name="Broken", slug="broken", source="metadata", lookups={"nosuchfield": 1})
    with pytest.raises(CommandError, match="broken"):
        call_command("resourcesync_rebuild", verbosity=0)
    failed = Build.objects.get(resource_set=broken)
    assert failed.status == Build.Status.FAILED and "nosuchfield" in failed.error
    with pytest.raises(CommandError, match="failed to reconcile: broken"):
        call_command("resourcesync_reconcile", verbosity=0)
    assert "bitstreams:" in capsys.readouterr().out, "the other sets are reconciled"


def test_one_build_of_a_set_at_a_time_and_dead_locks_expire(seed, metadata, capsys):
    import datetime

    from django.utils import timezone

    from django_resourcesync.builders import BuildInProgress, build_lock
    from django_resourcesync.models import BuildLock
    from django_resourcesync.rebuild import rebuild_set

    seed(1)
    with build_lock(metadata, "resourcelist"):
        with pytest.raises(BuildInProgress):
            rebuild_set(metadata)
        with pytest.raises(CommandError):
            call_command("resourcesync_rebuild", "--set", "metadata", verbosity=0)
        assert "already running" in capsys.readouterr().err
    assert not BuildLock.objects.exists(), "released"
    # A holder that died leaves a lock that expires, and is then taken over.
    BuildLock.objects.create(
        resource_set=metadata, capability="resourcelist", holder="dead", expires=timezone.now() - datetime.timedelta(seconds=1)
    )
    (build,) = rebuild_set(metadata, only=["resourcelist"])
    assert build.status == Build.Status.PUBLISHED and not BuildLock.objects.exists()


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("stream", [io.StringIO, Terminal], ids=["no-terminal", "terminal"])
def test_the_progress_bar_shows_a_phases_last_line_once_then_a_newline(stream):
    out = stream()
    bar = ProgressBar(out, interval=0)
    bar("resourcelist", 5, 10)
    bar("resourcelist", 10, 10)
    bar("resourcelist", 10, 10)  # told again (a build's last part, then the build)
    bar.end()
    bar.end()
    shown = out.getvalue()
    assert shown.count("10/10") == 1 and shown.endswith("10/10\n"), repr(shown)
    if stream is io.StringIO:  # a log file or a pipe: whole lines, nothing drawn in place
        assert "\r" not in shown and shown.splitlines()[-1].startswith("resourcelist   [#####")


def test_rebuild_without_a_terminal_writes_each_phase_once_on_a_line_of_its_own(seed, bitstreams, metadata):
    seed(5)
    out, err = io.StringIO(), io.StringIO()
    call_command("resourcesync_rebuild", "--set", "metadata", stdout=out, stderr=err)
    lines = err.getvalue().split("\n")
    assert "\r" not in err.getvalue() and lines[-1] == "", repr(err.getvalue())
    assert [line.split()[0] for line in lines[:-1]] == ["reconcile", "resourcelist"], lines
