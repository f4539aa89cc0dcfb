"""Parallel builds: a Resource List planned as parts that Celery tasks render, in process (eager
mode) and on real worker processes fed by Redis, one of them killed in the middle of a part."""

import contextlib
import datetime
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from django_resourcesync.builders import BuildInProgress, build_lock, parts, resourcelist
from django_resourcesync.builders.resourcelist import build_resourcelist
from django_resourcesync.models import Build, BuildLock, BuildPart, Document
from django_resourcesync.tasks import build_part_task

from .conftest import demo_set
from .helpers import build, fetch, path_of, resource_list_entries
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
    real = resourcelist.render_part

    def failing(context, part, **kwargs):
        if part.number == 2:
            raise OSError("storage unreachable")
        return real(context, part, **kwargs)

    monkeypatch.setattr(resourcelist, "render_part", failing)
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(OSError):
        parallel_build(metadata)
    failed = Build.objects.filter(resource_set=metadata).order_by("-pk").first()
    assert failed.pk != previous.pk
    assert failed.status == Build.Status.FAILED and "storage unreachable" in failed.error
    assert not Document.objects.filter(build=failed).exists()
    assert not (documents_storage / "documents" / "metadata" / str(failed.pk)).exists() or not any(
        (documents_storage / "documents" / "metadata" / str(failed.pk)).iterdir()
    ), "part 1 was written, then removed"
    assert Build.objects.get(pk=previous.pk).status == Build.Status.PUBLISHED
    assert fetch("/resourcesync/metadata/resourcelist.xml")[1] == served
    assert not BuildLock.objects.exists()


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
    assert killed == (1, 3) and not Document.objects.filter(build=started).exists()
    folder = documents_storage / "documents" / "metadata" / str(started.pk)
    assert sorted(path.name for path in folder.iterdir()) == ["part-00001.xml"]
    for args in held_parts:
        build_part_task.apply(args=args).get()
    published = Build.objects.get(pk=started.pk)
    assert published.status == Build.Status.PUBLISHED
    assert sorted(path.name for path in folder.iterdir()) == ["part-00001.xml", "part-00002.xml", "part-00003.xml", "resourcelist.xml"]
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


# --- Real workers --------------------------------------------------------------------------

WORKER_SETTINGS = """
from tests.settings import *  # noqa

RESOURCESYNC = {**RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 20}
# A task whose worker died goes back to the queue after this many seconds (Redis redelivers
# unacknowledged messages once their visibility timeout is over), checked every second.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 8, "unacked_restore_interval": 1, "unacked_restore_throttle": 1}
"""


@pytest.fixture
def workers(transactional_db, tmp_path, settings):
    """Two worker processes (one task at a time each) on the test database; the test's own
    settings match theirs."""
    if connection.vendor != "postgresql":
        pytest.skip("a worker process cannot see the in-memory SQLite test database; run with TEST_DATABASE_URL")
    import redis

    redis.Redis.from_url(REDIS_URL).ping()  # a missing broker is a failure, not a skip
    (tmp_path / "parallel_worker_settings.py").write_text(WORKER_SETTINGS)
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 20}
    settings.MEDIA_ROOT = str(tmp_path / "media")
    db = connection.settings_dict
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="parallel_worker_settings",
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
        TEST_DATABASE_URL=f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        TEST_CELERY_BROKER_URL=REDIS_URL,
        TEST_FILES_DIR=str(tmp_path),
    )
    processes = {
        name: subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "example_project", "worker", "--pool=solo", "-n", f"{name}@%h",
             "--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for name in ("one", "two")
    }
    from celery import Celery

    sender = Celery("sender", broker=REDIS_URL, backend=REDIS_URL)
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


class DocumentsHeld:
    """Holds a lock on the Document table from another connection: a part can render and write
    its file, then waits before it records it, in the middle of its work."""

    def __enter__(self):
        import psycopg

        db = connection.settings_dict
        self.connection = psycopg.connect(
            host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"], password=db["PASSWORD"], dbname=db["NAME"]
        )
        self.connection.execute("LOCK TABLE resourcesync_document IN SHARE MODE")
        return self

    def __exit__(self, *exc_info):
        self.connection.rollback()
        self.connection.close()


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
    return Build.objects.filter(resource_set=resource_set, capability="resourcelist", pk__gt=previous.pk).first()


def wait_published(resource_set, previous):
    wait_for(lambda: getattr(new_build(resource_set, previous), "status", None) in ("published", "failed"), 120, "the build to end")
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

