"""The embedded default: with no Celery app, or no broker, the app processes changes itself, on
a thread after the commit, and says so; SQLite's writers wait their turn; a stalled processing is
reported with its reason; channels nobody subscribes to cost one query."""

import contextlib
import json
import logging
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from celery import current_app
from django.core import checks
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_resourcesync import capabilities, push, running, tasks, tracking
from django_resourcesync.models import ChangeEvent, PendingChange, ResourceSet
from django_resourcesync.tracking import outbox
from example_project.repository.models import Collection, Item

from .conftest import demo_set
from .helpers import free_port
from .test_push import wait_for


@pytest.fixture
def embedded(settings):
    """The example's Celery app as a site that configured no broker has it (not eager)."""
    conf = current_app._get_current_object().conf
    before = conf.task_always_eager, conf.broker_url
    conf.task_always_eager, conf.broker_url = False, ""
    running.forget()
    yield
    assert outbox.dispatcher.flush(timeout=60)
    push.runner.idle(timeout=30)
    conf.task_always_eager, conf.broker_url = before
    running.forget()


@pytest.fixture
def sqlite_as_a_new_site_has_it():
    """The database options of a site made by ``startproject``: none (the example project
    chooses IMMEDIATE transactions and the write-ahead log itself). The threads' connections are
    made from these settings."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's own locking")
    options = connections.settings[connection.alias]["OPTIONS"]
    before = dict(options)
    for name in ("transaction_mode", "init_command"):
        options.pop(name, None)
    connection.close()
    yield
    connection.close()
    options.clear()
    options.update(before)


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_mode_follows_the_site_s_celery_app(settings, monkeypatch, embedded):
    app = current_app._get_current_object()  # the example's, or another a test made current
    conf = app.conf
    assert running.mode() == (running.EMBEDDED, f"the Celery app {app.main!r} has no broker_url")
    conf.broker_url = f"redis://127.0.0.1:{closed_port()}/0"
    running.forget()
    found = running.mode()
    assert found.name == running.EMBEDDED and "does not answer" in found.reason
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        conf.broker_url = f"redis://user:secret@127.0.0.1:{listening.getsockname()[1]}/0"
        running.forget()
        found = running.mode()
        assert found.name == running.CELERY and "secret" not in found.reason
    # Fail-over brokers, as a list or joined by ";": any that answers will do; no password shown.
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        conf.broker_url = [f"amqp://u:first@127.0.0.1:{closed_port()}//",
                           f"amqp://u:second@127.0.0.1:{listening.getsockname()[1]}//"]
        running.forget()
        found = running.mode()
        assert found.name == running.CELERY and "first" not in found.reason and "second" not in found.reason
    conf.task_always_eager = True
    assert running.mode().name == running.EAGER
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "TASKS": "embedded"}
    assert running.mode().name == running.EMBEDDED
    monkeypatch.setattr(running, "site_app", lambda: None)
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "TASKS": "auto"}
    assert running.mode() == (running.EMBEDDED, "no Celery app is configured")


def test_check_says_where_tasks_run_and_refuses_an_unknown_choice(settings, embedded, capsys):
    from django.core.management import call_command

    call_command("check")
    said = capsys.readouterr()
    infos = [line for line in (said.out + said.err).splitlines() if "resourcesync.I001" in line]
    assert len(infos) == 1 and "embedded mode" in infos[0] and "no broker_url" in infos[0]
    # Only the check command says it: the others run the checks before their own work.
    assert "resourcesync.I001" not in {m.id for m in checks.run_checks()}
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "TASKS": "workers"}
    assert "resourcesync.E030" in {m.id for m in checks.run_checks()}


@pytest.mark.django_db(transaction=True)
def test_changes_are_processed_on_a_thread_after_the_commit(embedded, seed, monkeypatch):
    seed(2)
    metadata = demo_set("metadata")
    tracking.refresh(metadata)
    threads = []
    process = tracking.process_pending

    def processing(*args, **kwargs):
        threads.append(threading.current_thread())
        return process(*args, **kwargs)

    monkeypatch.setattr(tracking, "process_pending", processing)
    item = Item.objects.filter(is_public=True).first()
    item.title = "Saved in the embedded mode"
    item.save()
    created = Item.objects.create(collection=Collection.objects.first(), title="New", is_public=True)
    created_pk = created.pk
    assert outbox.dispatcher.flush(timeout=60)
    created.delete()
    assert outbox.dispatcher.flush(timeout=60)
    assert threads and all(thread is not threading.current_thread() for thread in threads)
    assert not PendingChange.objects.exists()
    changes = list(ChangeEvent.objects.filter(resource_set=metadata).order_by("id").values_list("uri", "change"))
    assert [change for uri, change in changes if uri.endswith(f"/{item.pk}/metadata.xml")] == ["updated"]
    assert [change for uri, change in changes if uri.endswith(f"/{created_pk}/metadata.xml")] == ["created", "deleted"]


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_on_sqlite_never_meet_a_locked_database(embedded, sqlite_as_a_new_site_has_it, seed, caplog):
    """Sets offering the notification channels created in a loop while other threads save
    items: the push runner and the processing thread write beside them."""
    seed(3)
    metadata = demo_set("metadata")
    tracking.refresh(metadata)
    channels = [capabilities.RESOURCELIST, capabilities.CHANGELIST, capabilities.FRAMEWORK_NOTIFICATION,
                capabilities.CHANGE_NOTIFICATION]
    ResourceSet.objects.filter(pk=metadata.pk).update(capabilities=channels)
    failures = []
    items = list(Item.objects.filter(is_public=True))

    def saver(item):
        try:
            for number in range(40):
                # As the admin and ATOMIC_REQUESTS save: a transaction that reads, then writes.
                with transaction.atomic():
                    item = Item.objects.get(pk=item.pk)
                    item.title = f"{item.pk} save {number}"
                    item.save()
        except Exception as exc:  # what the test is about
            failures.append(exc)

    savers = [threading.Thread(target=saver, args=(item,)) for item in items[:3]]
    with caplog.at_level(logging.WARNING, logger="django_resourcesync"):
        for thread in savers:
            thread.start()
        for number in range(40):
            ResourceSet.objects.create(name=f"Set {number}", slug=f"set-{number}", source="metadata", capabilities=channels)
        for thread in savers:
            thread.join()
        assert outbox.dispatcher.flush(timeout=60)
        assert push.runner.idle(timeout=60)
    locked = [record.getMessage() for record in caplog.records if "locked" in str(record.exc_info) + record.getMessage()]
    assert failures == [] and locked == []
    assert not PendingChange.objects.exists()
    assert ChangeEvent.objects.filter(resource_set=metadata, change="updated").exists()


@pytest.mark.django_db(transaction=True)
def test_a_transaction_that_reads_then_writes_waits_for_another_writer_on_sqlite(sqlite_as_a_new_site_has_it, seed):
    """The site's transaction reads, the app's thread writes and commits meanwhile, then the
    site's transaction writes: on SQLite, with deferred transactions, that write fails at once
    with "database is locked"; the app's connections wait their turn."""
    seed(1)
    read, wrote = threading.Event(), threading.Event()
    failures = []

    def site():
        try:
            with transaction.atomic():
                item = Item.objects.get()
                read.set()
                wrote.wait(2)  # the other writer has begun (or waits for this one)
                item.title = "written after the other writer"
                item.save()
        except Exception as exc:
            failures.append(exc)
        finally:
            read.set()

    def app():
        try:
            read.wait(10)
            with transaction.atomic():
                PendingChange.objects.create(source="metadata", object_pk="0", related="")
                wrote.set()
                time.sleep(0.3)
        except Exception as exc:
            failures.append(exc)

    threads = [threading.Thread(target=site), threading.Thread(target=app)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert Item.objects.get().title == "written after the other writer"
    PendingChange.objects.all().delete()


@pytest.mark.django_db
def test_changes_waiting_for_more_than_a_minute_are_a_warning_with_the_reason(embedded):
    PendingChange.objects.create(source="metadata", object_pk="1", related="",
                                 recorded=timezone.now() - timedelta(minutes=5))
    found = [m for m in checks.run_checks() if m.id == "resourcesync.W016"]
    assert len(found) == 1 and found[0].msg.startswith("1 pending change(s) have waited since")
    assert "in its own process" in found[0].msg and "no broker_url" in found[0].msg and found[0].hint
    PendingChange.objects.update(recorded=timezone.now())
    assert not [m for m in checks.run_checks() if m.id == "resourcesync.W016"]


@pytest.mark.django_db
def test_channels_nobody_subscribes_to_cost_one_query():
    metadata = demo_set("metadata")
    ResourceSet.objects.filter(pk=metadata.pk).update(
        capabilities=[capabilities.CHANGELIST, capabilities.FRAMEWORK_NOTIFICATION, capabilities.CHANGE_NOTIFICATION])
    with CaptureQueriesContext(connection) as queries:
        assert tasks.notify_task() == []
    assert len(queries) == 1, [query["sql"] for query in queries]


@pytest.mark.django_db(transaction=True)
def test_a_save_returns_before_its_changes_are_processed(embedded, seed, monkeypatch):
    """The saving thread hands the processing over: a slow processing holds up no save."""
    seed(1)
    release, done = threading.Event(), threading.Event()
    process = tracking.process_pending

    def slow(*args, **kwargs):
        release.wait(30)
        try:
            return process(*args, **kwargs)
        finally:
            done.set()

    monkeypatch.setattr(tracking, "process_pending", slow)
    try:
        Item.objects.first().save()
        assert not done.is_set(), "the save waited for its processing"
    finally:
        release.set()
    assert outbox.dispatcher.flush(timeout=60) and done.is_set()


@pytest.mark.django_db(transaction=True)
def test_changes_keep_the_order_they_were_made_in_whoever_writes_their_rows(embedded, seed):
    """A save in autocommit hands its pending change to the thread, which writes it a little
    later; a deletion (Django deletes in a transaction) writes its own at once, so with a key
    lower than the save's. The Change List tells of them in the order they were made."""
    seed(2)
    metadata = demo_set("metadata")
    tracking.refresh(metadata)
    first, second = Item.objects.filter(is_public=True).order_by("pk")[:2]
    first_pk, second_pk = first.pk, second.pk
    first.title = "Saved first"
    first.save()
    second.delete()
    assert outbox.dispatcher.flush(timeout=60)
    events = list(ChangeEvent.objects.filter(resource_set=metadata, object_pk__in=[str(first_pk), str(second_pk)])
                  .order_by("id").values_list("object_pk", "change", "datetime"))
    assert [(pk, change) for pk, change, _ in events] == [(str(first_pk), "updated"), (str(second_pk), "deleted")]
    assert events[0][2] < events[1][2]


@pytest.mark.django_db(transaction=True)
def test_a_flush_that_times_out_writes_the_changes_it_still_holds(embedded, seed, monkeypatch):
    """A process that exits while its thread processes a long batch: the saves made meanwhile
    are written as pending changes (for the next run), not lost with the process."""
    seed(1)
    release = threading.Event()
    process = tracking.process_pending

    def slow(*args, **kwargs):
        release.wait(30)
        return process(*args, **kwargs)

    monkeypatch.setattr(tracking, "process_pending", slow)
    item = Item.objects.first()
    try:
        item.title = "first"
        item.save()  # its processing holds the thread
        time.sleep(0.3)
        item.title = "second"
        item.save()  # held by the dispatcher behind it
        assert outbox.dispatcher.flush(timeout=0.5) is False
        saves = PendingChange.objects.filter(source="metadata", object_pk=str(item.pk), state__isnull=False)
        assert saves.count() == 2, "the save the thread had not taken is written too"
    finally:
        release.set()


# A serving process processes what other processes left pending: on its first request, and on
# a timer. Real processes: the example project served by runserver in its embedded default, and
# ``manage.py shell`` scripts killed (SIGKILL) right after a commit.

KILLED_AFTER_ITS_COMMIT = """
import os, signal
from django.db import transaction
from example_project.repository.models import Item
item = Item.objects.filter(is_public=True).order_by("pk")[{index}]
with transaction.atomic():
    item.title = {title!r}
    item.save()
print(item.pk, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # before the thread that processes its change has run
"""


class Site:
    """The example project in its embedded default (no broker; SQLite in a folder of its own),
    run through ``manage.py``, with settings that add ``options`` to ``RESOURCESYNC``."""

    root = Path(__file__).resolve().parents[1]

    def __init__(self, folder):
        self.folder = folder
        self.database = folder / "db.sqlite3"
        (folder / "embedded_site_settings.py").write_text(
            "import json\n"
            "import os\n"
            "from example_project.settings import *  # noqa: F403\n"
            "RESOURCESYNC = {**RESOURCESYNC, **json.loads(os.environ.get('SITE_RESOURCESYNC', '{}'))}  # noqa: F405\n"
        )
        self.env = {key: value for key, value in os.environ.items()
                    if key not in ("DATABASE_URL", "TEST_DATABASE_URL", "CELERY_BROKER_URL")}
        self.env.update(EXAMPLE_VAR_DIR=str(folder), DJANGO_SETTINGS_MODULE="embedded_site_settings",
                        PYTHONPATH=os.pathsep.join([str(folder), str(self.root), os.environ.get("PYTHONPATH", "")]))

    def manage(self, *args, check=True):
        return subprocess.run([sys.executable, "manage.py", *args], cwd=self.root, env=self.env, capture_output=True,
                              text=True, check=check, timeout=300)

    @contextlib.contextmanager
    def serving(self, options=None):
        """``runserver`` (no reloader) from the moment it has answered its first request."""
        port = free_port()
        log = self.folder / f"runserver-{port}.log"
        with open(log, "w") as output:
            server = subprocess.Popen(
                [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"], cwd=self.root,
                env={**self.env, "SITE_RESOURCESYNC": json.dumps(options or {})}, stdout=output, stderr=output,
            )
        try:
            url = f"http://127.0.0.1:{port}/.well-known/resourcesync"
            if not (wait_for(lambda: server.poll() is not None or answers(url), timeout=60) and server.poll() is None):
                raise RuntimeError(f"the server did not start: {log.read_text()[-2000:]}")
            yield log
        finally:
            server.terminate()
            server.wait(timeout=30)

    def killed_after_saving(self, index, title):
        """Save an item in a transaction from a ``manage.py shell`` script killed right after
        the commit: its pending change is committed, and never processed by it. The item's key."""
        done = self.manage("shell", "-c", KILLED_AFTER_ITS_COMMIT.format(index=index, title=title), check=False)
        assert done.returncode == -9, done.stderr
        return done.stdout.split()[-1]

    def changes_of(self, item_pk):
        """(its pending changes, its change events "updated"), as the site's database has them."""
        with contextlib.closing(sqlite3.connect(self.database, timeout=30)) as db:
            return tuple(db.execute(f"SELECT count(*) FROM {table} WHERE object_pk = ?{where}", [item_pk]).fetchone()[0]
                         for table, where in (("resourcesync_pendingchange", ""),
                                              ("resourcesync_changeevent", " AND change = 'updated'")))

    def processed(self, item_pk, within=30):
        """Whether the item's pending changes become change events within ``within`` seconds
        (no request is made meanwhile)."""

        def done():
            pending, updated = self.changes_of(item_pk)
            return not pending and updated

        return wait_for(done, timeout=within)


def answers(url):
    try:
        urllib.request.urlopen(url, timeout=5).read()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = Site(tmp_path_factory.mktemp("embedded-site"))
    site.manage("migrate", "--no-input")
    site.manage("seed_repository", "--items", "4")
    site.manage("resourcesync_rebuild")
    return site


def test_a_serving_process_processes_on_its_first_request_what_a_killed_process_left(site):
    item_pk = site.killed_after_saving(0, "Saved by a process killed after its commit")
    pending, updated = site.changes_of(item_pk)
    assert pending and not updated, "the killed process left its change pending"
    with site.serving() as log:  # defaults: its first request is the wait for it to answer
        assert site.processed(item_pk), log.read_text()[-2000:]


def test_a_serving_process_processes_on_a_timer_what_other_processes_left(site):
    with site.serving({"EMBEDDED_CATCH_UP_SECONDS": 1}) as log:
        item_pk = site.killed_after_saving(1, "Saved while the site serves, by a process killed after its commit")
        assert site.processed(item_pk), log.read_text()[-2000:]


def test_check_refuses_a_catch_up_interval_that_is_not_a_number_of_seconds(settings):
    def errors(value):
        settings.RESOURCESYNC = {**settings.RESOURCESYNC, "EMBEDDED_CATCH_UP_SECONDS": value}
        return [m for m in checks.run_checks() if m.id == "resourcesync.E030"]

    for wrong in ("60", 0, -5, True):
        found = errors(wrong)
        assert len(found) == 1 and "EMBEDDED_CATCH_UP_SECONDS" in found[0].msg and found[0].hint, wrong
        assert running.catch_up_seconds() == 60, "the default applies meanwhile"
    for right in (None, 0.5, 3600):
        assert errors(right) == [], right
        assert running.catch_up_seconds() == right
