"""Schedules: the documented CELERY_BEAT_SCHEDULE, and periodic tasks edited in the admin with
django-celery-beat (the ``beat`` extra), picked up by its DatabaseScheduler."""

import datetime
import importlib.util
import re
from pathlib import Path

import pytest
from celery.schedules import crontab
from django.conf import settings as django_settings
from django.utils import timezone

from example_project.celery import app

ROOT = Path(__file__).resolve().parents[1]
# django-celery-beat is the ``beat`` extra, not part of ``dev``: its latest release holds Django
# below 6.1. The documented schedule is tested without it.
needs_beat = pytest.mark.skipif(
    importlib.util.find_spec("django_celery_beat") is None,
    reason="django-celery-beat (the beat extra) is not installed; it supports Django 5.2 and 6.0",
)


def registered_tasks():
    import django_resourcesync.tasks  # noqa: F401  (what the workers' autodiscovery imports)

    return {name for name in app.tasks if name.startswith("resourcesync.")}


def documented_schedule():
    text = (ROOT / "docs" / "schedules.rst").read_text()
    block = re.search(
        r"\.\. code-block:: python\n\n((?:   .*\n|\n)*?   CELERY_BEAT_SCHEDULE = \{\n(?:   .*\n|\n)*?   \}\n)", text
    )
    assert block, "the CELERY_BEAT_SCHEDULE snippet of docs/schedules.rst"
    code = "\n".join(line[3:] for line in block.group(1).splitlines())
    namespace = {}
    exec(compile(code, "schedules.rst", "exec"), namespace)
    return namespace["CELERY_BEAT_SCHEDULE"]


def test_the_documented_and_the_example_schedules_name_tasks_the_workers_run():
    tasks = registered_tasks()
    for schedule in (documented_schedule(), django_settings.CELERY_BEAT_SCHEDULE):
        assert schedule
        for name, entry in schedule.items():
            assert entry["task"] in tasks, name
            assert isinstance(entry["schedule"], (crontab, float, int)), name
    assert {entry["task"] for entry in documented_schedule().values()} >= {
        "resourcesync.rebuild_all", "resourcesync.rebuild_set", "resourcesync.process_changes",
        "resourcesync.close_changelists", "resourcesync.reconcile_all", "resourcesync.package_changes",
    }


# The scheduler commits and closes its database connection between ticks, as beat does: not
# inside a test's transaction.
@needs_beat
@pytest.mark.django_db(transaction=True)
def test_a_periodic_task_added_in_the_admin_is_run_by_the_database_scheduler(admin_client):
    from django_celery_beat.models import IntervalSchedule, PeriodicTask
    from django_celery_beat.schedulers import DatabaseScheduler

    assert django_settings.CELERY_BEAT_SCHEDULER == "django_celery_beat.schedulers:DatabaseScheduler"
    form = admin_client.get("/admin/django_celery_beat/periodictask/add/")
    assert form.status_code == 200
    for name in registered_tasks():
        assert f'value="{name}"'.encode() in form.content, name

    every_minute = IntervalSchedule.objects.create(every=60, period=IntervalSchedule.SECONDS)
    started = timezone.now() - datetime.timedelta(minutes=5)
    answer = admin_client.post("/admin/django_celery_beat/periodictask/add/", {
        "name": "Pending changes, every minute",
        "regtask": "resourcesync.process_changes",
        "task": "",
        "interval": every_minute.pk,
        "args": "[]",
        "kwargs": '{"sources": ["metadata"]}',
        "headers": "{}",
        "enabled": "on",
        "start_time_0": started.strftime("%Y-%m-%d"),
        "start_time_1": started.strftime("%H:%M:%S"),
        "priority": "",
        "expire_seconds": "",
    })
    assert answer.status_code == 302, answer.content.decode()[-3000:]
    task = PeriodicTask.objects.get(name="Pending changes, every minute")
    assert task.task == "resourcesync.process_changes"

    scheduler = DatabaseScheduler(app=app)
    # The settings' schedule goes into the same tables, editable there too.
    assert set(django_settings.CELERY_BEAT_SCHEDULE) <= set(PeriodicTask.objects.values_list("name", flat=True))
    entry = scheduler.schedule["Pending changes, every minute"]
    assert entry.task == "resourcesync.process_changes" and entry.kwargs == {"sources": ["metadata"]}
    assert entry.is_due().is_due
    # What beat's tick does with a due entry: reserve it, then send its task (run in process here).
    result = scheduler.apply_async(entry, producer=None, advance=True)
    assert re.fullmatch(r"\d+ created, \d+ updated, \d+ deleted, \d+ unchanged, \d+ skipped", result.get())
    scheduler.sync()
    task.refresh_from_db()
    assert task.total_run_count == 1 and task.last_run_at >= started
