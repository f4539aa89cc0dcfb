"""Fault injection: processes killed with SIGKILL, a full disk, a lost database connection and a
flaky storage, each at seeded random points. After every fault a Destination still finds every
document whole and valid (each package's bytes those listed), the next rebuild succeeds, the
storage sweep leaves no file that no record refers to, and each Resource List lists what the site
shows the public; after the loops, a Resource List plus the changes listed since it equals the
site's public state, bytes included.

The checks are in tests/faulty.py (``check_source``), shared with the driver process that
checks a site run as separate processes.
"""

import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from celery import Celery
from django.core.management import CommandError, call_command
from django.db.models import Max
from django.utils import timezone

from django_resourcesync import packaging
from django_resourcesync.builders import locks, resourcedump, resourcelist
from django_resourcesync.models import (
    Build,
    BuildLock,
    BuildPart,
    ChangeDumpPackage,
    ChangeList,
    Document,
    ResourceSet,
)

from . import faulty
from .conftest import demo_set

ROOT = Path(__file__).resolve().parents[1]


# --- 1. kill -9 of a rebuild ------------------------------------------------------------------

KILLS = 20
ITEMS = 500
#: The seed of every fault loop; another one (``RESOURCESYNC_FAULT_SEED``) tries other points.
SEED = int(os.environ.get("RESOURCESYNC_FAULT_SEED", 20240611))


class Site:
    """The example project in a folder of its own, on an SQLite database file, run as its owner
    runs it: one process per command. ``ask()`` talks to a driver process (``python -m
    tests.faulty``) that checks and changes the site between the commands."""

    def __init__(self, folder):
        self.folder = folder
        self.env = {
            k: v for k, v in os.environ.items()
            if not k.startswith(("TEST_", "AWS_", "PYTEST_")) and k not in ("DATABASE_URL", "CELERY_BROKER_URL")
        }
        self.env.update(DJANGO_SETTINGS_MODULE="example_project.settings", EXAMPLE_VAR_DIR=str(folder),
                        RESOURCESYNC_BASE_URL=faulty.BASE)
        self.driver = None

    def manage(self, *args, timeout=120):
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def start(self, *args):
        return subprocess.Popen([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def ask(self, command, **arguments):
        if self.driver is None:
            with open(self.folder / "driver.log", "w") as log:
                self.driver = subprocess.Popen([sys.executable, "-m", "tests.faulty"], cwd=ROOT, env=self.env, text=True,
                                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        self.driver.stdin.write(json.dumps({"command": command, "arguments": arguments}) + "\n")
        self.driver.stdin.flush()
        line = self.driver.stdout.readline()
        assert line, f"the driver died:\n{(self.folder / 'driver.log').read_text()[-3000:]}"
        reply = json.loads(line)
        assert reply["ok"], f"{command} failed in the driver:\n{reply['error']}"
        return reply["result"]

    def close(self):
        if self.driver is not None:
            self.driver.stdin.close()
            self.driver.wait(timeout=30)


@pytest.fixture
def site(tmp_path):
    running = Site(tmp_path)
    try:
        yield running
    finally:
        running.close()


def rebuilt(site):
    """Run ``resourcesync_rebuild`` to its end; returns its wall time."""
    started = time.monotonic()
    done = site.manage("resourcesync_rebuild", "-v0")
    elapsed = time.monotonic() - started
    assert done.returncode == 0, f"resourcesync_rebuild failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
    return elapsed


def assert_checks_pass(site, **options):
    report = site.ask("check", **options)
    assert report["problems"] == [], "\n".join(report["problems"][:50])
    return report


@pytest.mark.slow
@pytest.mark.skipif(
    bool(os.environ.get("TEST_DATABASE_URL")), reason="runs the site on an SQLite file: once, in the embedded half"
)
def test_rebuilds_killed_at_random_points_leave_whole_documents_and_the_next_rebuild_recovers_at_once(site):
    for args in (["migrate", "--no-input", "-v0"], ["seed_repository", "--items", str(ITEMS), "-v0"]):
        done = site.manage(*args)
        assert done.returncode == 0, done.stderr
    assert site.ask("enable") == ["all-records", "bitstreams", "metadata", "pages"]
    typical = rebuilt(site)
    assert_checks_pass(site)
    rng = random.Random(SEED)
    landed, recoveries = 0, []
    for kill in range(KILLS):
        site.ask("change", seed=rng.randrange(10**9))
        before = site.ask("state")["last_build"]
        killed = site.start("resourcesync_rebuild", "-v0")
        time.sleep(rng.uniform(0, typical))
        killed.send_signal(signal.SIGKILL)
        killed.communicate(timeout=30)  # reaped, as a shell or a supervisor does
        left = site.ask("state")
        landed += bool(left["running"] or left["locks"])
        # Whatever the kill interrupted, a Destination finds the documents published before, whole.
        assert_checks_pass(site, sweep=False, public=False)

        elapsed = rebuilt(site)
        recoveries.append(elapsed)
        # No waiting for the lock the killed process held: its process is gone, it is taken over.
        assert elapsed < 2 * typical + 5, f"kill {kill}: the next rebuild took {elapsed:.1f}s (a rebuild takes {typical:.1f}s)"
        after = site.ask("state")
        assert after["running"] == [] and after["locks"] == [], after
        abandoned = {pk for pk, _slug, _capability in left["running"]}
        for pk, capability, status, error in site.ask("builds", after=before):
            if pk in abandoned:
                assert status == "failed" and error.strip(), f"kill {kill}: build {pk} ({capability}) left {status}: {error!r}"
        assert_checks_pass(site)
    # The property of tests/test_consistency.py, on what is served after all the kills.
    site.ask("snapshot")
    site.ask("change", seed=rng.randrange(10**9))
    report = site.ask("replay")
    assert report["problems"] == [], "\n".join(report["problems"][:50])
    print(f"{KILLS} kills, {landed} of them in the middle of a build; a rebuild took {typical:.1f}s, "
          f"the rebuilds after the kills {min(recoveries):.1f}-{max(recoveries):.1f}s")


# --- In process: both demo sets published, checked after each fault ---------------------------


@pytest.fixture
def published(transactional_db, settings, tmp_path):
    """The files' and records' demo sets with every capability, 12 items (16 files), dump
    packages of about 5000 bytes, published; the storage sweep leaves files alone for an hour.
    The landing pages' set is disabled, whether an earlier test left it or not: the faults are
    injected into the builds of these two (the metadata records are rendered pages already)."""
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "DUMP_PACKAGE_BYTES": 5000, "SWEEP_GRACE_SECONDS": 3600}
    call_command("seed_repository", items=12, verbosity=0)
    ResourceSet.objects.filter(slug="pages").update(enabled=False)
    sets = [demo_set("bitstreams"), demo_set("metadata")]
    for resource_set in sets:
        resource_set.capabilities = faulty.CAPABILITIES
        resource_set.save()
    rebuild()
    return sets


def rebuild(*options, fails=False):
    """``resourcesync_rebuild`` in process, expected to succeed (or, with ``fails``, to fail);
    returns what it wrote on stderr."""
    err = io.StringIO()
    try:
        call_command("resourcesync_rebuild", *options, verbosity=0, stdout=io.StringIO(), stderr=err)
    except CommandError as exc:
        assert fails, f"resourcesync_rebuild {' '.join(options)} failed: {exc}\n{err.getvalue()}"
        return err.getvalue()
    assert not fails, f"resourcesync_rebuild {' '.join(options)} succeeded"
    return err.getvalue()


@pytest.fixture
def postgresql():
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("needs a PostgreSQL server (a worker process, a backend to terminate); run with TEST_DATABASE_URL")


def assert_source_whole(**options):
    problems, served = faulty.check_source(**options)
    assert problems == [], "\n".join(problems[:50])
    return served


# --- 2. kill -9 of a worker -------------------------------------------------------------------

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
WORKER_KILLS = 4
WORKER_SETTINGS = """
from tests.settings import *  # noqa

RESOURCESYNC = {**RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 20, "DUMP_PACKAGE_BYTES": 5000}
# A task whose worker died goes back to the queue after this many seconds (Redis redelivers
# unacknowledged messages once their visibility timeout is over), checked every second.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 8, "unacked_restore_interval": 1, "unacked_restore_throttle": 1}
"""


# With RESOURCESYNC_TEST_PAUSE_PLANNING set, the worker's planner of a Resource Dump in parts
# stops for a minute once it has sent its first part, the first time only, and names the build in
# a file.
WORKER_PAUSE = """
import os
from celery.signals import worker_ready


def _pause_planning(**kwargs):
    import pathlib
    import time

    from django_resourcesync.builders import parts

    planned, marker = parts.plan, pathlib.Path({marker!r})

    def plan(build, *args, **kwargs):
        for number, part in enumerate(planned(build, *args, **kwargs)):
            if number == 1 and build.capability == "resourcedump" and not marker.exists():
                marker.write_text(str(build.pk))
                time.sleep(60)
            yield part

    parts.plan = plan


if os.environ.get("RESOURCESYNC_TEST_PAUSE_PLANNING"):
    worker_ready.connect(_pause_planning, weak=False)
"""


def builds_running():
    return list(Build.objects.filter(status=Build.Status.RUNNING).values_list("pk", "resource_set__slug", "capability"))


class Workers:
    """``celery -A example_project worker`` processes on the test's database, files and a Redis
    database of their own; one runs at a time."""

    def __init__(self, folder, broker_url, database_url):
        import redis

        (folder / "fault_worker_settings.py").write_text(WORKER_SETTINGS + WORKER_PAUSE.format(marker=str(folder / "paused")))
        self.folder, self.broker_url, self.started, self.process = folder, broker_url, 0, None
        self.broker = redis.Redis.from_url(broker_url)
        self.env = dict(
            os.environ, DJANGO_SETTINGS_MODULE="fault_worker_settings", PYTHONPATH=os.pathsep.join([str(folder), str(ROOT)]),
            TEST_DATABASE_URL=database_url, TEST_CELERY_BROKER_URL=broker_url, TEST_FILES_DIR=str(folder),
        )

    def start(self):
        self.started += 1
        with open(self.folder / f"worker-{self.started}.log", "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "example_project", "worker", "--pool=solo", "-n",
                 f"fault{self.started}@%h", "--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            )

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def idle(self):
        """Nothing queued, nothing delivered and not yet acknowledged, no build running."""
        return not self.broker.llen("celery") and not self.broker.hlen("unacked") and not builds_running()

    def wait_idle(self, seconds, what):
        deadline = time.monotonic() + seconds
        quiet_since = None
        while True:
            assert self.process.poll() is None, (
                f"the worker exited: {(self.folder / f'worker-{self.started}.log').read_text()[-3000:]}"
            )
            if self.idle():
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 1.5:
                    return
            else:
                quiet_since = None
            if time.monotonic() > deadline:
                parts = list(
                    BuildPart.objects.filter(build__status="running", done__isnull=True)
                    .values_list("build_id", "number", "attempts")
                )
                raise AssertionError(
                    f"{what}: still busy after {seconds}s: queued {self.broker.llen('celery')}, unacknowledged "
                    f"{self.broker.hlen('unacked')}, builds running {builds_running()}, their parts not done "
                    f"(build, part, attempts) {parts}, "
                    f"locks {list(BuildLock.objects.values_list('capability', 'pid', 'expires'))}")
            time.sleep(0.3)


@pytest.fixture
def workers(postgresql, published, tmp_path, settings):
    from django.db import connection

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 20, "DUMP_PACKAGE_BYTES": 5000}
    db = connection.settings_dict
    database = f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    running = Workers(tmp_path, REDIS_URL.rsplit("/", 1)[0] + "/13", database)  # a Redis database of its own
    running.broker.ping()  # a missing broker is a failure, not a skip
    running.broker.flushdb()
    try:
        yield running
    finally:
        running.stop()
        running.broker.flushdb()
        for log in sorted(tmp_path.glob("worker-*.log")):
            print(f"--- {log.name}, last lines:\n{log.read_text()[-2000:]}")


@pytest.mark.slow
def test_workers_killed_at_random_points_leave_whole_documents_and_builds_that_publish_or_fail(workers, published):
    call_command("seed_repository", items=40, verbosity=0)  # 52 items: lists in parts, dumps of many packages
    # Not the current app: this process's own tasks (processing the changes it makes) run in it.
    sender = Celery("sender", broker=workers.broker_url, set_as_current=False)
    workers.start()

    def rebuild_on_workers():
        for resource_set in published:
            sender.send_task("resourcesync.rebuild_set", args=[resource_set.pk])

    started = timezone.now()
    rebuild_on_workers()
    workers.wait_idle(120, "the first rebuild")
    typical = (Build.objects.aggregate(last=Max("finished"))["last"] - started).total_seconds()
    assert not Build.objects.filter(status=Build.Status.FAILED).exists()
    assert_source_whole()
    rng = random.Random(SEED)
    outcomes, landed, redelivered = [], 0, 0
    for kill in range(WORKER_KILLS):
        faulty.change_site(rng)
        last = Build.objects.order_by("-pk").values_list("pk", flat=True).first()
        sent = time.monotonic()
        rebuild_on_workers()
        # A random point of the rebuild, once it has started building.
        while not Build.objects.filter(pk__gt=last).exists() and time.monotonic() - sent < 10:
            time.sleep(0.02)
        time.sleep(rng.uniform(0, max(typical - (time.monotonic() - sent), 0)))
        workers.kill()
        landed += Build.objects.filter(pk__gt=last, status=Build.Status.RUNNING).exists()
        workers.start()
        # What the killed worker was doing is delivered again: each build publishes or fails.
        workers.wait_idle(120, f"kill {kill}")
        redelivered += BuildPart.objects.filter(build__pk__gt=last, attempts__gt=1).count()
        for build in Build.objects.filter(pk__gt=last):
            assert build.status in (Build.Status.PUBLISHED, Build.Status.RETIRED, Build.Status.FAILED), build
            assert build.status != Build.Status.FAILED or build.error.strip(), build
            outcomes.append(f"{build.resource_set.slug} {build.capability} {build.status}"
                            + (f" ({build.error.strip().splitlines()[-1][:100]})" if build.error else ""))
        assert_source_whole(public=False)
        rebuild()
        assert_source_whole()
    assert landed, "no kill landed in the middle of a build"
    served = faulty.Served()
    faulty.change_site(rng)
    assert faulty.property_problems(served) == []
    print(f"{WORKER_KILLS} workers killed, {landed} in the middle of a build, {redelivered} part(s) rendered again; "
          f"a rebuild on a worker took {typical:.1f}s; the builds: {outcomes}")


@pytest.mark.slow
def test_a_worker_killed_while_it_plans_a_build_in_parts_leaves_no_build_running(workers, published):
    """The worker dies while it plans a Resource Dump in parts, after the set's Resource List was
    sent in parts. The rebuild is delivered again: it leaves the list to its parts if they still
    run, takes the dead planner's lock over, fails the dump left half planned (a part of it was
    never sent) and builds the dump again."""
    call_command("seed_repository", items=40, verbosity=0)
    sender = Celery("sender", broker=workers.broker_url, set_as_current=False)
    workers.env["RESOURCESYNC_TEST_PAUSE_PLANNING"] = "1"
    workers.start()
    for resource_set in published:
        sender.send_task("resourcesync.rebuild_set", args=[resource_set.pk])
    marker = workers.folder / "paused"
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline, "no planner paused"
        time.sleep(0.1)
    time.sleep(0.5)
    halted = Build.objects.get(pk=int(marker.read_text()))
    # What waits in the queue (the Resource List's parts among it) waits longer, as behind other
    # work: the list's build is still running when the rebuild comes again.
    waiting = workers.broker.lrange("celery", 0, -1)
    workers.broker.delete("celery")
    workers.kill()
    assert halted.status == Build.Status.RUNNING and halted.capability == "resourcedump"
    assert BuildPart.objects.filter(build=halted).count() == 2, "its second part recorded, never sent"
    running_list = Build.objects.get(resource_set=halted.resource_set, capability="resourcelist", status="running")
    workers.start()
    deadline = time.monotonic() + 60
    while Build.objects.filter(pk=halted.pk, status=Build.Status.RUNNING).exists():
        assert time.monotonic() < deadline, "the rebuild delivered again left the dump's build running"
        time.sleep(0.3)
    assert Build.objects.get(pk=running_list.pk).status == Build.Status.RUNNING
    if waiting:
        workers.broker.rpush("celery", *waiting)
    workers.wait_idle(60, "after the planner was killed")
    halted.refresh_from_db()
    assert halted.status == Build.Status.FAILED and "died" in halted.error, halted.error
    assert Build.objects.get(pk=running_list.pk).status == Build.Status.PUBLISHED
    again = Build.objects.filter(resource_set=halted.resource_set, capability="resourcedump", pk__gt=halted.pk).get()
    assert again.status == Build.Status.PUBLISHED
    assert_source_whole()


# --- 3. a full disk ---------------------------------------------------------------------------

NO_SPACE = "No space left on device"


@pytest.fixture
def full_disk(settings, tmp_path, monkeypatch):
    """The documents' storage on :data:`faulty.disk`, packages included (``packaging`` opens
    files on a filesystem storage with ``open()``)."""
    settings.STORAGES = {
        **settings.STORAGES,
        "resourcesync": {"BACKEND": "tests.faulty.DiskFullStorage", "OPTIONS": {"location": str(tmp_path / "documents")}},
    }
    monkeypatch.setattr(packaging, "open", faulty.disk.open, raising=False)
    faulty.disk.free()
    yield faulty.disk
    faulty.disk.free()


def latest_build(capability):
    return Build.objects.filter(capability=capability).order_by("-pk").first()


def dump_budget():
    """Bytes for the first package of a Resource Dump of bitstreams, its manifest and half the
    second package: the disk fills up in the middle of the second package."""
    build = Build.objects.get(resource_set__slug="bitstreams", capability="resourcedump", status="published")
    sizes = dict(Document.objects.filter(build=build).values_list("name", "size"))
    first, second = sorted(name for name in sizes if name.endswith(".zip"))[:2]
    return sizes[first] + sizes[first.replace(".zip", "-manifest.xml")] + sizes[second] // 2


def closing_due(settings):
    """Change Lists close every second; an event is recorded, and its second is over."""
    from example_project.repository.models import Item

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "CHANGELIST_PERIOD": 1}
    item = Item.objects.order_by("pk").first()
    item.title = "Changed before the disk filled up"
    item.save()
    time.sleep(1.1)
    assert ChangeList.objects.filter(until__isnull=True, entries__gt=0).exists()
    return 200


FULL_DISK = {
    # what is rebuilt: (--set, --only, the bytes left on the disk, what is refused, the build failed)
    "resource list": ("bitstreams", "resourcelist", lambda settings: 2000, "resourcelist.xml", "resourcelist"),
    "resource dump, a package half written": (
        "bitstreams", "resourcedump", lambda settings: dump_budget(), ".zip", "resourcedump"
    ),
    "change list closed": ("metadata", "changelist", closing_due, "changelist-", None),
    "change dump": ("bitstreams", "changedump", lambda settings: 1000, ".zip", "changedump"),
}


@pytest.mark.parametrize("case", list(FULL_DISK))
def test_a_full_disk_fails_the_build_cleanly_and_the_next_rebuild_succeeds_once_there_is_space(
    published, full_disk, settings, case
):
    slug, capability, budget, refused, failed_capability = FULL_DISK[case]
    # Changes for the next Change Dump package (none withdraws a package: see
    # test_a_change_dump_whose_packages_are_all_withdrawn_is_still_served).
    faulty.change_site(random.Random(case), private=0, deletions=0)
    space = budget(settings)
    before = assert_source_whole(sweep=False, public=False)
    full_disk.fill(after=space)
    stderr = rebuild("--set", slug, "--only", capability, fails=True)
    assert NO_SPACE in stderr, stderr
    assert full_disk.refusals and any(refused in name for name in full_disk.refusals), full_disk.refusals
    if failed_capability:
        build = latest_build(failed_capability)
        assert build.status == Build.Status.FAILED and NO_SPACE in build.error, (build.status, build.error[-500:])
    # The documents published before are served as they were, whole; the failure removed what
    # it had written: no file is left that no record refers to, even before a sweep.
    after = assert_source_whole(sweep=False, public=False)
    assert after.bodies == before.bodies
    assert faulty.storage_problems(sweep=False)["orphans"] == []

    full_disk.free()
    rebuild()
    assert_source_whole()
    if capability == "changelist":
        assert ChangeList.objects.filter(until__isnull=False).exists(), "closed once there was space"


# --- 4. the database connection terminated ----------------------------------------------------


def terminate_connection():
    """End this thread's database session from another connection, as an administrator's
    ``pg_terminate_backend``, a failover or a proxy's idle timeout does."""
    import psycopg
    from django.db import connection

    pid = connection.connection.info.backend_pid
    db = connection.settings_dict
    with psycopg.connect(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"], password=db["PASSWORD"],
                         dbname=db["NAME"], autocommit=True) as other:
        assert other.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]


def terminating_after(calls, function):
    """``function``, which terminates the connection when it is called for the ``calls``-th time."""
    count = [0]

    def wrapper(*args, **kwargs):
        count[0] += 1
        if count[0] == calls:
            terminate_connection()
        return function(*args, **kwargs)

    wrapper.calls = count
    return wrapper


def blocks_terminating(real):
    """``resourcelist._entry_blocks`` a block of two rows at a time, whose connection is
    terminated once the third entry is read (with the second block)."""
    def blocks(rows, _batch_size, *args):
        for number, block in enumerate(real(rows, 2, *args), start=1):
            if number == 2:
                terminate_connection()
            yield block

    return blocks


CONNECTION_LOST = {
    # where: (set, capability rebuilt, how the point is reached)
    "writing a resource list": (
        "metadata", "resourcelist",
        lambda mp: mp.setattr(resourcelist, "_entry_blocks", blocks_terminating(resourcelist._entry_blocks))
    ),
    "packing a resource dump": (
        "bitstreams", "resourcedump",
        lambda mp: mp.setattr(resourcedump.Packer, "pack", terminating_after(3, resourcedump.Packer.pack))
    ),
    "packing a change dump": (  # from the version store
        "bitstreams", "changedump",
        lambda mp: mp.setattr(resourcedump.Packer, "pack_bytes", terminating_after(2, resourcedump.Packer.pack_bytes))
    ),
}


@pytest.mark.parametrize("where", list(CONNECTION_LOST))
def test_a_build_whose_database_connection_is_terminated_fails_and_the_next_rebuild_succeeds(
    postgresql, published, monkeypatch, where
):
    monkeypatch.setattr(locks, "HEARTBEAT_SECONDS", 0.2)
    monkeypatch.setattr(locks, "HEARTBEAT_TTL_SECONDS", 2)
    slug, capability, inject = CONNECTION_LOST[where]
    faulty.change_site(random.Random(where), private=0, deletions=0)
    last = Build.objects.order_by("-pk").values_list("pk", flat=True).first()
    with monkeypatch.context() as patch:
        inject(patch)
        stderr = rebuild("--set", slug, "--only", capability, fails=True)
    assert "connection" in stderr, stderr  # "the connection is lost", "terminating connection due to administrator command"
    # The lock of the lost build does not keep the next one waiting past its heartbeat's time.
    deadline = time.monotonic() + locks.HEARTBEAT_TTL_SECONDS + 3
    while True:
        try:
            rebuild("--set", slug, "--only", capability)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    lost = Build.objects.filter(pk__gt=last, capability=capability).order_by("pk").first()
    assert lost.status == Build.Status.FAILED and lost.error.strip(), (lost.status, lost.error)
    rebuild()
    served = assert_source_whole()
    faulty.change_site(random.Random(where + " after"))
    assert faulty.property_problems(served) == []


# --- 5. a flaky storage -----------------------------------------------------------------------

FLAKY_ROUNDS = 30
FLAKY_RATE = 0.008  # of the storage calls that fail (saves, deletions, opens; writes of a part: a tenth of that)


@pytest.fixture
def flaky_storage(settings, tmp_path, monkeypatch):
    settings.STORAGES = {
        **settings.STORAGES,
        "resourcesync": {"BACKEND": "tests.faulty.FlakyStorage", "OPTIONS": {"location": str(tmp_path / "documents")}},
    }
    monkeypatch.setattr(packaging, "open", faulty.flaky.open, raising=False)
    faulty.flaky.stop()
    yield faulty.flaky
    faulty.flaky.stop()


def test_storage_errors_at_random_calls_never_publish_a_missing_or_partial_file(published, flaky_storage):
    rng = random.Random(SEED)
    outcomes = {"published": 0, "failed": 0, "injected": 0}
    for round_ in range(FLAKY_ROUNDS):
        for step in ("changes", "rebuild"):
            flaky_storage.start(rng.randrange(10**9), FLAKY_RATE)
            try:
                if step == "changes":
                    faulty.change_site(rng)  # what leaves a set is withdrawn from the dumps: they are written again
                else:
                    try:
                        call_command("resourcesync_rebuild", verbosity=0, stdout=io.StringIO(), stderr=io.StringIO())
                        outcomes["published"] += 1
                    except CommandError:
                        outcomes["failed"] += 1
            finally:
                injected = list(flaky_storage.injected)
                outcomes["injected"] += len(injected)
                flaky_storage.stop()
            # Whatever failed, what is served is whole, and every file a record refers to is
            # there with the bytes recorded (the files nothing refers to wait for the sweep).
            problems, _served = faulty.check_source(sweep=False, public=False)
            files = faulty.storage_problems(sweep=False)
            problems += [f"storage: {kind}: {name}" for kind in ("missing", "damaged") for name in files[kind]]
            assert problems == [], f"round {round_}, {step}, after the faults {injected}:\n" + "\n".join(problems[:30])
    assert outcomes["published"] and outcomes["failed"], outcomes
    # The storage works again: the next rebuild succeeds, the sweep leaves nothing behind, the
    # Resource Lists list the public state, and with the changes since, stay equal to it.
    rebuild()
    served = assert_source_whole()
    faulty.change_site(rng)
    assert faulty.property_problems(served) == []
    print(outcomes)


# --- Found by the loops -----------------------------------------------------------------------


def test_a_change_dump_whose_packages_are_all_withdrawn_is_still_served(published):
    """Found by the loops above: an item made private withdraws every Change Dump package that
    holds its bytes, until the next rebuild packs them again. Meanwhile the Capability List
    must not point at a Change Dump that answers 404."""
    from example_project.repository.models import Item

    item = Item.objects.order_by("pk").first()
    item.title = "Edited, then packed"
    item.save()
    rebuild()  # the Change Dump: one package, which holds the edit
    assert ChangeDumpPackage.objects.filter(resource_set__slug="metadata", withdrawn__isnull=True).count() == 1
    before, _served = faulty.check_source(sweep=False, public=False)
    assert before == []
    item.is_public = False
    item.save()
    problems, _served = faulty.check_source(sweep=False, public=False)
    assert problems == [], "\n".join(problems)


