"""Builds run by a real Celery worker process, fed by a real broker (Redis), on PostgreSQL."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from celery import Celery
from django.db import connection

from .conftest import demo_set
from .helpers import fetch
from .xmlcheck import check_document, entries

ROOT = Path(__file__).resolve().parents[1]
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture
def worker(transactional_db, tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("a worker process needs a database server (SQLite takes one writer at a time); run with TEST_DATABASE_URL")
    import redis

    redis.Redis.from_url(REDIS_URL).ping()  # a missing broker is a failure, not a skip
    db = connection.settings_dict
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="tests.settings",
        TEST_DATABASE_URL=(
            f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        ),
        TEST_CELERY_BROKER_URL=REDIS_URL,
        TEST_FILES_DIR=str(tmp_path),
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "example_project", "worker", "--pool=solo", "--concurrency=1", "--loglevel=INFO",
         "--without-gossip", "--without-mingle"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    sender = Celery("sender", broker=REDIS_URL, backend=REDIS_URL)
    try:
        yield sender, env
    finally:
        process.terminate()
        output = process.communicate(timeout=60)[0]
        print(output[-5000:])


def test_worker_builds_the_set_sent_by_task_name(worker, seed, settings, tmp_path):
    sender, env = worker
    settings.MEDIA_ROOT = str(tmp_path / "media")
    seed(6)
    metadata = demo_set("metadata")
    summary = sender.send_task("resourcesync.rebuild_set", args=[metadata.pk]).get(timeout=120)
    assert [(s["capability"], s["status"], s["entries"]) for s in summary] == [("resourcelist", "published", 6)]
    status, body, _ = fetch("/resourcesync/metadata/resourcelist.xml")
    assert status == 200 and len(entries(check_document(body, "resourcelist"))) == 6


def test_rebuild_command_async_enqueues_on_the_worker(worker, seed):
    sender, env = worker
    seed(3)
    bitstreams = demo_set("bitstreams")
    done = subprocess.run(
        [sys.executable, "manage.py", "resourcesync_rebuild", "--async", "--set", "bitstreams"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True,
    )
    task_id = done.stdout.strip().rsplit(" ", 1)[-1]
    assert done.stdout.startswith("bitstreams: task ")
    summary = sender.AsyncResult(task_id).get(timeout=120)
    assert summary[0]["entries"] == bitstreams.resources.count() == 4


def test_a_save_in_a_shell_reaches_the_open_change_list_through_the_worker(worker, seed):
    import time

    from django_resourcesync import tracking
    from example_project.repository.models import Item

    sender, env = worker
    seed(2)
    metadata = demo_set("metadata")
    tracking.reconcile(metadata)
    item = Item.objects.order_by("pk")[0]
    subprocess.run(
        [sys.executable, "manage.py", "shell", "-c",
         f"from example_project.repository.models import Item; i = Item.objects.get(pk={item.pk}); "
         "i.title = 'Saved in a shell'; i.save()"],
        cwd=ROOT, env=env, check=True, capture_output=True, timeout=120,
    )
    started = time.monotonic()
    while time.monotonic() - started < 20:
        status, body, _ = fetch("/resourcesync/metadata/changelist.xml")
        listed = entries(check_document(body, "changelist"))
        if listed:
            break
        time.sleep(0.2)
    assert [e.find("{http://www.sitemaps.org/schemas/sitemap/0.9}loc").text for e in listed] == [f"http://testserver/items/{item.pk}/metadata.xml"]
    print(f"the change was listed {time.monotonic() - started:.2f}s after the shell returned")
