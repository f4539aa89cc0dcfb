"""Concurrent writers: saves of the same object from two processes, processed concurrently."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import OperationalError, connection, transaction

from django_resourcesync import tracking
from django_resourcesync.models import ChangeEvent, PendingChange, PreparedEntry, Resource, ResourceSet
from example_project.repository.models import Item

from .conftest import demo_set

ROOT = Path(__file__).resolve().parents[1]

WRITER = """
from example_project.repository.models import Item
item = Item.objects.get(pk={pk})
for i in range({saves}):
    item.title = "{name} save " + str(i)
    item.save()   # each commit processes the pending changes, racing the other process
"""


@pytest.mark.django_db(transaction=True)
def test_two_processes_saving_the_same_item(seed, tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("two writer processes need a database server; run with TEST_DATABASE_URL")
    seed(3)
    metadata = demo_set("metadata")
    tracking.reconcile(metadata)
    item = Item.objects.order_by("pk")[0]
    db = connection.settings_dict
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="tests.settings",
        TEST_DATABASE_URL=(
            f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        ),
        TEST_FILES_DIR=str(tmp_path),
    )
    writers = [
        subprocess.Popen(
            [sys.executable, "manage.py", "shell", "-c", WRITER.format(pk=item.pk, saves=40, name=name)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for name in ("first", "second")
    ]
    for writer in writers:
        output = writer.communicate(timeout=300)[0]
        assert writer.returncode == 0, output[-3000:]
    tracking.process_pending()
    assert not PendingChange.objects.exists()

    events = list(ChangeEvent.objects.filter(resource_set=metadata).order_by("id"))
    assert events and all(event.change == "updated" for event in events)
    assert [e.datetime for e in events] == sorted(e.datetime for e in events), "sequence order is time order"
    # The log ends on the state the site ended in: no change was lost.
    source = metadata.get_source()
    final = source.entry(source.queryset().get(pk=item.pk))
    assert events[-1].sha256 == final.sha256 == Resource.objects.get(resource_set=metadata, object_pk=str(item.pk)).sha256
    # And no two consecutive events describe the same bytes (each one is a real change).
    assert all(a.sha256 != b.sha256 for a, b in zip(events, events[1:]))


def _in_another_connection(work):
    """Run ``work()`` in a thread of its own (its own database connection) with a 2 s lock
    timeout; returns what it returned, or the exception it raised."""
    outcome = []

    def run():
        try:
            with transaction.atomic():  # the foreign keys are checked as it commits
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL lock_timeout = '2s'")
                done = work()
            outcome.append(done)
        except Exception as exc:  # noqa: BLE001 - handed back to the test
            outcome.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    return outcome[0]


@pytest.mark.django_db(transaction=True)
def test_the_set_lock_keeps_writers_apart_but_lets_helpers_keep_what_they_prepared(seed):
    # A worker describing objects ahead inserts rows that refer to the set while the writer
    # holds the set's lock: their foreign key check must not wait for the writer to commit.
    if connection.vendor != "postgresql":
        pytest.skip("row locks need a database server; run with TEST_DATABASE_URL")
    seed(1)
    metadata = demo_set("metadata")
    with tracking.locked(metadata):
        prepared = _in_another_connection(lambda: PreparedEntry.objects.create(
            resource_set_id=metadata.pk, object_pk="1", fingerprint="f", values="{}"
        ))
        assert isinstance(prepared, PreparedEntry), prepared
        other_writer = _in_another_connection(lambda: ResourceSet.objects.lock(metadata.pk))
        assert isinstance(other_writer, OperationalError) and "lock timeout" in str(other_writer), other_writer
