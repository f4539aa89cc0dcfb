"""What a save of a tracked object asks on the saving thread: whether tasks run in process
(asked at every save, kept between saves while nothing changes), and a flush that has the
thread write what it gathered at once."""

import pytest
from celery import current_app

from django_resourcesync import running, tracking
from django_resourcesync.models import ChangeEvent, PendingChange
from django_resourcesync.tracking import outbox
from example_project.repository.models import Item

from . import test_embedded
from .conftest import demo_set


@pytest.fixture
def app_conf():
    """The example's Celery app's configuration, with nothing of ``task_always_eager`` set on
    the app itself (the site's settings say it), restored after. The example's app is made the
    current one meanwhile (a test that ran before may have left another app current)."""
    from example_project.celery import app

    previous = current_app._get_current_object()
    app.set_current()
    conf = app.conf
    had = "task_always_eager" in conf.changes
    before = conf.changes.pop("task_always_eager") if had else None
    running.forget()
    yield conf
    if "task_always_eager" in conf.changes:
        conf.changes.pop("task_always_eager")
    if had:
        conf.changes["task_always_eager"] = before
    previous.set_current()
    running.forget()


def test_whether_tasks_run_in_process_follows_the_settings_and_the_app(settings, app_conf):
    """Asked at every save and kept between them: a change of the site's setting, or a value set
    on the Celery app itself, counts at the next save."""
    settings.CELERY_TASK_ALWAYS_EAGER = False
    assert not running.eager() and running.mode().name != running.EAGER
    settings.CELERY_TASK_ALWAYS_EAGER = True
    assert running.eager() and running.mode().name == running.EAGER
    app_conf.task_always_eager = False
    assert not running.eager() and running.mode().name != running.EAGER
    app_conf.task_always_eager = True
    assert running.eager() and running.mode().name == running.EAGER
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "TASKS": "embedded"}
    assert not running.eager() and running.mode().name == running.EMBEDDED


embedded = test_embedded.embedded  # the fixture: no broker, not eager


@pytest.mark.django_db(transaction=True)
def test_a_flush_has_the_saves_gathered_written_at_once(embedded, seed, monkeypatch):
    """The thread waits a moment after a save for the saves that follow, to write them together;
    a flush (a Celery task that saved, ending; a process exiting) does not wait that moment out:
    the change is written and processed, and the flush says everything was handed over."""
    seed(1)
    metadata = demo_set("metadata")
    tracking.refresh(metadata)
    monkeypatch.setattr(outbox, "GATHER_SECONDS", 600)
    item = Item.objects.filter(is_public=True).first()
    item.title = "Gathered, then flushed"
    item.save()
    assert outbox.dispatcher.flush(timeout=20), "the flush waited for the gathering to end"
    assert not PendingChange.objects.exists()
    assert ChangeEvent.objects.filter(resource_set=metadata, object_pk=str(item.pk), change="updated").exists()
