"""Concurrent writers: saves of the same object from two processes, processed concurrently."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from django_resourcesync import tracking
from django_resourcesync.models import ChangeEvent, PendingChange, Resource
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
