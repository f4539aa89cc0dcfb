"""A reconcile shared among the workers: key ranges that any worker takes, a silent holder's part
taken over, a failing part failing the job, and real worker processes on PostgreSQL, one killed
in the middle of its part."""

import contextlib
import datetime
import hashlib
import importlib
from unittest import mock

import pytest
from celery import current_app
from django.utils import timezone

from django_resourcesync import sharing, tracking
from django_resourcesync.models import ChangeEvent, PendingChange, Resource, SharedPart
from example_project.repository.models import Item

from .conftest import demo_set
from .helpers import fetch, path_of

# The module (the package exports its function under the same name).
reconciling = importlib.import_module("django_resourcesync.tracking.reconcile")
writing = importlib.import_module("django_resourcesync.tracking.writer")


def changed_behind_the_signals(count):
    """Change the titles of the first ``count`` items with queryset.update() (no signal): only a
    reconcile finds them. Returns their keys."""
    keys = list(Item.objects.order_by("pk").values_list("pk", flat=True)[:count])
    Item.objects.filter(pk__in=keys).update(title="Retitled behind the signals")
    return {str(key) for key in keys}


def updated_keys(resource_set):
    events = ChangeEvent.objects.filter(changelist__resource_set=resource_set, change="updated")
    return sorted(events.values_list("object_pk", flat=True))


@pytest.fixture
def small_parts(settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 4}


@pytest.mark.django_db
def test_key_ranges_cover_every_key_once_and_stay_open_at_both_ends(seed, small_parts):
    seed(10)
    queryset = Item.objects.all()
    ranges = reconciling._key_ranges(queryset, 4)
    assert ranges[0]["after"] is None and ranges[-1]["last"] is None
    keys = sorted(queryset.values_list("pk", flat=True))
    covered = []
    for bounds in ranges:
        part = queryset
        if bounds["after"] is not None:
            part = part.filter(pk__gt=bounds["after"])
        if bounds["last"] is not None:
            part = part.filter(pk__lte=bounds["last"])
        covered += sorted(part.values_list("pk", flat=True))
    assert covered == keys
    assert [len(r) for r in ranges] and len(ranges) == 3  # 4 + 4 + 2
    assert reconciling._key_ranges(queryset, 50) == [{"after": None, "last": None}]


@pytest.mark.django_db
def test_a_range_of_a_reconcile_in_parts_says_how_many_objects_differed_and_counts_none(seed, metadata):
    """Counting a range's objects was two fifths of a range with nothing changed; the reconcile
    counts the set once, after its ranges, and the objects that did not differ are unchanged."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    seed(10)
    tracking.reconcile(metadata)
    changed_behind_the_signals(3)
    options = {"after": None, "last": None, "record_events": True, "batch_size": 100}
    with CaptureQueriesContext(connection) as queries:
        result = reconciling._reconcile_range(metadata, options, lambda: None)
    assert result["updated"] == 3 and result[reconciling.DIFFERING] == 3 and result["unchanged"] == 0
    assert not [query["sql"] for query in queries if "COUNT(" in query["sql"].upper()]


@pytest.mark.django_db
def test_a_reconcile_in_parts_writes_what_a_reconcile_in_one_pass_writes(seed, small_parts, metadata):
    seed(10)
    tracking.reconcile(metadata)
    changed = changed_behind_the_signals(7)
    hidden = Item.objects.order_by("pk").last()
    Item.objects.filter(pk=hidden.pk).update(is_public=False)  # no signal either
    sent, kinds = [], []
    real_work = sharing._KINDS[reconciling.RECONCILE]

    def work(resource_set, options, beat):
        kinds.append("range")
        return real_work(resource_set, options, beat)

    # Eager mode: each part's task runs in place (a worker would take parts the same way).
    with mock.patch.object(sharing, "take_parts", wraps=sharing.take_parts) as taken, \
            mock.patch.dict(sharing._KINDS, {reconciling.RECONCILE: work}), \
            mock.patch.object(reconciling, "_gone_keys", wraps=reconciling._gone_keys) as searched:
        counts = tracking.reconcile(metadata, parallel=True)
        sent = [call.args[0] for call in taken.call_args_list]
    assert counts.updated == 7 and counts.deleted == 1 and counts.unchanged == 2 and counts.created == 0
    assert updated_keys(metadata) == sorted(changed)
    deleted = ChangeEvent.objects.filter(changelist__resource_set=metadata, change="deleted")
    assert list(deleted.values_list("object_pk", flat=True)) == [str(hidden.pk)]
    # The ranges are the job's parts; the search for the records whose object left follows,
    # since one record more than objects says there is one.
    assert kinds == ["range", "range", "range"] and searched.call_count == 1
    assert len(set(sent)) == 1, "every part of one job"
    assert not SharedPart.objects.exists(), "a job's parts are forgotten when it ends"
    # The record is that of a reconcile in one pass: nothing left to find, and no search for
    # gone records with as many records as objects.
    with mock.patch.object(reconciling, "_gone_keys", wraps=reconciling._gone_keys) as searched:
        assert tracking.reconcile(metadata, parallel=True).unchanged == 9
    assert searched.call_count == 0
    assert tracking.reconcile(metadata).unchanged == 9


@pytest.mark.django_db
def test_a_range_of_a_reconcile_in_parts_is_described_before_the_sets_lock_is_taken(seed, small_parts, metadata, monkeypatch):
    """Workers that reconcile ranges of one set take its lock in turn: each describes its batch
    (renders the records, writes the entries) before it takes the lock and holds the lock for
    the writing alone, so that one describes while another writes."""
    seed(10)
    tracking.reconcile(metadata)
    changed = changed_behind_the_signals(7)
    holding, described = [False], []
    real_locked, real_entry_values = reconciling.locked, writing.entry_values

    @contextlib.contextmanager
    def watched(resource_set):
        with real_locked(resource_set):
            holding[0] = True
            try:
                yield
            finally:
                holding[0] = False

    def watching(source, obj, *args, **kwargs):
        described.append((str(obj.pk), holding[0]))
        return real_entry_values(source, obj, *args, **kwargs)

    monkeypatch.setattr(reconciling, "locked", watched)
    monkeypatch.setattr(writing, "entry_values", watching)
    counts = tracking.reconcile(metadata, parallel=True)
    assert counts.updated == 7 and counts.unchanged == 3
    assert sorted(described) == sorted((key, False) for key in changed), "described once each, none under the lock"
    assert updated_keys(metadata) == sorted(changed)
    for record in Resource.objects.filter(resource_set=metadata, object_pk__in=changed):
        status, body, _response = fetch(path_of(record.uri))
        assert status == 200 and b"Retitled behind the signals" in body
        assert record.sha256 == hashlib.sha256(body).hexdigest() and record.length == len(body)


@pytest.mark.django_db
def test_a_job_whose_helpers_never_come_is_done_by_its_own_process(seed, small_parts, metadata):
    seed(10)
    tracking.reconcile(metadata)
    changed = changed_behind_the_signals(5)
    task = current_app.tasks[sharing.SHARE_JOB]
    with mock.patch.object(task, "delay", side_effect=ConnectionRefusedError("the broker is down")):
        counts = tracking.reconcile(metadata, parallel=True)
    assert counts.updated == 5
    assert updated_keys(metadata) == sorted(changed)
    assert not SharedPart.objects.exists()


@pytest.mark.django_db
def test_a_failing_part_fails_the_job_and_the_rebuild_reports_it(seed, small_parts, metadata):
    seed(10)
    tracking.reconcile(metadata)
    changed_behind_the_signals(10)
    real = reconciling._reconcile_in_database

    def failing(resource_set, source, queryset, *args, **kwargs):
        if queryset.filter(pk=Item.objects.order_by("pk").values_list("pk", flat=True)[5]).exists():
            raise RuntimeError("the source's database went away")
        return real(resource_set, source, queryset, *args, **kwargs)

    with mock.patch.object(reconciling, "_reconcile_in_database", failing):
        with pytest.raises(sharing.JobFailed, match="part 2: RuntimeError: the source's database went away"):
            tracking.reconcile(metadata, parallel=True)
    assert not SharedPart.objects.exists()
    # Nothing lost: the next reconcile finds what the failed part did not write.
    assert tracking.reconcile(metadata).updated + len(updated_keys(metadata)) >= 10
    assert len(updated_keys(metadata)) == 10


def parts_of_a_job(resource_set, count, **fields):
    job = "j" * 32
    SharedPart.objects.bulk_create(
        [SharedPart(job=job, kind=reconciling.RECONCILE, resource_set=resource_set, number=number,
                    options={"after": None, "last": None, "record_events": True, "batch_size": None}, **fields)
         for number in range(1, count + 1)]
    )
    return job


@pytest.mark.django_db
def test_a_part_whose_holder_went_silent_is_taken_over(seed, metadata, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "PART_TIMEOUT": 30}
    seed(3)
    tracking.reconcile(metadata)
    changed = changed_behind_the_signals(2)
    silent = timezone.now() - datetime.timedelta(seconds=31)
    job = parts_of_a_job(metadata, 1, holder="elsewhere:1:dead", heartbeat=silent, attempts=1)
    assert sharing.take_parts(job) == 1
    part = SharedPart.objects.get(job=job)
    assert part.done and part.attempts == 2 and part.holder != "elsewhere:1:dead" and part.result["updated"] == 2
    assert updated_keys(metadata) == sorted(changed)


DONE_HERE = []


@sharing.kind("test-noted")
def _noted_part(resource_set, options, beat):
    DONE_HERE.append(options["n"])
    return {"done": 1}


def three_noted_parts_the_first_held(resource_set):
    """A job of three "test-noted" parts, the first held by a helper that is alive."""
    DONE_HERE.clear()
    job = "w" * 32
    SharedPart.objects.bulk_create([SharedPart(job=job, kind="test-noted", resource_set=resource_set, number=number,
                                               options={"n": number}) for number in (1, 2, 3)])
    SharedPart.objects.filter(job=job, number=1).update(holder="helper:1:x", heartbeat=timezone.now(), attempts=1)
    return job


@pytest.mark.django_db
def test_waiting_for_parts_another_worker_holds_it_does_the_free_ones_meanwhile(seed, metadata, monkeypatch):
    # The process writing changes needs part 1, which a helper holds: rather than sit idle, it
    # does the free parts (the helper would do them next), one at a time, looking again after each.
    seed(1)
    job = three_noted_parts_the_first_held(metadata)
    looked = []

    def helper_finishes(seconds):  # the wait between looks: the helper is done with part 1 by then
        looked.append(list(DONE_HERE))
        SharedPart.objects.filter(job=job, number=1).update(done=timezone.now(), result={"done": 1})

    monkeypatch.setattr(sharing.time, "sleep", helper_finishes)
    assert sharing.ready(job, [1]) == []
    assert DONE_HERE == [2, 3] and looked == [[2, 3]]
    assert all(SharedPart.objects.filter(job=job).values_list("done", flat=True))


class FakeClock:
    """``sharing.time`` for a test: sleeping moves the clock on, and ``on_sleep(now)`` is told."""

    def __init__(self, on_sleep):
        self.now, self.pauses, self.on_sleep = 0.0, [], on_sleep

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.pauses.append(seconds)
        self.now += seconds
        self.on_sleep(self.now)


@pytest.mark.django_db
def test_the_job_does_its_own_work_while_a_helper_holds_the_last_part_and_looks_again_soon(seed, metadata, monkeypatch):
    # The job's process has done the free parts and a helper holds the last one: it does its own
    # remaining work then, once, and looks for the helper's part often at first (each moment it
    # sleeps past that part's end is added to the job), later less often, at most `wait` apart.
    seed(1)
    job = three_noted_parts_the_first_held(metadata)
    happened = []

    def helper_works(now):
        if now > 10:
            SharedPart.objects.filter(job=job, number=1).update(done=timezone.now(), result={"done": 1})

    clock = FakeClock(helper_works)
    monkeypatch.setattr(sharing, "time", clock)
    total = sharing.join(job, wait=0.2, meanwhile=lambda: happened.append((list(DONE_HERE), len(clock.pauses))))
    assert total == {"done": 3} and DONE_HERE == [2, 3]
    assert happened == [([2, 3], 0)], "once, after the free parts, before any sleep"
    assert clock.pauses[0] <= 0.02
    assert clock.pauses == sorted(clock.pauses) and max(clock.pauses) == pytest.approx(0.2)
    assert 10 < clock.now < 10.2, "the helper's part found done at the first look after it ended"


@pytest.mark.django_db
def test_a_reconcile_in_parts_counts_the_set_while_a_helper_compares_its_last_range(seed, small_parts, metadata, monkeypatch):
    seed(10)
    tracking.reconcile(metadata)
    changed = changed_behind_the_signals(3)
    hidden = Item.objects.order_by("pk").last()
    Item.objects.filter(pk=hidden.pk).update(is_public=False)  # no signal: its record is gone
    helper = "helper:1:x"
    real_offer = sharing.offer

    def offer(resource_set, name, options, *, helpers):  # a helper takes the last range at once
        job = real_offer(resource_set, name, options, helpers=0)
        last = SharedPart.objects.filter(job=job).order_by("number").last()
        SharedPart.objects.filter(pk=last.pk).update(holder=helper, heartbeat=timezone.now(), attempts=1)
        return job

    counted_while_held = []
    real_count = reconciling.models.QuerySet.count

    def count(queryset):
        if queryset.model is Item:
            counted_while_held.append(SharedPart.objects.filter(holder=helper, done__isnull=True).exists())
        return real_count(queryset)

    def helper_compares(now):
        job = SharedPart.objects.filter(holder=helper).values_list("job", flat=True).first()
        if job:
            SharedPart.objects.filter(job=job, holder=helper).update(holder="")
            assert sharing.take_parts(job, helper) == 1

    monkeypatch.setattr(sharing, "offer", offer)
    monkeypatch.setattr(sharing, "time", FakeClock(helper_compares))
    monkeypatch.setattr(reconciling.models.QuerySet, "count", count)
    counts = tracking.reconcile(metadata, parallel=True)
    assert counted_while_held == [True], "the set counted once, while the helper held its range"
    assert (counts.updated, counts.deleted, counts.unchanged, counts.created) == (3, 1, 6, 0)
    assert updated_keys(metadata) == sorted(changed)
    assert not Resource.objects.filter(resource_set=metadata, object_pk=str(hidden.pk)).exists()
    assert not SharedPart.objects.exists()


@pytest.mark.django_db
def test_a_part_whose_holder_is_alive_is_left_to_it(seed, metadata):
    seed(3)
    job = parts_of_a_job(metadata, 1, holder="elsewhere:1:busy", heartbeat=timezone.now(), attempts=1)
    assert sharing.take_parts(job) == 0
    assert SharedPart.objects.get(job=job).done is None


@pytest.mark.django_db
def test_a_part_started_too_often_fails_its_job(seed, metadata, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "PART_ATTEMPTS": 2, "PART_TIMEOUT": 1}
    seed(3)
    silent = timezone.now() - datetime.timedelta(seconds=5)
    job = parts_of_a_job(metadata, 1, holder="elsewhere:1:dead", heartbeat=silent, attempts=2)
    assert sharing.take_parts(job) == 0
    part = SharedPart.objects.get(job=job)
    assert part.done and part.error == "part 1 was started 2 times without finishing"


@pytest.mark.django_db
def test_the_sweep_forgets_the_parts_of_a_job_whose_process_died(seed, metadata):
    from django_resourcesync import sweep

    seed(1)
    old = timezone.now() - datetime.timedelta(days=2)
    abandoned = parts_of_a_job(metadata, 2, holder="gone:1:x", heartbeat=old)
    SharedPart.objects.filter(job=abandoned).update(created=old)
    live = "k" * 32
    SharedPart.objects.create(job=live, kind=reconciling.RECONCILE, resource_set=metadata, number=1, options={})
    sweep.sweep()
    assert list(SharedPart.objects.values_list("job", flat=True)) == [live]


@pytest.mark.django_db
def test_part_timeout_must_be_a_positive_integer(settings):
    from django_resourcesync.checks import check_settings

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "PART_TIMEOUT": 0}
    assert any("PART_TIMEOUT" in error.msg for error in check_settings(None))


def test_records_unchanged_by_a_shared_reconcile_keep_their_rows(db, seed, small_parts):
    metadata = demo_set("metadata")
    seed(9)
    tracking.reconcile(metadata)
    before = dict(Resource.objects.filter(resource_set=metadata).values_list("object_pk", "id"))
    tracking.reconcile(metadata, parallel=True)
    assert dict(Resource.objects.filter(resource_set=metadata).values_list("object_pk", "id")) == before


# --- Real workers --------------------------------------------------------------------------

SHARING_WORKER_SETTINGS = """
from tests.settings import *  # noqa

RESOURCESYNC = {**RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 20, "PART_TIMEOUT": 3}
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 8, "unacked_restore_interval": 1, "unacked_restore_throttle": 1}
"""


def test_a_worker_killed_in_the_middle_of_its_part_leaves_it_to_the_job_which_ends_whole(
    transactional_db, tmp_path, settings, seed
):
    import signal

    from celery import Celery

    from .test_parallel import REDIS_URL, Held, start_worker, wait_for, waiting_backends, worker_environment

    class ResourcesHeld(Held):
        """Reads of the record go on; its writes wait (a part is held before it writes)."""

        statement = "LOCK TABLE resourcesync_resource IN SHARE MODE"

    env = worker_environment(tmp_path, SHARING_WORKER_SETTINGS)
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 20, "PART_TIMEOUT": 3}
    seed(50)
    metadata = demo_set("metadata")
    tracking.reconcile(metadata)
    changed = changed_behind_the_signals(50)  # three parts: 20, 20 and 10 items
    sender = Celery("sender", broker=REDIS_URL, set_as_current=False)
    processes = {}
    try:
        with ResourcesHeld():
            processes["one"] = start_worker(env, "one")
            sender.send_task("resourcesync.reconcile_set", args=[metadata.pk])
            wait_for(lambda: waiting_backends() == 1, 60, "the job's own worker in its first part")
            processes["two"] = start_worker(env, "two")  # takes a part offered to the workers
            wait_for(lambda: waiting_backends() == 2, 60, "a second worker in a part")

            def holders():
                return set(SharedPart.objects.exclude(holder="").values_list("holder", flat=True))

            # A part held by the second worker: one offered to it, or, on a slow machine, the
            # first worker's own, whose heartbeat the lock held back past PART_TIMEOUT.
            wait_for(lambda: any(f":{processes['two'].pid}:" in holder for holder in holders()), 30,
                     "a part held by the second worker")
            processes["two"].send_signal(signal.SIGKILL)
            processes["two"].wait(timeout=30)
        # The job's worker ends its part and the free one, then takes the silent worker's over.
        wait_for(lambda: not SharedPart.objects.exists(), 90, "the job to end")
        assert updated_keys(metadata) == sorted(changed), "each change recorded once"
        assert tracking.reconcile(metadata).unchanged == 50
    finally:
        logs = {}
        for name, process in processes.items():
            if process.poll() is None:
                process.terminate()
            logs[name] = process.communicate(timeout=60)[0]
            print(f"--- worker {name} ---\n{logs[name][-3000:]}")
    assert "went silent; taken over" in logs["one"]
    assert "Task resourcesync.reconcile_set" in logs["one"] and "succeeded" in logs["one"]


# --- Changes described ahead, in parts ---------------------------------------------------------

processing = importlib.import_module("django_resourcesync.tracking.processing")


@pytest.fixture
def small_preparation(monkeypatch):
    monkeypatch.setattr(processing, "PREPARE_PART", 3)


def rendered_records(monkeypatch):
    """The keys of the records rendered (a record's bytes made), in order."""
    made = []
    source = type(demo_set("metadata").get_source())
    for name in ("content", "contents"):
        real = getattr(source, name, None)
        if real is None:
            continue

        def counting(self, arg, real=real, name=name):
            made.extend([arg.pk] if name == "content" else [obj.pk for obj in arg])
            return real(self, arg)

        monkeypatch.setattr(source, name, counting)
    return made


def record_rows(resource_set):
    fields = ("object_pk", "uri", "lastmod", "md5", "sha256", "length", "media_type", "links", "fingerprint", "entry_xml")
    return sorted(Resource.objects.filter(resource_set=resource_set).values_list(*fields))


def events(resource_set):
    log = ChangeEvent.objects.filter(changelist__resource_set=resource_set).order_by("pk")
    return list(log.values_list("object_pk", "change", "datetime", "sha256"))


@pytest.mark.django_db
def test_changes_described_ahead_in_parts_write_what_processing_alone_writes(seed, metadata, small_preparation, monkeypatch):
    seed(10)
    tracking.reconcile(metadata)
    keys = list(Item.objects.order_by("pk").values_list("pk", flat=True))
    for index, key in enumerate(keys[:8]):
        Item.objects.filter(pk=key).update(title=f"Retitled {index} & <again>")
    tracking.changed(model=Item, pks=keys[:8])
    made = rendered_records(monkeypatch)
    with mock.patch.object(sharing, "take_parts", wraps=sharing.take_parts) as taken:
        tracking.process_pending(["metadata"], parallel=True)
    assert taken.called, "the objects were described in parts"
    assert sorted(made) == sorted(keys[:8]), "each changed record rendered once, by the parts"
    assert not SharedPart.objects.exists() and not processing.PreparedEntry.objects.exists()
    prepared_rows, prepared_events = record_rows(metadata), events(metadata)
    assert [(key, change) for key, change, *_ in prepared_events] == [(str(key), "updated") for key in keys[:8]]
    # Every record described again, one by one through the site's view: the same rows.
    Resource.objects.filter(resource_set=metadata).update(fingerprint="")
    counts = tracking.reconcile(metadata)
    assert counts.updated == counts.created == counts.deleted == 0
    assert record_rows(metadata) == prepared_rows


@pytest.mark.django_db
def test_an_object_changed_after_it_was_described_ahead_is_described_again(seed, metadata, small_preparation, monkeypatch):
    seed(8)
    tracking.reconcile(metadata)
    keys = list(Item.objects.order_by("pk").values_list("pk", flat=True))
    Item.objects.filter(pk__in=keys).update(title="First")
    tracking.changed(model=Item, pks=keys)
    real = processing._prepare_part

    def then_changed(resource_set, options, beat):
        result = real(resource_set, options, beat)
        Item.objects.filter(pk=keys[0]).update(title="Changed after it was described")
        return result

    monkeypatch.setitem(sharing._KINDS, processing.PREPARE, then_changed)
    tracking.process_pending(["metadata"], parallel=True)
    record = Resource.objects.get(resource_set=metadata, object_pk=str(keys[0]))
    status, body, _ = fetch(record.uri.replace("http://testserver", ""))
    assert status == 200 and b"Changed after it was described" in body
    assert record.sha256 == hashlib.sha256(body).hexdigest(), "the record is of the object as it is, not as prepared"


@pytest.mark.django_db
def test_a_failing_preparation_costs_only_time(seed, metadata, small_preparation, monkeypatch, caplog):
    seed(8)
    tracking.reconcile(metadata)
    keys = list(Item.objects.order_by("pk").values_list("pk", flat=True))
    Item.objects.filter(pk__in=keys).update(title="Retitled")
    tracking.changed(model=Item, pks=keys)

    def failing(resource_set, options, beat):
        raise RuntimeError("a worker lost its database")

    monkeypatch.setitem(sharing._KINDS, processing.PREPARE, failing)
    counts = tracking.process_pending(["metadata"], parallel=True)
    assert counts.updated == 8 and not counts.failed_sets
    assert "could not all be described ahead" in caplog.text
    assert updated_keys(metadata) == sorted(str(key) for key in keys)


@pytest.mark.django_db
def test_each_batch_is_written_as_soon_as_its_objects_are_described(seed, metadata, small_preparation, monkeypatch, caplog):
    """The writing does not wait for the whole preparation: with no worker to help (the broker
    down), the job's own process describes the parts of each batch just before writing it."""
    seed(9)
    tracking.reconcile(metadata)
    # Only this test's changes (on a server database, a worker of an earlier test may have left some).
    PendingChange.objects.all().delete()
    keys = list(Item.objects.order_by("pk").values_list("pk", flat=True))
    Item.objects.filter(pk__in=keys).update(title="Retitled")
    tracking.changed(model=Item, pks=keys)
    steps = []
    real_part, real_apply = processing._prepare_part, processing._apply

    def part(resource_set, options, beat):
        steps.append(("described", options["keys"]))
        return real_part(resource_set, options, beat)

    def apply(resource_set, source, pending, batch_size, counts):
        steps.append(("written", [row.object_pk for row in pending]))
        return real_apply(resource_set, source, pending, batch_size, counts)

    def broker_down(*args, **kwargs):
        raise ConnectionError("no broker")

    monkeypatch.setitem(sharing._KINDS, processing.PREPARE, part)
    monkeypatch.setattr(processing, "_apply", apply)
    monkeypatch.setattr(sharing.current_app.tasks[sharing.SHARE_JOB], "delay", broker_down)
    counts = tracking.process_pending(["metadata"], batch_size=3, parallel=True)
    merged = []  # the writing of one batch into each set of the source, as one step
    for kind, step_keys in steps:
        if merged and merged[-1][0] == kind == "written":
            merged[-1][1].update(step_keys)
        else:
            merged.append((kind, set(step_keys)))
    batches = [{str(key) for key in keys[start : start + 3]} for start in range(0, 9, 3)]
    assert merged == [step for batch in batches for step in (("described", batch), ("written", batch))]
    assert counts.updated == 9 and "could not be offered to the workers" in caplog.text
    assert not SharedPart.objects.exists() and not processing.PreparedEntry.objects.exists()
    assert updated_keys(metadata) == sorted(str(key) for key in keys)
