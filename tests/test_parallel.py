"""Parallel builds: a Resource List and a Resource Dump planned as parts that Celery tasks render,
in process (eager mode) and on real worker processes fed by Redis, one of them killed in the
middle of a part."""

import contextlib
import datetime
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from django_resourcesync import packaging
from django_resourcesync.builders import BuildInProgress, build_lock, parts, resourcedump, resourcelist
from django_resourcesync.builders.resourcedump import build_resourcedump
from django_resourcesync.builders.resourcelist import build_resourcelist
from django_resourcesync.models import Build, BuildLock, BuildPart, Document, Resource
from django_resourcesync.rebuild import rebuild_set
from django_resourcesync.tasks import build_part_task, finish_build_task

from .conftest import demo_set
from .helpers import build, fetch, path_of, resource_list_entries
from .test_dumps import unpack
from .xmlcheck import SM, check_document, entries, link

ROOT = Path(__file__).resolve().parents[1]
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def listed(resource_set):
    """The set's Resource List as served: ``[<url> element text]``, in document order."""
    from lxml import etree

    return [etree.tostring(entry) for entry in resource_list_entries(resource_set)]


def parallel_build(resource_set):
    with build_lock(resource_set, "resourcelist") as lock:
        started = build_resourcelist(resource_set, parallel=True, lock=lock)
    return Build.objects.get(pk=started.pk)


def check_index(resource_set, max_entries):
    """Validate the served index and every part it lists; returns the part URIs."""
    status, body, _ = fetch(f"/resourcesync/{resource_set.slug}/resourcelist.xml")
    assert status == 200
    index = check_document(body, "resourcelist")
    assert index.tag == f"{{{SM}}}sitemapindex"
    uris = [sitemap.find(f"{{{SM}}}loc").text for sitemap in entries(index)]
    for uri in uris:
        status, body, _ = fetch(path_of(uri))
        assert status == 200, uri
        part = check_document(body, "resourcelist", max_entries=max_entries)
        assert link(part, "index") == f"http://testserver/resourcesync/{resource_set.slug}/resourcelist.xml"
    return uris


@pytest.mark.django_db
@pytest.mark.parametrize("limits", [{"MAX_ENTRIES_PER_DOCUMENT": 4}, {"MAX_DOCUMENT_BYTES": 4_000}])
def test_a_parallel_build_publishes_the_entries_of_the_build_in_one_process(settings, seed, bitstreams, limits):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, **limits}
    seed(12)
    sequential = build(bitstreams)
    expected = listed(bitstreams)
    assert len(expected) == bitstreams.resources.count() == 16

    built = parallel_build(bitstreams)
    assert built.status == Build.Status.PUBLISHED and built.entries == 16
    assert Build.objects.get(pk=sequential.pk).status == Build.Status.RETIRED
    uris = check_index(bitstreams, limits.get("MAX_ENTRIES_PER_DOCUMENT", 50_000))
    assert all(f"/resourcelist/{built.pk}/part-" in uri for uri in uris)
    assert listed(bitstreams) == expected
    planned = list(built.parts.all())
    assert len(planned) == (4 if "MAX_ENTRIES_PER_DOCUMENT" in limits else 1)
    assert all(part.done and part.attempts == 1 for part in planned)
    assert sum(part.entries for part in planned) == 16
    assert len(uris) == sum(part.documents for part in planned) == built.documents - 1
    assert not BuildLock.objects.exists(), "released by the final step"


@pytest.mark.django_db
def test_the_build_lock_is_held_by_every_part_and_the_final_step(settings, seed, metadata, monkeypatch):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 2}
    seed(6)
    seen = []
    real_render, real_finish = resourcelist.render_part, resourcelist.finish

    def holders():
        seen.append(list(BuildLock.objects.values_list("holder", flat=True)))
        with pytest.raises(BuildInProgress):
            with build_lock(metadata, "resourcelist"):
                pass

    monkeypatch.setattr(resourcelist, "render_part", lambda *a, **k: holders() or real_render(*a, **k))
    monkeypatch.setattr(resourcelist, "finish", lambda *a, **k: holders() or real_finish(*a, **k))
    with build_lock(metadata, "resourcelist") as lock:
        build_resourcelist(metadata, parallel=True, lock=lock)
    assert seen == [[lock.holder]] * 4, "three parts and the final step, all under the starter's lock"
    assert not BuildLock.objects.exists()


@pytest.mark.django_db
def test_a_failing_part_fails_the_build_and_leaves_the_previous_one_live(
    settings, seed, metadata, monkeypatch, documents_storage, django_capture_on_commit_callbacks
):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 3}
    seed(7)
    previous = build(metadata)
    _, served, _ = fetch("/resourcesync/metadata/resourcelist.xml")
    fail_part(monkeypatch, 2)
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(OSError):
        parallel_build(metadata)
    assert_failed_and_removed(metadata, previous, served, documents_storage)  # part 1 was written


def fail_part(monkeypatch, number):
    """Part ``number`` of a Resource List fails, as with its storage out of reach."""
    real = resourcelist.render_part

    def failing(context, part, **kwargs):
        if part.number == number:
            raise OSError("storage unreachable")
        return real(context, part, **kwargs)

    monkeypatch.setattr(resourcelist, "render_part", failing)


def assert_failed_and_removed(resource_set, previous, served, documents_storage):
    """The set's last build failed, nothing of it is recorded or stored, the one before it is
    still served as it was; returns the failed build."""
    failed = Build.objects.filter(resource_set=resource_set).order_by("-pk").first()
    assert failed.pk != previous.pk
    assert failed.status == Build.Status.FAILED and "storage unreachable" in failed.error
    assert not Document.objects.filter(build=failed).exists()
    folder = documents_storage / "documents" / resource_set.slug / str(failed.pk)
    assert not folder.exists() or not any(folder.iterdir()), "what its parts wrote was removed"
    assert Build.objects.get(pk=previous.pk).status == Build.Status.PUBLISHED
    assert fetch(f"/resourcesync/{resource_set.slug}/resourcelist.xml")[1] == served
    assert not BuildLock.objects.exists()
    return failed


@pytest.fixture
def held_parts(monkeypatch):
    """Part tasks are collected instead of sent: ``[(build_id, number, holder, batch_size)]``."""
    sent = []
    monkeypatch.setattr(build_part_task, "delay", lambda *args: sent.append(args))
    return sent


@pytest.mark.django_db
def test_a_part_rendered_again_overwrites_its_file_and_a_done_part_is_not_rendered_again(
    settings, seed, metadata, held_parts, documents_storage
):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 3}
    seed(7)
    started = parallel_build(metadata)
    assert started.status == Build.Status.RUNNING and len(held_parts) == 3
    assert BuildLock.objects.get().holder == held_parts[0][2], "held after the starter returned"
    # An attempt at part 1 that was killed after writing its file, before recording it.
    killed = resourcelist.render_part(parts.BuildContext(build=started), started.parts.get(number=1), batch_size=100)
    assert killed == (1, 3, {}) and not Document.objects.filter(build=started).exists()
    folder = documents_storage / "documents" / "metadata" / str(started.pk)
    assert sorted(path.name for path in folder.iterdir()) == ["part-00001.xml"]
    for args in held_parts:
        build_part_task.apply(args=args).get()
    published = Build.objects.get(pk=started.pk)
    assert published.status == Build.Status.PUBLISHED
    assert sorted(path.name for path in folder.iterdir()) == [
        "part-00001.xml", "part-00002.xml", "part-00003.xml", "resourcelist.xml"
    ]
    check_index(metadata, 3)
    # A copy of a task delivered again after the build was published does nothing.
    assert build_part_task.apply(args=held_parts[0]).get() is False
    assert [part.attempts for part in published.parts.all()] == [1, 1, 1]


@pytest.mark.django_db
def test_a_part_started_too_often_fails_the_build(settings, seed, metadata, held_parts):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 3}
    seed(4)
    started = parallel_build(metadata)
    BuildPart.objects.filter(build=started, number=2).update(attempts=3)  # killed three times
    build_part_task.apply(args=held_parts[0])
    with pytest.raises(parts.PartFailed):
        build_part_task.apply(args=held_parts[1])
    failed = Build.objects.get(pk=started.pk)
    assert failed.status == Build.Status.FAILED and "started 3 times" in failed.error
    assert not Document.objects.filter(build=failed).exists() and not BuildLock.objects.exists()


@pytest.mark.django_db
def test_an_expired_lock_lets_the_next_build_run_and_fails_the_abandoned_one(settings, seed, metadata, held_parts):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 3}
    seed(4)
    abandoned = parallel_build(metadata)
    with pytest.raises(BuildInProgress):
        build(metadata)
    BuildLock.objects.update(expires=timezone.now() - datetime.timedelta(seconds=1))  # its holder died
    held_parts.clear()
    published = build(metadata)  # in process: this one is not parallel
    assert published.status == Build.Status.PUBLISHED
    assert Build.objects.get(pk=abandoned.pk).status == Build.Status.FAILED
    # A part of the abandoned build delivered late renders nothing.
    assert build_part_task.apply(args=(abandoned.pk, 1, "the dead holder", None)).get() is False
    assert not Document.objects.filter(build=abandoned).exists()


@pytest.mark.django_db
def test_the_planner_holds_the_lock_as_its_own_until_the_plan_is_whole(settings, seed, metadata, monkeypatch):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 2}
    seed(6)
    pids = []  # the lock's process id as each part is sent
    monkeypatch.setattr(build_part_task, "delay", lambda *args: pids.append(BuildLock.objects.get().pid))
    started = parallel_build(metadata)
    # While parts are sent, a planner killed half-way is seen dead by its process id at once...
    assert pids == [os.getpid()] * 3
    # ...and once the plan is whole, the lock is the tasks' (no process), until the build is over.
    assert BuildLock.objects.get().pid is None
    assert Build.objects.get(pk=started.pk).parts_planned == 3


@pytest.mark.django_db
def test_a_lock_kept_for_a_build_that_is_over_does_not_block_the_next_one(settings, seed, metadata, held_parts):
    """The last task of a build died between publishing it and releasing the lock."""
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 3}
    seed(4)
    started = parallel_build(metadata)
    holder = held_parts[0][2]
    for args in list(held_parts):
        build_part_task.apply(args=args)
    assert Build.objects.get(pk=started.pk).status == Build.Status.PUBLISHED
    BuildLock.objects.create(
        resource_set=metadata, capability="resourcelist", holder=holder, pid=None,
        expires=timezone.now() + datetime.timedelta(hours=1),
    )
    # The redelivered final step finds the build published and lets its lock go...
    assert finish_build_task.apply(args=(started.pk, holder)).get() is None
    assert not BuildLock.objects.exists()
    # ...and, were it never delivered again, the next build takes the lock over at once.
    BuildLock.objects.create(
        resource_set=metadata, capability="resourcelist", holder=holder, pid=None,
        expires=timezone.now() + datetime.timedelta(hours=1),
    )
    held_parts.clear()
    assert build(metadata).status == Build.Status.PUBLISHED


# --- Resource Dumps --------------------------------------------------------------------------

DUMP_REPORT = {"changed_since_hashed": 0, "unreadable": 0, "gone": 0}


def dumping(resource_set):
    resource_set.capabilities = ["resourcelist", "resourcedump"]
    resource_set.save()
    return resource_set


def parallel_dump(resource_set):
    with build_lock(resource_set, "resourcedump") as lock:
        started = build_resourcedump(resource_set, refresh=False, parallel=True, lock=lock)
    return Build.objects.get(pk=started.pk)


def packed(resource_set, limit=None):
    """What the served dump packs, every package and manifest checked (see test_dumps.unpack):
    ``[(package file name, [(loc, manifest md, bytes)])]``; each package's bitstreams are at
    most ``limit`` bytes, a single file excepted."""
    dump, packages = unpack(resource_set, "resourcedump")
    found = []
    for entry, (_manifest, _meta, listed) in zip(entries(dump), packages):
        members = [(uri, md, data) for uri, versions in listed.items() for md, data in versions]
        if limit is not None and len(members) > 1:
            assert sum(len(data) for _uri, _md, data in members) <= limit
        found.append((entry.find(f"{{{SM}}}loc").text.rsplit("/", 1)[1], members))
    return found


@pytest.mark.django_db
def test_a_parallel_dump_packs_what_the_dump_in_one_process_packs(settings, seed, bitstreams):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "DUMP_PACKAGE_BYTES": 5000}
    dumping(bitstreams)
    seed(6, file_size=2048)  # 8 files of 2048 bytes: two to a package
    in_process = build_resourcedump(bitstreams)
    expected = packed(bitstreams, 5000)
    assert [name for name, _members in expected] == [f"part-{n:05d}.zip" for n in range(1, 5)]
    assert [(p.number, p.attempts, p.entries) for p in in_process.parts.all()] == [(n, 0, 2) for n in range(1, 5)]

    built = parallel_dump(bitstreams)
    assert built.status == Build.Status.PUBLISHED and built.entries == in_process.entries == 8
    assert Build.objects.get(pk=in_process.pk).status == Build.Status.RETIRED
    assert packed(bitstreams, 5000) == expected, "the same members, paths, hashes and bytes in the same packages"
    assert [(p.number, p.attempts, p.documents, p.entries) for p in built.parts.all()] == [(n, 1, 1, 2) for n in range(1, 5)]
    assert built.report == in_process.report == DUMP_REPORT
    assert built.documents == 4 * 2 + 1
    assert not BuildLock.objects.exists(), "released by the final step"


@pytest.mark.django_db
def test_a_dump_planned_from_wrong_or_unknown_lengths_makes_no_package_too_large(settings, seed, bitstreams):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "DUMP_PACKAGE_BYTES": 5000}
    dumping(bitstreams)
    seed(6, file_size=2048)
    build_resourcedump(bitstreams)
    rows = list(Resource.objects.filter(resource_set=bitstreams).order_by("pk"))
    # Records that say less than the files hold: the plan puts four files in part 1, and the
    # third, recorded as 10 bytes, would take the first package past the limit.
    Resource.objects.filter(pk=rows[2].pk).update(length=10)
    Resource.objects.filter(pk=rows[3].pk).update(length=None)
    in_process = build_resourcedump(bitstreams, refresh=False)
    expected = packed(bitstreams, 5000)
    assert [part.entries for part in in_process.parts.all()] == [4, 2, 2]
    assert [(name, len(members)) for name, members in expected] == [
        ("part-00001.zip", 2), ("part-00001-2.zip", 2), ("part-00002.zip", 2), ("part-00003.zip", 2)]
    assert in_process.report == {**DUMP_REPORT, "changed_since_hashed": 2}

    built = parallel_dump(bitstreams)
    assert built.status == Build.Status.PUBLISHED
    assert packed(bitstreams, 5000) == expected
    assert [(p.documents, p.entries) for p in built.parts.all()] == [(2, 4), (1, 2), (1, 2)]
    assert built.report == in_process.report


@pytest.mark.django_db
def test_a_failing_package_fails_the_dump_and_leaves_the_previous_one_live(
    settings, seed, bitstreams, monkeypatch, documents_storage, django_capture_on_commit_callbacks
):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "DUMP_PACKAGE_BYTES": 5000}
    dumping(bitstreams)
    seed(6, file_size=2048)
    previous = build_resourcedump(bitstreams)
    _, served, _ = fetch("/resourcesync/bitstreams/resourcedump.xml")
    calls = {"n": 0}
    real = packaging.PackageWriter.add

    def failing(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:  # the second file of part 2: in the middle of its package
            raise OSError("connection to storage lost")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(packaging.PackageWriter, "add", failing)
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(OSError):
        parallel_dump(bitstreams)
    failed = Build.objects.filter(resource_set=bitstreams, capability="resourcedump").order_by("-pk").first()
    assert failed.pk != previous.pk
    assert failed.status == Build.Status.FAILED and "connection to storage lost" in failed.error
    assert [part.done is not None for part in failed.parts.all()] == [True, False, False, False]
    assert not Document.objects.filter(build=failed).exists()
    folder = documents_storage / "documents" / "bitstreams" / str(failed.pk)
    assert not folder.exists() or not any(folder.iterdir()), "part 1's package and part 2's half were removed"
    assert Build.objects.get(pk=previous.pk).status == Build.Status.PUBLISHED
    assert fetch("/resourcesync/bitstreams/resourcedump.xml")[1] == served
    monkeypatch.undo()
    assert len(packed(bitstreams)) == 4, "the previous dump, whole"
    assert not BuildLock.objects.exists()


@pytest.mark.django_db
def test_a_package_packed_again_overwrites_its_files(settings, seed, bitstreams, held_parts, documents_storage):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "DUMP_PACKAGE_BYTES": 5000}
    dumping(bitstreams)
    seed(6, file_size=2048)
    build_resourcedump(bitstreams)
    expected = packed(bitstreams)
    started = parallel_dump(bitstreams)
    assert started.status == Build.Status.RUNNING and len(held_parts) == 4
    # An attempt at part 1 that was killed after writing its package, before recording it.
    killed = resourcedump.render_part(parts.BuildContext(build=started), started.parts.get(number=1))
    assert killed == (1, 2, DUMP_REPORT) and not Document.objects.filter(build=started).exists()
    folder = documents_storage / "documents" / "bitstreams" / str(started.pk)
    assert sorted(path.name for path in folder.iterdir()) == ["part-00001-manifest.xml", "part-00001.zip"]
    for args in held_parts:
        build_part_task.apply(args=args).get()
    assert Build.objects.get(pk=started.pk).status == Build.Status.PUBLISHED
    names = [f"part-{n:05d}{suffix}" for n in range(1, 5) for suffix in ("-manifest.xml", ".zip")]
    assert sorted(path.name for path in folder.iterdir()) == sorted([*names, "resourcedump.xml"])
    assert packed(bitstreams) == expected


@pytest.mark.django_db
@pytest.mark.parametrize("lost", ["part-00002-manifest.xml", "part-00003.zip"])
def test_a_dump_whose_package_or_manifest_went_missing_is_not_published(
    settings, seed, bitstreams, held_parts, monkeypatch, documents_storage, lost
):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "DUMP_PACKAGE_BYTES": 5000}
    dumping(bitstreams)
    seed(6, file_size=2048)
    previous = build_resourcedump(bitstreams)
    _, served, _ = fetch("/resourcesync/bitstreams/resourcedump.xml")
    finishing = []
    monkeypatch.setattr(finish_build_task, "delay", lambda *args: finishing.append(args))
    started = parallel_dump(bitstreams)
    for args in held_parts:
        build_part_task.apply(args=args).get()
    (documents_storage / "documents" / "bitstreams" / str(started.pk) / lost).unlink()
    with pytest.raises(parts.PartFailed, match="not in storage"):
        finish_build_task.apply(args=finishing[0]).get()
    assert Build.objects.get(pk=started.pk).status == Build.Status.FAILED
    assert Build.objects.get(pk=previous.pk).status == Build.Status.PUBLISHED
    assert fetch("/resourcesync/bitstreams/resourcedump.xml")[1] == served
    assert not BuildLock.objects.exists()


@pytest.mark.django_db
def test_the_admin_shows_the_progress_of_the_parts(settings, seed, metadata, held_parts, admin_client):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 3}
    seed(7)
    started = parallel_build(metadata)
    build_part_task.apply(args=held_parts[0]).get()
    BuildPart.objects.filter(build=started, number=2).update(attempts=1)  # started, not done
    page = admin_client.get(f"/admin/resourcesync/build/{started.pk}/change/").content.decode()
    assert "1 of 3" in page and "Build parts" in page
    assert 'name="parts-0-attempts"' not in page, "read only"
    listing = admin_client.get("/admin/resourcesync/build/").content.decode()
    assert "1 of 3" in listing
    for args in held_parts[1:]:
        build_part_task.apply(args=args).get()
    assert "3 of 3" in admin_client.get(f"/admin/resourcesync/build/{started.pk}/change/").content.decode()


@pytest.mark.parametrize("value", [0, -1, 2.5, "3", True, None])
def test_part_attempts_must_be_a_positive_integer(settings, value):
    from django_resourcesync.checks import check_settings

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "PART_ATTEMPTS": value}
    assert "resourcesync.E019" in [error.id for error in check_settings()]
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "PART_ATTEMPTS": 1}
    assert "resourcesync.E019" not in [error.id for error in check_settings()]


# --- Real workers --------------------------------------------------------------------------

WORKER_SETTINGS = """
from tests.settings import *  # noqa

RESOURCESYNC = {**RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 20, "DUMP_PACKAGE_BYTES": 5000}
# A task whose worker died goes back to the queue after this many seconds (Redis redelivers
# unacknowledged messages once their visibility timeout is over), checked every second.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 8, "unacked_restore_interval": 1, "unacked_restore_throttle": 1}
"""


def worker_environment(tmp_path, settings_text):
    """The environment of a worker process on the test database, its settings module
    ``settings_text`` (written in ``tmp_path``). Skips the test on SQLite."""
    if connection.vendor != "postgresql":
        pytest.skip("a worker process needs a database server (SQLite takes one writer at a time); run with TEST_DATABASE_URL")
    import redis

    redis.Redis.from_url(REDIS_URL).ping()  # a missing broker is a failure, not a skip
    (tmp_path / "parallel_worker_settings.py").write_text(settings_text)
    db = connection.settings_dict
    return dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="parallel_worker_settings",
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
        TEST_DATABASE_URL=(
            f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        ),
        TEST_CELERY_BROKER_URL=REDIS_URL,
        TEST_FILES_DIR=str(tmp_path),
    )


def start_worker(env, name):
    """A worker process (one task at a time) named ``name``."""
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "example_project", "worker", "--pool=solo", "-n", f"{name}@%h",
         "--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


@pytest.fixture
def workers(transactional_db, tmp_path, settings):
    """Two worker processes (one task at a time each) on the test database; the test's own
    settings match theirs."""
    env = worker_environment(tmp_path, WORKER_SETTINGS)
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 20, "DUMP_PACKAGE_BYTES": 5000}
    settings.MEDIA_ROOT = str(tmp_path / "media")
    processes = {name: start_worker(env, name) for name in ("one", "two")}
    from celery import Celery

    # Not the current app: the tests after this one queue the app's tasks with the project's.
    sender = Celery("sender", broker=REDIS_URL, backend=REDIS_URL, set_as_current=False)
    logs = {}
    try:
        yield sender, processes, logs
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.terminate()
        for name, process in processes.items():
            logs[name] = process.communicate(timeout=60)[0]
            print(f"--- worker {name} ---\n{logs[name][-3000:]}")


def waiting_backends():
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
        return cursor.fetchone()[0]


def wait_for(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


class Held:
    """Holds a lock taken by ``statement`` from another connection until the block ends."""

    statement, params = "", None

    def __enter__(self):
        import psycopg

        db = connection.settings_dict
        self.connection = psycopg.connect(
            host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"], password=db["PASSWORD"], dbname=db["NAME"]
        )
        self.connection.execute(self.statement, self.params)
        return self

    def __exit__(self, *exc_info):
        self.connection.rollback()
        self.connection.close()


class DocumentsHeld(Held):
    """Holds a lock on the Document table: a part can render and write its file, then waits
    before it records it, in the middle of its work."""

    statement = "LOCK TABLE resourcesync_document IN SHARE MODE"


class ResourcesHeld(Held):
    """Holds the given Resource rows: a dump's part that packs one of them, changed since it was
    hashed, waits to hand it to change tracking, in the middle of writing its package."""

    statement = "SELECT id FROM resourcesync_resource WHERE id = ANY(%s) FOR UPDATE"

    def __init__(self, pks):
        self.params = [list(pks)]


@contextlib.contextmanager
def a_part_held_in_each_worker(sender, resource_set):
    """Send a rebuild of the set to the workers and keep them in the middle of a part each:
    its file written, waiting to record it."""
    with DocumentsHeld():
        sender.send_task("resourcesync.rebuild_set", args=[resource_set.pk])
        wait_for(lambda: waiting_backends() == 2, 60, "a part in each worker")
        yield


def served_index_is_whole(resource_set):
    """Every part listed by the served index is there (the build published before, or the new one)."""
    status, body, _ = fetch(f"/resourcesync/{resource_set.slug}/resourcelist.xml")
    assert status == 200
    for sitemap in entries(check_document(body, "resourcelist")):
        assert fetch(path_of(sitemap.find(f"{{{SM}}}loc").text))[0] == 200


def published_first(seed):
    """Seed 50 items (50 metadata records: 3 parts) and publish a first build in process;
    returns the set, the build and what it lists."""
    seed(50)
    metadata = demo_set("metadata")
    previous = build(metadata)
    return metadata, previous, sorted(listed(metadata))


def new_build(resource_set, previous):
    return Build.objects.filter(resource_set=resource_set, capability=previous.capability, pk__gt=previous.pk).first()


def wait_published(resource_set, previous):
    wait_for(
        lambda: getattr(new_build(resource_set, previous), "status", None) in ("published", "failed"), 120, "the build to end"
    )
    return new_build(resource_set, previous)


def test_two_workers_render_the_parts_and_the_last_one_publishes(workers, seed):
    sender, processes, logs = workers
    metadata, previous, expected = published_first(seed)
    with a_part_held_in_each_worker(sender, metadata):
        assert new_build(metadata, previous).status == Build.Status.RUNNING
        assert BuildLock.objects.filter(resource_set=metadata, capability="resourcelist").exists()
        served_index_is_whole(metadata)
    published = wait_published(metadata, previous)
    assert published.status == Build.Status.PUBLISHED, published.error
    assert [(p.number, p.attempts, p.entries) for p in published.parts.all()] == [(1, 1, 20), (2, 1, 20), (3, 1, 10)]
    assert len(check_index(metadata, 20)) == 3
    assert sorted(listed(metadata)) == expected
    assert not BuildLock.objects.exists()
    for process in processes.values():
        process.terminate()
        process.wait(timeout=60)
    for name, process in processes.items():
        logs[name] = process.communicate()[0]
        assert re.search(r"Task resourcesync\.build_part\[[^]]+\] succeeded", logs[name]), f"worker {name} rendered a part"


def test_a_worker_killed_in_the_middle_of_a_part_leaves_no_index_and_the_part_is_redelivered(workers, seed):
    sender, processes, logs = workers
    metadata, previous, expected = published_first(seed)
    with a_part_held_in_each_worker(sender, metadata):
        processes["one"].send_signal(signal.SIGKILL)
        processes["one"].wait(timeout=30)
    # The other worker goes on; the killed part waits for its visibility timeout meanwhile. Until
    # it is done again, the build stays unpublished and the previous one is served, whole.
    waiting = 0
    while (running := new_build(metadata, previous)).status == Build.Status.RUNNING:
        served_index_is_whole(metadata)
        if running.parts.filter(done__isnull=True).exists() and running.parts.filter(done__isnull=False).exists():
            waiting += 1
            assert Build.objects.get(pk=previous.pk).status == Build.Status.PUBLISHED
        time.sleep(0.2)
    assert waiting, "seen: the survivor's parts done, the killed one not yet, nothing published"
    published = wait_published(metadata, previous)
    assert published.status == Build.Status.PUBLISHED, published.error
    attempts = [p.attempts for p in published.parts.all()]
    assert sorted(attempts)[-1] == 2 and all(p.done for p in published.parts.all()), attempts
    served_index_is_whole(metadata)
    assert len(check_index(metadata, 20)) == 3
    assert sorted(listed(metadata)) == expected
    assert not BuildLock.objects.exists()



def test_a_worker_killed_in_the_middle_of_a_package_is_redelivered_and_the_dump_publishes_whole(workers, seed):
    from example_project.repository.models import ItemFile

    sender, processes, logs = workers
    seed(6, file_size=2048)  # 8 files: 4 packages of 2
    bitstreams = dumping(demo_set("bitstreams"))
    previous = build_resourcedump(bitstreams)
    before = packed(bitstreams, 5000)
    assert len(before) == 4
    # The first file of each package changes behind Django's back (same name and size, so its
    # record still vouches for it): packing it, a part hands it to change tracking, and waits
    # there while the test holds its record, with the package half written.
    firsts = list(Resource.objects.filter(resource_set=bitstreams).order_by("pk"))[::2]
    for row in firsts:
        path = Path(ItemFile.objects.get(pk=row.object_pk).file.path)
        path.write_bytes(bytes((byte + 1) % 256 for byte in path.read_bytes()))
    with ResourcesHeld(row.pk for row in firsts):
        sender.send_task("resourcesync.rebuild_set", args=[bitstreams.pk, ["resourcedump"]])
        wait_for(lambda: waiting_backends() == 2, 60, "a package in each worker")
        assert new_build(bitstreams, previous).status == Build.Status.RUNNING
        processes["one"].send_signal(signal.SIGKILL)
        processes["one"].wait(timeout=30)
    # Until the killed part is packed again, the previous dump is served, whole.
    seen_running = 0
    while new_build(bitstreams, previous).status == Build.Status.RUNNING:
        assert [name for name, _members in packed(bitstreams)] == [name for name, _members in before]
        seen_running += 1
        time.sleep(0.2)
    assert seen_running
    published = wait_published(bitstreams, previous)
    assert published.status == Build.Status.PUBLISHED, published.error
    assert sorted(p.attempts for p in published.parts.all()) == [1, 1, 1, 2] and all(p.done for p in published.parts.all())
    after = packed(bitstreams, 5000)
    assert [(name, [uri for uri, _md, _data in members]) for name, members in after] == [
        (name, [uri for uri, _md, _data in members]) for name, members in before
    ]
    for _name, members in after:
        for uri, _md, data in members:
            assert data == fetch(path_of(uri))[1], "every file packed as it is now"
    assert published.report == {**DUMP_REPORT, "changed_since_hashed": 4}
    assert not BuildLock.objects.exists()
    processes["two"].terminate()
    logs["two"] = processes["two"].communicate(timeout=60)[0]
    assert len(re.findall(r"Task resourcesync\.build_part\[[^]]+\] succeeded", logs["two"])) >= 4, "the survivor packed the rest"


@pytest.mark.django_db
def test_a_part_does_not_stretch_the_lock_its_planner_still_holds(settings, seed, metadata):
    expires = timezone.now() + datetime.timedelta(seconds=15)
    BuildLock.objects.create(resource_set=metadata, capability="resourcelist", holder="h", pid=os.getpid(), expires=expires)
    assert build_lock(metadata, "resourcelist", holder="h").renew()
    assert BuildLock.objects.get().expires == expires, "the planner's heartbeat keeps it; a dead planner's lapses soon"
    BuildLock.objects.update(pid=None)  # the plan is whole: the tasks keep it now
    assert build_lock(metadata, "resourcelist", holder="h").renew()
    assert BuildLock.objects.get().expires > timezone.now() + datetime.timedelta(seconds=60)
    assert not build_lock(metadata, "resourcelist", holder="someone else").renew()


# --- Parts on threads: a build made in one process on PostgreSQL ----------------------------------


class ThreadsSeen(list):
    #: A ``threading.Barrier`` each part waits at, if set.
    meeting = None


@pytest.fixture
def threads_seen(transactional_db, monkeypatch):
    """The names of the threads that render parts, of either capability: ``[(capability, name)]``."""
    if connection.vendor != "postgresql":
        pytest.skip("parts are rendered on threads on PostgreSQL only; run with TEST_DATABASE_URL")

    seen = ThreadsSeen()
    for module in (resourcelist, resourcedump):
        real = module.render_part

        def spy(context, part, *, real=real, **kwargs):
            seen.append((context.capability, threading.current_thread().name))
            if seen.meeting is not None:  # parts in pairs: each pair's two on two threads at once
                seen.meeting.wait()
            return real(context, part, **kwargs)

        monkeypatch.setattr(module, "render_part", spy)
    return seen


def test_on_postgresql_a_build_in_one_process_renders_its_parts_on_threads(settings, seed, bitstreams, threads_seen):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 4, "DUMP_PACKAGE_BYTES": 5000}
    dumping(bitstreams)
    seed(6, file_size=2048)  # 8 files: 2 parts of the list, 4 packages of the dump
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BUILD_THREADS": 1}
    one_by_one = rebuild_set(bitstreams)
    expected_list, expected_dump = sorted(listed(bitstreams)), packed(bitstreams, 5000)
    assert {name for _capability, name in threads_seen} == {"MainThread"}
    threads_seen.clear()

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BUILD_THREADS": 2}
    heard = []
    threads_seen.meeting = threading.Barrier(2, timeout=30)  # broken if one thread renders the parts
    on_threads = rebuild_set(bitstreams, progress=lambda *args, **kw: heard.append(args))
    assert [b.status for b in on_threads] == [Build.Status.PUBLISHED] * 2
    assert [b.entries for b in on_threads] == [b.entries for b in one_by_one] == [8, 8]
    for capability, count in (("resourcelist", 2), ("resourcedump", 4)):
        names = [name for kind, name in threads_seen if kind == capability]
        assert len(names) == count and all(name.startswith("resourcesync-part") for name in names), threads_seen
        assert len(set(names)) == 2, f"the {capability}'s parts on two threads"
    assert sorted(listed(bitstreams)) == expected_list
    assert len(check_index(bitstreams, 4)) == 2
    assert packed(bitstreams, 5000) == expected_dump, "the same packages, members and bytes"
    assert [args for args in heard if args[0] == "resourcelist"][-1] == ("resourcelist", 8, 8), "the parts' progress added up"
    assert not BuildLock.objects.exists()


def test_a_part_failing_on_its_thread_fails_the_build_and_removes_what_the_others_wrote(
    settings, seed, metadata, monkeypatch, documents_storage, threads_seen
):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 2}
    seed(7)
    previous = build(metadata)
    _, served, _ = fetch("/resourcesync/metadata/resourcelist.xml")
    fail_part(monkeypatch, 3)
    with pytest.raises(OSError, match="storage unreachable"):
        build(metadata)
    failed = assert_failed_and_removed(metadata, previous, served, documents_storage)
    assert failed.parts.filter(done__isnull=False).exists(), "other parts were done on their threads"
    assert {name for _capability, name in threads_seen} != {"MainThread"}


@pytest.mark.django_db
def test_inside_a_transaction_the_parts_are_rendered_one_after_the_other(settings, seed, metadata):
    from django_resourcesync.builders.context import BuildContext

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BUILD_THREADS": 4}
    context = BuildContext(metadata, "resourcelist", at=timezone.now())
    assert parts._threads(context) == 1, "a thread's connection would not see this test's uncommitted rows"
