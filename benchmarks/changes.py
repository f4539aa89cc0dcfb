"""Benchmark: change tracking on the example project.

Run from the repository root::

    .venv/bin/python benchmarks/changes.py                       # SQLite, 100,000 items
    .venv/bin/python benchmarks/changes.py --items 20000         # a quicker run
    .venv/bin/python benchmarks/changes.py --database-url postgres://postgres:postgres@127.0.0.1:5432/bench_changes

One run seeds the demo repository (``Item`` rows with their ``ItemFile`` files, the content the
``seed_repository`` command gives item number n, 64-byte files) into a fresh database: SQLite in a
temporary ``EXAMPLE_VAR_DIR``, or the PostgreSQL database named by ``--database-url``, which the
script drops and creates (and drops again at the end unless ``--keep``). Files and documents live
in the temporary directory in both cases. Both sets of the demo (``bitstreams``: the files;
``metadata``: a Dublin Core record per item, rendered by the site's own view) are then baselined
with ``tracking.reconcile``, which records them silently and starts their change logs. It then
measures:

1. ``save()`` of an ``Item`` (the title changes; each save in its own autocommit transaction)
   with change tracking connected, against the same model with its two receivers disconnected
   (``post_save``/``post_delete``, dispatch_uid ``resourcesync_track_repository.item_save`` /
   ``_delete``): the untracked twin is the same table and fields. Blocks of saves alternate
   between the two (ABBA order) to cancel drift. First in the production configuration, with a
   real Celery broker (``CELERY_BROKER_URL`` set for the child, so tasks are queued on Redis and
   nothing consumes them; the queue is purged afterwards): the dispatcher thread of
   ``django_resourcesync.tracking.outbox`` writes the pending changes (not on SQLite, where the save's
   thread does) and queues the tasks, and each timed block ends with ``dispatcher.flush()``, so
   that the thread's work is counted in the block. Then with tasks run in process (eager, the
   demo's default), where each save also processes its changes inline, and last in the broker
   configuration again with each save alone in ``transaction.atomic()`` (the save and its
   pending change then commit together). Each pair of blocks is a round: the ratio of each
   round, and their median, which the target takes; beside it the CPU seconds of the process
   (all its threads, so the dispatcher's work too). ``--saves-only`` runs seed, baseline and the
   two broker lines of this step alone.
2. Events per second through the bulk API: ``Item.objects.filter(pk range).update(title=...)``
   for 50,000 items (not timed), then, timed, ``tracking.changed(queryset)`` followed by
   ``tracking.process_pending()`` (broker configuration, so ``changed()`` only records); the
   events are the ChangeEvent rows written. Then a bulk deletion of 20,000 other items:
   ``with tracking.paused(): Item.objects.filter(pk range).delete()`` (timed apart, not part of
   the rate), then, timed, ``tracking.changed(model=Item, pks=...)``,
   ``tracking.changed(model=ItemFile, pks=...)`` (the files went with their items; the item pks
   alone no longer lead to them) and ``tracking.process_pending()``.
3. ``tracking.reconcile`` of each set with 1% changed behind the app's back: the titles of 1% of
   the items by ``queryset.update()`` (no signal; the ``metadata`` fingerprint covers the
   title), and for ``bitstreams``, whose fingerprint covers the file's name and size, 1% of the files
   rewritten on disk with different bytes and a different length (64 -> 80 bytes; ``modified``
   not touched). Seconds and the events found.
4. Serving a 50,000-entry Change List: the bulk update of step 2 fills the ``metadata`` set's
   open list with exactly 50,000 events (``MAX_ENTRIES_PER_DOCUMENT``; a list closes when the
   next event comes). Timed: GET ``/resourcesync/metadata/changelist.xml`` through Django's test
   ``Client`` (rendered live from the database), median of several repetitions, and a
   conditional GET with ``If-None-Match`` (304). Then one more change closes that list, which is
   written into storage (timed as well), and the closed list is served from storage
   (``changelist/1.xml``), along with the Change List Index that ``changelist.xml`` becomes.

5. Updated rendered records, with and without the batch render hook: ``queryset.update()`` of
   the titles of 10,000 items (``--render``; not timed), ``tracking.changed(queryset)`` (timed
   apart), then, timed, ``tracking.process_pending(["metadata"])``: each record rendered again,
   hashed, its row and its event written. With the hook, ``MetadataRecordSource.contents()``
   renders a batch's records at once (the items in one query, the record's template, no request
   handling); without, the child sets ``contents`` back to ``ResourceSource.contents`` and each
   record goes through ``content()`` (a GET through the site's middleware and view). Rounds
   alternate (with, without; without, with: ``--render-rounds``, default 2) on the same items,
   each round appending to the titles; a few records of each are checked against the bytes the
   view serves. The pending changes the other sources tracking ``Item`` got are discarded.
   ``--render-only`` runs seed, baseline and this step alone.

6. Updated rendered records on real Celery workers, PostgreSQL only (``--database-url``): the
   target of 5,000 records a second, end to end, with 2 workers. ``celery -A example_project
   worker --pool=solo`` processes on the broker (``parallel_build.py``'s ``Workers``), 1 or 2,
   started before each run and stopped after it. A run: ``queryset.update()`` of the titles of
   ``--worker-items`` items (default min(50,000, the items there are); not timed), a wait (up to
   ``--load-wait`` s, 600) for the 1-minute load average to fall below ``--max-load`` (0.5), then
   ``tracking.changed(model=Item, pks=...)`` in ``transaction.atomic()``, with the pending rows
   the ``pages`` and ``bitstreams`` sources got deleted before the commit (the ``metadata`` set
   is measured). The commit hands ``resourcesync.process_changes`` to the outbox's dispatcher
   thread, which queues it; the worker that runs it (``process_pending(parallel=True)``) records
   the objects in parts of ``PREPARE_PART`` keys (``sharing``: one ``resourcesync.share_job``
   task per part but its own), which every free worker describes ahead (``SetWriter.prepare``,
   ``PreparedEntry`` rows), then writes the events in order from them. Timed: from the end of
   the commit until the set has an event for each item (``ChangeEvent`` count polled every
   100 ms, along with the prepared entries and the shared parts: which process did which part).
   ``--worker-rounds`` rounds (3), each one run with 1 worker and one with 2, alternating; the
   median of each. Checks per run: exactly one new ``updated`` event per item, the sha-256 of a
   few records (their row and their event) equal to that of the bytes the view serves, nothing
   left pending or prepared, and the workers' logs (tasks run, lines of trouble). For
   comparison, in process (no worker): ``process_pending(["metadata"], parallel=False)`` and
   ``parallel=True`` (the parts offered on the broker, where nothing takes them, and done by
   the job's own process, as a lone worker does) on ``--worker-profile-items`` items (10,000),
   with how many objects the writing found prepared; under cProfile too with ``--profile``
   (``--worker-profile-items 0`` leaves it out). ``--analyze-pending``, a diagnostic, runs
   ``ANALYZE`` on the pending changes' table before each commit.
   ``--py-spy PATH`` adds a run with 1 worker and one with 2, each worker sampled by py-spy,
   and prints where its time goes. ``--workers-only`` runs seed, a baseline of the ``metadata``
   set alone (the other sets disabled) and this step.

The steps run in this order: seed, baseline, 2 (update), 4 (open list), close, 4 (closed list),
3, 2 (delete), 1, 5, 6; the report prints them in the numbered order. Every step runs in its own child
process (this script re-run with the hidden ``--child`` option). Nothing is asserted: the script
prints figures, ratios and the targets (save at most 1.5x its untracked twin; at least 50,000
events/s; a reconcile of 100,000 resources under 10 s; a 50,000-entry Change List served in under
0.5 s; 5,000 updated rendered records/s with 2 workers). ``--profile`` additionally runs
cProfile over a repeat of the bulk update (5,000 items), a bulk deletion (as many items, with their
files) and a reconcile of the ``bitstreams`` set, and prints the top functions.

On PostgreSQL, ``--pg-jit off`` turns JIT compilation off for the children's sessions
(``PGOPTIONS=-c jit=off``). Change tracking no longer issues the ``UPDATE ... CASE WHEN``
statements of Django's ``bulk_update`` (which JIT compilation made take minutes per batch), so
the server's setting is the default.
"""

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _steps
from _steps import add_child_arguments, database_name, progress, purge_broker, recreate_database, run_as_child

DEFAULT_BROKER = "redis://127.0.0.1:6379/14"

TARGET_SAVE_RATIO = 1.5
TARGET_EVENTS_PER_S = 50_000
TARGET_RECONCILE_S = 10.0
TARGET_SERVE_S = 0.5
TARGET_WORKER_RECORDS_PER_S = 5_000


# --------------------------------------------------------------------------------------------
# Children: each runs one step in a fresh interpreter and writes a JSON result file.
# ``cfg`` is {"var_dir", "database_url", "broker_url"}; a broker_url of None means eager tasks.


def setup_django(cfg):
    # PGOPTIONS: libpq's options for every PostgreSQL session (--pg-jit off)
    _steps.setup_django_example(cfg["var_dir"], cfg["database_url"], cfg["broker_url"],
                                environ={"PGOPTIONS": cfg.get("pgoptions")})
    from celery import current_app
    from django.conf import settings

    # Without a broker, tasks run in the calling process (the demo's settings leave that to the
    # embedded mode, which processes on a thread: not what the steps without a broker measure).
    current_app.conf.task_always_eager = not cfg["broker_url"]
    if cfg.get("max_entries"):  # --max-entries: lists close sooner, for quick runs
        from django_resourcesync.conf import app_settings

        settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": cfg["max_entries"]}
        app_settings.reload()


def event_counts():
    """ChangeEvent rows per set slug."""
    from django.db.models import Count

    from django_resourcesync.models import ChangeEvent

    rows = ChangeEvent.objects.values_list("resource_set__slug").annotate(n=Count("id"))
    return {slug: n for slug, n in rows}


def events_written(before, after):
    return {slug: after.get(slug, 0) - before.get(slug, 0) for slug in sorted(set(before) | set(after))}


def counts_dict(counts):
    return {name: getattr(counts, name) for name in ("created", "updated", "deleted", "unchanged", "skipped")}


def item_pks():
    from example_project.repository.models import Item

    return list(Item.objects.order_by("pk").values_list("pk", flat=True))


def child_seed(cfg, n, file_size):
    """Migrate a fresh database and add N public items with their files (not a measurement).

    The ``seed_repository`` command's items, added without telling change tracking: the
    baseline reconcile records everything anyway."""
    setup_django(cfg)
    from django.core.management import call_command
    from django.db import connection

    from example_project.repository.management.commands.seed_repository import add_items
    from example_project.repository.models import Item, ItemFile

    call_command("migrate", verbosity=0, interactive=False)
    started = time.perf_counter()
    add_items(n, file_size=file_size, track=False)
    jit = None
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SHOW jit")
            jit = cursor.fetchone()[0]
    return {
        "seconds": time.perf_counter() - started,
        "items": Item.objects.count(),
        "files": ItemFile.objects.count(),
        "jit": jit,
        "vendor": connection.vendor,
        "db_version": ".".join(map(str, connection.get_database_version())),
        "django": __import__("django").get_version(),
    }


def child_baseline(cfg, only=None):
    """First reconcile of each set: records its resources silently and opens its change log.
    ``only``: the slugs of the sets to keep; the others are disabled, not reconciled."""
    setup_django(cfg)
    from django_resourcesync import tracking
    from django_resourcesync.models import ChangeList, Resource, ResourceSet

    result = {}
    if only:
        ResourceSet.objects.exclude(slug__in=only).update(enabled=False)
    for resource_set in ResourceSet.objects.filter(enabled=True).order_by("pk"):
        started = time.perf_counter()
        counts = tracking.reconcile(resource_set)
        result[resource_set.slug] = {
            "seconds": time.perf_counter() - started,
            "counts": counts_dict(counts),
            "resources": Resource.objects.filter(resource_set=resource_set).count(),
            "open_lists": ChangeList.objects.filter(resource_set=resource_set, until__isnull=True).count(),
        }
    return result


def timed_changes(record):
    """Time ``record()`` (calls of the bulk API), then ``tracking.process_pending()``."""
    from django_resourcesync import tracking
    from django_resourcesync.models import PendingChange

    before = event_counts()
    started = time.perf_counter()
    recorded = record()
    changed_seconds = time.perf_counter() - started
    pending = PendingChange.objects.count()
    started = time.perf_counter()
    counts = tracking.process_pending()
    return {
        "changed_seconds": changed_seconds,
        "process_seconds": time.perf_counter() - started,
        "recorded": recorded,
        "pending": pending,
        "counts": counts_dict(counts),
        "events": events_written(before, event_counts()),
        "left_pending": PendingChange.objects.count(),
    }


def child_bulk_update(cfg, n):
    """Step 2: queryset.update() of n items (not timed), then changed() + process_pending() (timed)."""
    setup_django(cfg)
    from django.db.models import F, Value
    from django.db.models.functions import Concat

    from django_resourcesync import tracking
    from example_project.repository.models import Item

    pks = item_pks()[:n]
    queryset = Item.objects.filter(pk__gte=pks[0], pk__lte=pks[-1])
    started = time.perf_counter()
    updated = queryset.update(title=Concat(F("title"), Value(" (revised)")))
    update_seconds = time.perf_counter() - started

    return {"items": updated, "update_seconds": update_seconds, **timed_changes(lambda: tracking.changed(queryset))}


def child_render(cfg, n, hook, round_number):
    """Step 5: updated rendered records, with or without the batch render hook. ``queryset.update()``
    of n titles (not timed), ``tracking.changed()`` (timed apart), then, timed, processing of the
    ``metadata`` source's pending changes: each record rendered again and hashed, its row and its
    event written. With ``hook``, ``MetadataRecordSource.contents()`` renders each batch's records
    at once; without, each goes through ``content()``, the site's request handling. The pending
    changes the other sources tracking ``Item`` got (the ``pages`` and ``bitstreams`` sets) are
    discarded: they are not measured, and a benchmark's pages set may be left stale."""
    setup_django(cfg)
    import hashlib

    from django.db.models import F, Value
    from django.db.models.functions import Concat

    from django_resourcesync import tracking
    from django_resourcesync.models import PendingChange, Resource
    from django_resourcesync.rendering import render_location
    from django_resourcesync.sources import ResourceSource
    from example_project.repository.models import Item
    from example_project.repository.resourcesync import MetadataRecordSource

    calls = []
    if hook:
        real = MetadataRecordSource.contents

        def counting(self, objects):
            calls.append(len(objects))
            return real(self, objects)

        MetadataRecordSource.contents = counting
    else:
        MetadataRecordSource.contents = ResourceSource.contents  # the per-object way: content()

    pks = item_pks()[:n]
    queryset = Item.objects.filter(pk__gte=pks[0], pk__lte=pks[-1])
    queryset.update(title=Concat(F("title"), Value(f" (render {round_number})")))
    PendingChange.objects.all().delete()  # nothing left over from an earlier step is timed
    started = time.perf_counter()
    recorded = tracking.changed(queryset)
    changed_seconds = time.perf_counter() - started
    PendingChange.objects.exclude(source="metadata").delete()
    pending = PendingChange.objects.count()
    # Both ways warmed up alike (the URLconf imported, the middleware loaded, the template
    # compiled): one record through the view, not timed.
    render_location(Item.objects.get(pk=pks[-1]).get_metadata_url())
    before = event_counts()
    started = time.perf_counter()
    counts = tracking.process_pending(["metadata"])
    process_seconds = time.perf_counter() - started
    # What was published is what the view serves (a few records, checked through the view).
    checked = 0
    for pk in pks[:: max(1, len(pks) // 5)]:
        item = Item.objects.get(pk=pk)
        body, _type = render_location(item.get_metadata_url())
        row = Resource.objects.get(resource_set__slug="metadata", object_pk=str(pk))
        assert row.sha256 == hashlib.sha256(body).hexdigest() and row.length == len(body), pk
        checked += 1
    return {
        "hook": hook,
        "items": len(pks),
        "recorded": recorded,
        "pending": pending,
        "changed_seconds": changed_seconds,
        "process_seconds": process_seconds,
        "counts": counts_dict(counts),
        "events": events_written(before, event_counts()).get("metadata", 0),
        "hook_calls": calls,
        "checked": checked,
    }


def child_bulk_delete(cfg, n):
    """Step 2: delete the last n items (with their files) with tracking paused, then changed()
    for the items and the files + process_pending() (timed)."""
    setup_django(cfg)
    from django_resourcesync import tracking
    from example_project.repository.models import Item, ItemFile

    pks = item_pks()[-n:]
    queryset = Item.objects.filter(pk__gte=pks[0], pk__lte=pks[-1])
    file_pks = list(ItemFile.objects.filter(item__in=queryset).values_list("pk", flat=True))
    started = time.perf_counter()
    with tracking.paused():
        deleted, by_model = queryset.delete()
    delete_seconds = time.perf_counter() - started

    return {
        "items": len(pks),
        "files": len(file_pks),
        "deleted_rows": by_model,
        "delete_seconds": delete_seconds,
        **timed_changes(lambda: tracking.changed(model=Item, pks=pks) + tracking.changed(model=ItemFile, pks=file_pks)),
    }


def child_reconcile(cfg, fraction, file_size):
    """Step 3: change a fraction of items (title) and files (bytes) behind the app's back, then
    time tracking.reconcile of each set."""
    setup_django(cfg)
    from django.db.models import F, Value
    from django.db.models.functions import Concat

    from django_resourcesync import tracking
    from django_resourcesync.models import Resource, ResourceSet
    from example_project.repository.models import Item, ItemFile

    step = round(1 / fraction)
    items = item_pks()[::step]
    for start in range(0, len(items), 5000):
        Item.objects.filter(pk__in=items[start : start + 5000]).update(title=Concat(F("title"), Value(" (corrected)")))
    files = list(ItemFile.objects.order_by("pk").values_list("pk", flat=True))[::step]
    new_size = file_size + 16
    for start in range(0, len(files), 5000):
        for row in ItemFile.objects.filter(pk__in=files[start : start + 5000]):
            path = row.file.path
            data = (f"Rewritten file {row.pk}.\n".encode() * (new_size // 8 + 1))[:new_size]
            with open(path, "wb") as fh:
                fh.write(data)

    result = {"items_changed": len(items), "files_changed": len(files), "new_size": new_size}
    for slug in ("metadata", "bitstreams"):
        resource_set = ResourceSet.objects.get(slug=slug)
        resources = Resource.objects.filter(resource_set=resource_set).count()
        before = event_counts()
        started = time.perf_counter()
        counts = tracking.reconcile(resource_set)
        seconds = time.perf_counter() - started
        result[slug] = {
            "seconds": seconds,
            "resources": resources,
            "counts": counts_dict(counts),
            "events": events_written(before, event_counts()).get(slug, 0),
        }
    return result


def _get(client, path, **headers):
    """GET through the test client, reading the whole body; returns (seconds, response, body)."""
    started = time.perf_counter()
    response = client.get(path, headers=headers)
    # Reading streaming_content to the end closes the response, as a WSGI server would (the
    # test client closes a non-streaming one itself).
    body = b"".join(response.streaming_content) if response.streaming else response.content
    return time.perf_counter() - started, response, body


def _serve(client, path, reps):
    """Time ``reps`` full GETs and ``reps`` conditional GETs (If-None-Match) of ``path``."""
    first_seconds, response, body = _get(client, path)
    full = [first_seconds] + [_get(client, path)[0] for _ in range(reps - 1)]
    etag = response["ETag"]
    conditional = []
    status_304 = None
    for _ in range(reps):
        seconds, r304, _body = _get(client, path, if_none_match=etag)
        conditional.append(seconds)
        status_304 = r304.status_code
    return {
        "path": path,
        "status": response.status_code,
        "streaming": response.streaming,
        "bytes": len(body),
        "entries": body.count(b"<url>"),
        "sitemaps": body.count(b"<sitemap>"),
        "full": full,
        "conditional": conditional,
        "status_conditional": status_304,
    }


def child_serve_open(cfg, reps):
    """Step 4: the open Change List of the metadata set, rendered live on every GET."""
    setup_django(cfg)
    from django.test import Client

    from django_resourcesync.models import ChangeList

    open_list = ChangeList.objects.get(resource_set__slug="metadata", until__isnull=True)
    result = _serve(Client(), "/resourcesync/metadata/changelist.xml", reps)
    lists = ChangeList.objects.filter(resource_set__slug="metadata").count()
    result.update(number=open_list.number, list_entries=open_list.entries, lists=lists)
    return result


def child_close(cfg):
    """One more change after a full open list: its event closes the list (written to storage)."""
    setup_django(cfg)
    from django_resourcesync import tracking
    from django_resourcesync.models import ChangeList
    from example_project.repository.models import Item

    full = ChangeList.objects.get(resource_set__slug="metadata", until__isnull=True)
    item = Item.objects.order_by("-pk").first()
    Item.objects.filter(pk=item.pk).update(title=item.title + " (closing)")
    started = time.perf_counter()
    tracking.changed(Item.objects.filter(pk=item.pk))
    counts = tracking.process_pending()
    seconds = time.perf_counter() - started
    full.refresh_from_db()
    return {
        "seconds": seconds,
        "counts": counts_dict(counts),
        "number": full.number,
        "entries": full.entries,
        "closed": full.until is not None,
        "size": full.size,
        "lists": ChangeList.objects.filter(resource_set__slug="metadata").count(),
    }


def child_serve_closed(cfg, reps, number):
    """Step 4: the closed list from storage, and the Change List Index."""
    setup_django(cfg)
    from django.test import Client

    client = Client()
    return {
        "closed": _serve(client, f"/resourcesync/metadata/changelist/{number}.xml", reps),
        "index": _serve(client, "/resourcesync/metadata/changelist.xml", reps),
    }


def child_saves(cfg, saves, block, atomic):
    """Step 1: alternating blocks of tracked and untracked saves of the same Item model."""
    setup_django(cfg)
    from django.db import transaction
    from django.db.models.signals import post_delete, post_save

    from django_resourcesync.models import PendingChange
    from django_resourcesync.tracking import outbox
    from django_resourcesync.tracking import receivers as signals
    from example_project.repository.models import Item

    uid = f"resourcesync_track_{Item._meta.label_lower}"
    items = list(Item.objects.order_by("pk")[:200])
    before_events = event_counts()
    last_pending = PendingChange.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    counter = [0]

    cpu = {"tracked": [], "untracked": []}  # CPU seconds of the process (all its threads) per block

    def run_block(n, mode=None):
        started, started_cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            i = counter[0]
            counter[0] += 1
            item = items[i % len(items)]
            item.title = f"Saved title {i}"
            if atomic:
                with transaction.atomic():
                    item.save()
            else:
                item.save()
        # What the dispatcher thread still holds is part of the block's cost (a no-op untracked).
        outbox.dispatcher.flush()
        if mode:
            cpu[mode].append(time.process_time() - started_cpu)
        return time.perf_counter() - started

    def receivers():
        keys = [key for signal in (post_save, post_delete) for key, *_rest in signal.receivers]
        return sum(key[0] in (uid + "_save", uid + "_delete") for key in keys)

    def untracked():
        post_save.disconnect(signals.object_changed, sender=Item, dispatch_uid=uid + "_save")
        post_delete.disconnect(signals.object_changed, sender=Item, dispatch_uid=uid + "_delete")
        assert receivers() == 0, "the tracking receivers of Item are still connected"

    def tracked():
        signals.connect_tracked_models()
        assert receivers() == 2, "the tracking receivers of Item are not connected"

    # Warm up both (the first task publish opens the broker connection).
    tracked()
    run_block(20)
    untracked()
    run_block(20)
    tracked()
    warm_pending = PendingChange.objects.count()

    times = {"tracked": [], "untracked": []}
    rounds = max(1, saves // block)
    for r in range(rounds):
        order = ("tracked", "untracked") if r % 2 == 0 else ("untracked", "tracked")
        for mode in order:
            (tracked if mode == "tracked" else untracked)()
            times[mode].append(run_block(block, mode))
    tracked()
    pending = PendingChange.objects.count() - warm_pending
    result = {
        "saves_each": rounds * block,
        "block": block,
        "atomic": atomic,
        "tracked_blocks": times["tracked"],
        "untracked_blocks": times["untracked"],
        "tracked_cpu": cpu["tracked"],
        "untracked_cpu": cpu["untracked"],
        "pending_rows": pending,
        "events": events_written(before_events, event_counts()),
    }
    if cfg["broker_url"]:
        # Nothing consumes the queue: the pending rows this run wrote are discarded (the parent
        # purges the broker's queue), so that later steps do not process them.
        PendingChange.objects.filter(pk__gt=last_pending).delete()
        try:
            import redis

            result["queued_tasks"] = redis.Redis.from_url(cfg["broker_url"]).llen("celery")
        except Exception as exc:  # the count is informative only
            result["queued_tasks"] = f"? ({exc})"
    return result


def child_profile(cfg, n, top):
    """cProfile of a repeat of step 2 (n items, changed + process_pending), and of a reconcile
    of the bitstreams set (the larger one) with nothing changed."""
    import cProfile
    import io
    import pstats

    setup_django(cfg)
    from django.db.models import F, Value
    from django.db.models.functions import Concat

    from django_resourcesync import tracking
    from django_resourcesync.models import ResourceSet
    from example_project.repository.models import Item, ItemFile

    pks = item_pks()[:n]
    queryset = Item.objects.filter(pk__gte=pks[0], pk__lte=pks[-1])
    queryset.update(title=Concat(F("title"), Value(" (profiled)")))

    def bulk():
        tracking.changed(queryset)
        tracking.process_pending()

    gone = item_pks()[-n:]
    gone_files = list(ItemFile.objects.filter(item_id__in=gone).values_list("pk", flat=True))
    with tracking.paused():
        Item.objects.filter(pk__in=gone).delete()

    def bulk_delete():
        tracking.changed(model=Item, pks=gone)
        tracking.changed(model=ItemFile, pks=gone_files)
        tracking.process_pending()

    report = {}
    for name, func in (
        ("bulk", bulk),
        ("bulk_delete", bulk_delete),
        ("reconcile", lambda: tracking.reconcile(ResourceSet.objects.get(slug="bitstreams"))),
    ):
        profiler = cProfile.Profile()
        started = time.perf_counter()
        profiler.runcall(func)
        seconds = time.perf_counter() - started
        out = {"seconds": seconds}
        for key in ("cumulative", "tottime"):
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).strip_dirs().sort_stats(key).print_stats(top)
            out[key] = text.getvalue()
        report[name] = out
    return report


# -- step 6: the rendered records on real Celery workers --------------------------------------


def wait_for_quiet(max_load, max_wait):
    """Wait, up to ``max_wait`` seconds, for the 1-minute load average to fall below
    ``max_load`` (other benchmarks may be running); returns what was seen."""
    started = time.monotonic()
    first = load = os.getloadavg()[0]
    while load >= max_load and time.monotonic() - started < max_wait:
        time.sleep(5)
        load = os.getloadavg()[0]
    return {"load": load, "first_load": first, "waited": time.monotonic() - started, "quiet": load < max_load}


def record_metadata_changes(pks, analyze=False):
    """``tracking.changed(model=Item, pks=pks)`` in a transaction that commits: the commit hands
    the ``resourcesync.process_changes`` task to the outbox's dispatcher thread, which queues
    it. Only the ``metadata`` source's pending changes are measured: those the ``pages`` and
    ``bitstreams`` sources got for the same items are deleted before the commit. With
    ``analyze`` (a diagnostic), the pending changes' table is analyzed before the commit, so that
    the planner knows how many rows it holds. Returns ``(recorded, dropped, changed() seconds,
    seconds to the end of the commit)``."""
    from django.db import connection, transaction

    from django_resourcesync import tracking
    from django_resourcesync.models import PendingChange
    from example_project.repository.models import Item

    started = time.perf_counter()
    with transaction.atomic():
        recorded = tracking.changed(model=Item, pks=pks)
        changed_seconds = time.perf_counter() - started
        dropped = PendingChange.objects.exclude(source="metadata").delete()[0]
        if analyze:
            with connection.cursor() as cursor:
                cursor.execute(f"ANALYZE {PendingChange._meta.db_table}")
    return recorded, dropped, changed_seconds, time.perf_counter() - started


def update_titles(pks, label):
    """``queryset.update()`` of the titles of the items ``pks`` (ascending keys): no signal."""
    from django.db.models import F, Value
    from django.db.models.functions import Concat

    from example_project.repository.models import Item

    queryset = Item.objects.all()
    if len(pks) < Item.objects.count():
        queryset = queryset.filter(pk__gte=pks[0], pk__lte=pks[-1])
    return queryset.update(title=Concat(F("title"), Value(f" ({label})")))


def check_events(resource_set, after, pks, sample=5):
    """Every item of ``pks`` has exactly one event after the event id ``after``, ``updated``,
    and a few records (their row and their event) have the sha-256 of the bytes the view serves."""
    import hashlib
    from collections import Counter

    from django_resourcesync.models import ChangeEvent, Resource
    from django_resourcesync.rendering import render_location
    from example_project.repository.models import Item

    events = ChangeEvent.objects.filter(resource_set=resource_set, id__gt=after)
    rows = list(events.values_list("object_pk", "change"))
    per_item = Counter(key for key, _change in rows)
    wanted = {str(pk) for pk in pks}
    checked, mismatched = 0, []
    for pk in pks[:: max(1, len(pks) // sample)][:sample]:
        body, _type = render_location(Item.objects.get(pk=pk).get_metadata_url())
        digest = hashlib.sha256(body).hexdigest()
        row = Resource.objects.get(resource_set=resource_set, object_pk=str(pk))
        event = events.filter(object_pk=str(pk)).values_list("sha256", flat=True).first()
        checked += 1
        if not (row.sha256 == digest == event and row.length == len(body)):
            mismatched.append(pk)
    return {
        "events": len(rows),
        "changes": dict(Counter(change for _key, change in rows)),
        "items_with_one": sum(1 for key in wanted if per_item.get(key) == 1),
        "items_without": sum(1 for key in wanted if key not in per_item),
        "items_with_more": sum(1 for key in wanted if per_item.get(key, 0) > 1),
        "others": sum(1 for key in per_item if key not in wanted),
        "hash_checked": checked,
        "hash_mismatched": mismatched,
    }


def cpu_seconds(pids):
    """``{pid: user + system CPU seconds}`` of live processes, and ``"machine"``: the CPU seconds
    every core spent busy (``/proc/stat``), ``"self"``: this process's."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            found[str(pid)] = (int(fields[11]) + int(fields[12])) / ticks
        except OSError:
            pass
    with open("/proc/stat") as stat:
        cpu = [int(value) for value in stat.readline().split()[1:]]
    found["machine"] = (sum(cpu[:8]) - cpu[3] - cpu[4]) / ticks  # all but idle and iowait
    times = os.times()
    found["self"] = times.user + times.system
    return found


class PostgresCPU:
    """The CPU seconds of the PostgreSQL server's processes (on this machine) over a run, by
    kind: the backends (the connections of the workers, of this poller), autovacuum, the WAL
    writer, the checkpointer and the others. Sampled at each poll: a process seen once counts
    from its first sample (a backend that lives less than a poll is missed)."""

    def __init__(self, connection):
        self.ticks = os.sysconf("SC_CLK_TCK")
        self.seen = {}  # pid: [kind, first, last]
        self.postmaster = None
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                backend = cursor.fetchone()[0]
            with open(f"/proc/{backend}/stat") as stat:
                self.postmaster = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            pass  # the server is elsewhere: nothing to sample

    def sample(self):
        if self.postmaster is None:
            return
        try:
            with open(f"/proc/{self.postmaster}/task/{self.postmaster}/children") as children:
                pids = children.read().split()
        except OSError:
            return
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                cpu = (int(fields[11]) + int(fields[12])) / self.ticks
                if pid not in self.seen:
                    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                        title = cmdline.read().decode(errors="replace").strip("\0")
                    self.seen[pid] = [self.kind(title), cpu, cpu]
                self.seen[pid][2] = cpu
            except OSError:
                continue

    @staticmethod
    def kind(title):
        for kind in ("autovacuum", "walwriter", "checkpointer", "background writer"):
            if kind in title:
                return kind
        return "backends" if "(" in title else "other"

    def summary(self):
        totals = {}
        for kind, first, last in self.seen.values():
            totals[kind] = totals.get(kind, 0.0) + last - first
        return totals


def child_workers(cfg, n, pids, run_number, max_load, max_wait, timeout, analyze=False):
    """Step 6, one run: the titles of n items by ``queryset.update()`` (not timed), then, once
    the load is low, ``tracking.changed(model=Item, pks=...)`` committed; timed from the end of
    the commit until the ``metadata`` set has an event for each of the n items, the workers
    (started by the parent) doing the work. The database is polled every 100 ms, in cheap queries
    (its own load shares the machine): the events (the entries of the set's lists), whether
    there are prepared entries (counted once a second) and the shared parts (which process
    holds which part)."""
    setup_django(cfg)
    from django.db import connection
    from django.db.models import Max, Sum

    from django_resourcesync.models import (
        ChangeEvent,
        ChangeList,
        PendingChange,
        PreparedEntry,
        Resource,
        ResourceSet,
        SharedPart,
    )
    from example_project.repository.models import Item

    metadata = ResourceSet.objects.get(slug="metadata")
    pks = item_pks()[:n]
    PendingChange.objects.all().delete()  # nothing left over from an earlier step is timed
    leftovers = {"prepared": PreparedEntry.objects.count(), "shared_parts": SharedPart.objects.count()}
    started = time.perf_counter()
    updated = update_titles(pks, f"workers {run_number}")
    update_seconds = time.perf_counter() - started
    # What autovacuum does between two bursts of changes on a server (this one may have it off):
    # the rows the earlier runs and the update left dead are cleared, the statistics current.
    started = time.perf_counter()
    with connection.cursor() as cursor:
        models = [ChangeEvent, ChangeList, PendingChange, PreparedEntry, SharedPart, Resource, Item]
        cursor.execute("VACUUM ANALYZE " + ", ".join(connection.ops.quote_name(model._meta.db_table) for model in models))
    vacuum_seconds = time.perf_counter() - started
    quiet = wait_for_quiet(max_load, max_wait)
    after = ChangeEvent.objects.filter(resource_set=metadata).aggregate(last=Max("id"))["last"] or 0
    # The events written, counted from their lists' entries (written in the same transaction as
    # the events; one row a list where counting the events reads each one of them).
    lists = ChangeList.objects.filter(resource_set=metadata)

    def events_count():
        return (lists.aggregate(entries=Sum("entries"))["entries"] or 0) - entries_before

    entries_before = 0
    entries_before = events_count()
    prepared_rows = PreparedEntry.objects.filter(resource_set=metadata)
    parts_rows = SharedPart.objects.filter(resource_set=metadata)
    recorded, dropped, changed_seconds, commit_seconds = record_metadata_changes(pks, analyze)
    committed = time.perf_counter()
    cpu_before = cpu_seconds(pids)

    marks = {}  # first time each thing was seen, seconds after the commit
    holders = {}  # part number -> "pid" of the process that did it
    prepared_max = parts_total = polls = 0
    timeline = []  # (seconds, events, prepared entries, parts done) every second or so
    written = 0
    seconds = None
    prepared = 0
    postgres = PostgresCPU(connection)
    postgres.sample()
    polling = 0.0  # seconds this poller spent in its queries (the database works for it meanwhile)
    while True:
        now = time.perf_counter() - committed
        asked = time.perf_counter()
        written = events_count()
        # Counted once a second (a count reads the whole table, rows of 1 KB): otherwise
        # only whether any is there yet.
        if not timeline or now - timeline[-1][0] >= 1.0:
            prepared = prepared_rows.count()
        elif not prepared:
            prepared = int(prepared_rows.exists())
        parts = list(parts_rows.values_list("number", "holder", "done"))
        polling += time.perf_counter() - asked
        postgres.sample()
        polls += 1
        parts_total = max(parts_total, len(parts))
        prepared_max = max(prepared_max, prepared)
        done = sum(1 for _number, _holder, finished in parts if finished)
        for number, holder, finished in parts:
            if holder:
                marks.setdefault("first_part_claimed", now)
            if finished and holder:
                holders[number] = holder.split(":")[1]
        if parts:
            marks.setdefault("parts_recorded", now)
            if done == len(parts):
                marks.setdefault("parts_done", now)
        elif "parts_recorded" in marks:
            marks.setdefault("parts_done", now)  # the job is over: its rows are gone
        if prepared:
            marks.setdefault("first_prepared", now)
        if written:
            marks.setdefault("first_event", now)
        if not timeline or now - timeline[-1][0] >= 1.0:
            timeline.append((round(now, 2), written, prepared, done))
        if written >= len(pks):
            seconds = now
            break
        if now > timeout:
            break
        time.sleep(0.1)
    cpu = {key: value - cpu_before.get(key, 0.0) for key, value in cpu_seconds(pids).items()}
    load_after = os.getloadavg()[0]
    # The task goes on after the last events: it settles the pending rows and deletes the
    # prepared entries. Wait for it (not timed) before checking.
    settle_started = time.perf_counter()
    while time.perf_counter() - settle_started < 120:
        if not (PendingChange.objects.filter(source="metadata").exists() or prepared_rows.exists() or parts_rows.exists()):
            break
        time.sleep(0.1)
    settled = time.perf_counter() - committed
    return {
        "workers": len(pids),
        "pids": [str(pid) for pid in pids],
        "run": run_number,
        "items": len(pks),
        "updated_rows": updated,
        "update_seconds": update_seconds,
        "vacuum_seconds": vacuum_seconds,
        "leftovers": leftovers,
        "recorded": recorded,
        "dropped": dropped,
        "changed_seconds": changed_seconds,
        "commit_seconds": commit_seconds,
        "quiet": quiet,
        "load_after": load_after,
        "seconds": seconds,
        "written": written,
        "timed_out": seconds is None,
        "settled_seconds": settled,
        "cpu": cpu,
        "marks": marks,
        "holders": holders,
        "parts_seen": parts_total,
        "prepared_max": prepared_max,
        "polls": polls,
        "polling_seconds": polling,
        "postgres_cpu": postgres.summary(),
        "timeline": timeline,
        "left": {
            "pending": PendingChange.objects.filter(source="metadata").count(),
            "prepared": prepared_rows.count(),
            "shared_parts": parts_rows.count(),
        },
        "check": check_events(metadata, after, pks),
    }


def child_workers_in_process(cfg, n, parallel, top, run_number, max_load, max_wait):
    """Step 6, for comparison: the same update of n items, processed in this process by
    ``tracking.process_pending(["metadata"], parallel=parallel)`` (what the task calls), with
    no worker running: with ``parallel``, the parts of the preparation are offered on the broker
    (nothing takes them) and done here by the job's own process, as a lone worker does. Timed
    once as it is, then (``top``) once more under cProfile. Counts how many objects the writing
    found prepared and how many it rendered itself."""
    setup_django(cfg)
    from collections import Counter

    from django.db.models import Max

    from django_resourcesync import tracking
    from django_resourcesync.models import ChangeEvent, PendingChange, ResourceSet
    from django_resourcesync.tracking import processing
    from django_resourcesync.tracking.writer import SetWriter

    stats = Counter()
    real_prepared, real_contents = SetWriter._prepared, SetWriter._batch_contents
    real_prepare_in_parts = processing.prepare_in_parts

    def counting_prepared(self, keys, fingerprints):
        found = real_prepared(self, keys, fingerprints)
        stats["write: asked for prepared"] += len(keys)
        stats["write: found prepared"] += len(found)
        return found

    def counting_contents(self, keys, objects, known, fingerprints):
        found = real_contents(self, keys, objects, known, fingerprints)
        stats["write: rendered" if self.record_events else "prepare: rendered"] += len(found)
        return found

    def timed_prepare(source, sets):
        started = time.perf_counter()
        try:
            return real_prepare_in_parts(source, sets)
        finally:
            stats["prepare_in_parts seconds"] += time.perf_counter() - started

    SetWriter._prepared, SetWriter._batch_contents = counting_prepared, counting_contents
    processing.prepare_in_parts = timed_prepare
    metadata = ResourceSet.objects.get(slug="metadata")
    pks = item_pks()[:n]
    result = {"parallel": parallel, "items": len(pks)}
    for mode in ("timed", "profiled") if top else ("timed",):
        stats.clear()
        PendingChange.objects.all().delete()
        update_titles(pks, f"in process {run_number} {mode}")
        after = ChangeEvent.objects.filter(resource_set=metadata).aggregate(last=Max("id"))["last"] or 0
        record_metadata_changes(pks)  # its task goes to the broker, and nothing takes it
        quiet = wait_for_quiet(max_load, max_wait) if mode == "timed" else None
        cpu_before = cpu_seconds([])
        started = time.perf_counter()
        if mode == "timed":
            counts = tracking.process_pending(["metadata"], parallel=parallel)
            result[mode] = {"counts": counts_dict(counts)}
        else:
            result[mode] = _steps.profiled(tracking.process_pending, ["metadata"], parallel=parallel, top=top)
        result[mode].update(
            seconds=time.perf_counter() - started,
            stats=dict(stats),
            quiet=quiet,
            cpu={key: value - cpu_before[key] for key, value in cpu_seconds([]).items()},
            events=ChangeEvent.objects.filter(resource_set=metadata, id__gt=after).count(),
        )
    return result


CHILDREN = {
    "seed": child_seed,
    "baseline": child_baseline,
    "bulk_update": child_bulk_update,
    "bulk_delete": child_bulk_delete,
    "reconcile": child_reconcile,
    "serve_open": child_serve_open,
    "close": child_close,
    "serve_closed": child_serve_closed,
    "saves": child_saves,
    "profile": child_profile,
    "render": child_render,
    "workers": child_workers,
    "workers_in_process": child_workers_in_process,
}


def run_child(role, result_dir, *args):
    started = time.perf_counter()
    result = _steps.run_child(__file__, role, result_dir, *args)
    progress(f"{role} done in {time.perf_counter() - started:.1f} s")
    return result


# --------------------------------------------------------------------------------------------
# Reporting


def rate(n, seconds):
    return n / seconds if seconds else float("inf")


def met(ok):
    return "met" if ok else "NOT met"


def total_events(events):
    return sum(events.values())


def report_saves(label, result):
    tracked = sum(result["tracked_blocks"]) / result["saves_each"] * 1e6
    untracked = sum(result["untracked_blocks"]) / result["saves_each"] * 1e6
    blocks_t = [t / result["block"] * 1e6 for t in result["tracked_blocks"]]
    blocks_u = [t / result["block"] * 1e6 for t in result["untracked_blocks"]]
    print(
        f"  {label:<40} tracked {tracked:>8,.0f} us/save   untracked twin {untracked:>6,.0f} us/save   "
        f"ratio {tracked / untracked:5.2f}x   "
        f"(block medians {statistics.median(blocks_t):,.0f} / {statistics.median(blocks_u):,.0f} us)"
    )
    # Each round is a tracked block and an untracked one, run one after the other: their ratio,
    # round by round, is what drift between rounds does not move.
    pairs = sorted(t / u for t, u in zip(result["tracked_blocks"], result["untracked_blocks"]))
    ratio = statistics.median(pairs)
    line = f"  {'':<40} paired rounds ({len(pairs)}): ratio median {ratio:.2f}x, min {pairs[0]:.2f}x, max {pairs[-1]:.2f}x"
    if result.get("tracked_cpu"):
        cpu_t = statistics.median(result["tracked_cpu"]) / result["block"] * 1e6
        cpu_u = statistics.median(result["untracked_cpu"]) / result["block"] * 1e6
        cpu_pairs = [t / u for t, u in zip(result["tracked_cpu"], result["untracked_cpu"])]
        line += (f"; CPU of the process's threads {cpu_t:,.0f} / {cpu_u:,.0f} us/save (block medians), "
                 f"paired ratio median {statistics.median(cpu_pairs):.2f}x")
    print(line)
    return ratio


def report_serve(label, served):
    full = statistics.median(served["full"])
    conditional = statistics.median(served["conditional"])
    what = f"{served['entries']:,} entries" if not served["sitemaps"] else f"{served['sitemaps']} <sitemap> entries"
    print(
        f"  {label:<44} {served['path']}: {served['status']}, {what}, {served['bytes'] / 2**20:.1f} MB"
        f"{' (streamed)' if served['streaming'] else ''}"
    )
    print(
        f"  {'':<44} GET median {full:.3f} s (min {min(served['full']):.3f}, max {max(served['full']):.3f}, "
        f"n={len(served['full'])});"
        f"  If-None-Match -> {served['status_conditional']}: median {conditional * 1000:.1f} ms"
    )
    return full


def header(seed, pgoptions):
    database = f"{seed['vendor']} {seed['db_version']}"
    if seed["jit"] is not None:
        database += f" (jit={seed['jit']}{', set by --pg-jit off' if pgoptions else ', the server setting'})"
    return (
        f"Change tracking benchmark, example project  (Python {platform.python_version()}, Django {seed['django']}, "
        f"{database}, {os.cpu_count()} CPUs)"
    )


def report_seed(options, seed, baseline):
    if options.workers_only:
        print("Only the 'metadata' set is reconciled and enabled (--workers-only): 'bitstreams' and 'pages' are disabled.")
    print(
        f"Seeded {seed['items']:,} items with {seed['files']:,} files of {options.file_size} bytes "
        f"in {seed['seconds']:.1f} s "
        f"(not timed). Each step in its own child process."
    )
    for slug, b in baseline.items():
        print(
            f"Baseline reconcile of '{slug}' (first reconcile: records silently, starts the log): "
            f"{b['resources']:,} resources in {b['seconds']:.1f} s ({rate(b['resources'], b['seconds']):,.0f}/s)"
        )


def run_renders(options, result_dir, broker, n):
    """Step 5: rounds alternating with and without the hook (ABBA), on the same n items."""
    renders = []
    for round_number in range(options.render_rounds):
        order = (True, False) if round_number % 2 == 0 else (False, True)
        for hook in order:
            renders.append(run_child("render", result_dir, broker, n, hook, len(renders) + 1))
            purge_broker(options.broker_url)
    return renders


def report_renders(renders):
    first = renders[0]
    print(f"5. Updated rendered records (the 'metadata' set): Item.objects.filter(pk range).update(title=...) of "
          f"{first['items']:,} items (not timed), tracking.changed() (timed apart), then, timed, "
          f"tracking.process_pending(['metadata']) (broker configuration); rounds alternate ABBA")
    best = {}
    for r in renders:
        label = "with the hook (contents())" if r["hook"] else "without (content(), request handling)"
        records_rate = rate(r["counts"]["updated"], r["process_seconds"])
        best.setdefault(r["hook"], []).append(records_rate)
        calls = f"{len(r['hook_calls'])} call(s) of {r['hook_calls']} objects" if r["hook"] else "no hook"
        print(f"  {label:<40} {r['counts']['updated']:,} updated in {r['process_seconds']:.2f} s  ->  "
              f"{records_rate:,.0f} records/s   (changed() {r['changed_seconds']:.2f} s; {r['events']:,} events; "
              f"{calls}; {r['checked']} records checked against the view)")
    with_hook, without = statistics.median(best[True]), statistics.median(best.get(False) or [float("nan")])
    print(f"  median: with the hook {with_hook:,.0f} records/s, without {without:,.0f} records/s  ->  "
          f"{with_hook / without:.1f}x")


# --------------------------------------------------------------------------------------------
# Step 6: the workers (real ``celery worker --pool=solo`` processes, parallel_build.py's)

TASK_LINE = re.compile(r"Task (resourcesync\.\w+)\[[^\]]+\] (succeeded|raised|retry)[^:]*?(?: in ([\d.]+)s)?: ?(.*)$")


def logged_workers(cfg, count, spy=None, spy_dir=None):
    """parallel_build.py's ``Workers`` (imported here: it imports this module), keeping every
    line each worker logs, and with ``spy`` (the py-spy executable) sampling each worker from
    the moment it is ready until it stops."""
    from parallel_build import Workers

    class LoggedWorkers(Workers):
        def __enter__(self):
            self.lines = {}
            self.spies = []
            super().__enter__()
            self.pids = [process.pid for process in self.processes]
            for pid in self.pids if spy else ():
                path = Path(spy_dir) / f"py-spy-{count}w-{pid}.txt"
                command = [spy, "record", "--pid", str(pid), "--rate", "100", "--format", "raw", "--function", "--idle",
                           "--nonblocking", "--output", str(path)]
                spied = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                self.spies.append((pid, path, spied))
            return self

        def _drain(self, process, ready):
            lines = self.lines.setdefault(process.pid, [])
            for line in process.stdout:
                lines.append(line.rstrip())
                if " ready." in line:
                    ready.set()
                if "ERROR" in line or "Traceback" in line:
                    print(f"  worker {process.pid}: {line.rstrip()}", file=sys.stderr)

        def __exit__(self, *exc_info):
            super().__exit__(*exc_info)
            self.profiles = {}
            for pid, path, spied in self.spies:
                try:
                    _out, err = spied.communicate(timeout=120)  # py-spy writes its file when the worker exits
                except subprocess.TimeoutExpired:
                    spied.terminate()
                    _out, err = spied.communicate()
                self.profiles[str(pid)] = str(path) if path.exists() else f"no profile: {err.strip()[-300:]}"
            return False

        def summary(self):
            """Per worker (by pid): the tasks it ran, their seconds and results, and the lines
            that tell of trouble."""
            found = {}
            for pid, lines in self.lines.items():
                tasks = []
                for line in lines:
                    match = TASK_LINE.search(line)
                    if match:
                        name, outcome, seconds, value = match.groups()
                        tasks.append((name.split(".")[-1], outcome, float(seconds or 0), value.strip()[:200]))
                trouble = [line for line in lines if any(word in line for word in ("ERROR", "WARNING", "Traceback", "CRITICAL"))]
                found[str(pid)] = {"tasks": tasks, "trouble": trouble[:20], "trouble_lines": len(trouble), "lines": len(lines)}
            return found

    return LoggedWorkers(cfg, count)


def spy_summary(path, top):
    """The py-spy samples of a worker (collapsed stacks, one ``frame;frame;... count`` a line)
    taken while it ran a task of ours, each stack cut at the task's own function
    (``process_pending`` or ``take_parts``): the functions with the most samples on top of the
    stack (self), anywhere in it (inclusive), and the self samples by file, as percentages."""
    self_counts, inclusive, by_file, total = {}, {}, {}, 0
    markers = ("process_pending (", "take_parts (")
    with open(path) as raw:
        for line in raw:
            stack, _space, count = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            start = next((index for index, frame in enumerate(frames) if frame.startswith(markers)), None)
            if start is None:
                continue  # the worker waiting for tasks, other threads
            frames = frames[start:]
            count = int(count)
            total += count
            self_counts[frames[-1]] = self_counts.get(frames[-1], 0) + count
            where = frames[-1].rpartition("(")[2].rpartition(":")[0] or frames[-1]
            by_file[where] = by_file.get(where, 0) + count
            for frame in set(frames):
                inclusive[frame] = inclusive.get(frame, 0) + count

    def best(counts):
        return [(frame, count / (total or 1) * 100) for frame, count in sorted(counts.items(), key=lambda item: -item[1])[:top]]

    return {"samples": total, "self": best(self_counts), "inclusive": best(inclusive), "files": best(by_file)}


def run_worker_steps(options, result_dir, broker, n):
    """Step 6: ``--worker-rounds`` runs with 1 worker and with 2, alternating (1, 2; 2, 1; ...),
    then the in-process comparison and, with ``--py-spy``, one more run of each sampled."""
    timeout = max(600, n / 50)
    runs = []

    def one_run(count, number, spy=None):
        with logged_workers(broker, count, spy=spy, spy_dir=result_dir) as workers:
            result = run_child("workers", result_dir, broker, n, workers.pids, number, options.max_load, options.load_wait,
                               timeout, options.analyze_pending)
        result["logs"] = workers.summary()
        result["profiles"] = getattr(workers, "profiles", {})
        purge_broker(options.broker_url)
        seconds = result["seconds"]
        progress(f"  {count} worker(s), run {number}: "
                 + (f"{seconds:.1f} s, {rate(n, seconds):,.0f} records/s" if seconds else f"TIMED OUT after {timeout:.0f} s")
                 + f" (load {result['quiet']['load']:.2f}, waited {result['quiet']['waited']:.0f} s)")
        return result

    for round_number in range(options.worker_rounds):
        for count in (1, 2) if round_number % 2 == 0 else (2, 1):
            runs.append(one_run(count, len(runs) + 1))
    in_process = []
    n_profile = min(n, options.worker_profile_items)
    for parallel in (False, True) if n_profile else ():
        in_process.append(run_child("workers_in_process", result_dir, broker, n_profile, parallel,
                                    options.top if options.profile else 0, len(in_process) + 1, options.max_load,
                                    options.load_wait))
        purge_broker(options.broker_url)
    spied = []
    if options.py_spy:
        for count in (1, 2):
            spied.append(one_run(count, len(runs) + len(spied) + 1, spy=options.py_spy))
            for pid, path in spied[-1]["profiles"].items():
                if not path.startswith("no profile"):
                    spied[-1]["profiles"][pid] = spy_summary(path, max(options.top, 30))
    return {"runs": runs, "in_process": in_process, "spied": spied, "items": n, "analyze": options.analyze_pending}


def worker_line(result):
    """One run: rate, time, load, phases, who did the parts, the checks."""
    n = result["items"]
    seconds = result["seconds"]
    quiet = result["quiet"]
    waited = f"waited {quiet['waited']:.0f} s (from {quiet['first_load']:.2f})" if quiet["waited"] >= 1 else "no wait"
    head = (f"{result['workers']} worker{'s' if result['workers'] > 1 else ' '} #{result['run']:<2} "
            + (f"{seconds:7.2f} s  {rate(n, seconds):>7,.0f} records/s" if seconds
               else f"TIMED OUT, {result['written']:,} events")
            + f"   load1 before {quiet['load']:.2f} ({waited}{'' if quiet['quiet'] else ', NOT below the limit'}), "
              f"after {result['load_after']:.2f}; VACUUM ANALYZE before {result.get('vacuum_seconds', 0):.1f} s (not timed)")
    marks = result["marks"]
    postgres_cpu = postgres_cpu_text(result)

    def at(name):
        return f"{marks[name]:.1f}" if name in marks else "-"

    pids = result["pids"]
    by_pid = {}
    for pid in result["holders"].values():
        by_pid[pid] = by_pid.get(pid, 0) + 1
    logs = result["logs"]
    parts = []
    for number, pid in enumerate(pids, 1):
        tasks = logs.get(pid, {}).get("tasks", [])
        processed = [t for t in tasks if t[0] == "process_changes"]
        shared = [t for t in tasks if t[0] == "share_job"]
        taken = sum(int(t[3]) for t in shared if t[1] == "succeeded" and t[3].isdigit())
        role = f"process_changes {processed[0][2]:.1f} s" if processed else "no process_changes"
        parts.append(f"worker {number}: {by_pid.get(pid, 0)} parts seen done ({role}; {len(shared)} share_job tasks, "
                     f"{taken} parts by them; CPU {result['cpu'].get(pid, 0):.1f} s)")
    cpu = result["cpu"]
    workers_cpu = sum(cpu.get(pid, 0) for pid in pids)
    check = result["check"]
    ok = (check["items_with_one"] == n and not check["items_without"] and not check["items_with_more"]
          and not check["others"] and check["changes"] == {"updated": n} and not check["hash_mismatched"])
    trouble = sum(logs.get(pid, {}).get("trouble_lines", 0) for pid in pids)
    lines = [
        "  " + head,
        f"      phases (s after the commit): parts recorded {at('parts_recorded')}, first claimed {at('first_part_claimed')}, "
        f"first prepared {at('first_prepared')}, parts done {at('parts_done')}, first event {at('first_event')}, "
        f"all events {seconds and f'{seconds:.1f}' or '-'}, task settled {result['settled_seconds']:.1f}; "
        f"{result['parts_seen']} parts, {result['prepared_max']:,} entries prepared at most",
        f"      {'; '.join(parts)}",
        f"      CPU in the run: workers {workers_cpu:.1f} s ({workers_cpu / n * 1000:.2f} ms a record: at most "
        f"{rate(n, workers_cpu) * result['workers']:,.0f} records/s on {result['workers']} busy core(s)), this poller "
        f"{cpu.get('self', 0):.1f} s (its {result['polls']} polls waited {result.get('polling_seconds', 0):.1f} s for the "
        f"database), PostgreSQL {postgres_cpu}, machine {cpu['machine']:.1f} s (of {os.cpu_count() * (seconds or 0):.1f} s on "
        f"{os.cpu_count()} cores; the rest: PostgreSQL, Redis, anything else)",
        f"      check: {check['events']:,} events {check['changes']}, {check['items_with_one']:,}/{n:,} items with exactly one, "
        f"{check['items_without']} without, {check['items_with_more']} with more, {check['others']} of other objects; "
        f"sha-256 of {check['hash_checked']} records = the view's bytes: "
        f"{'yes' if not check['hash_mismatched'] else 'NO ' + str(check['hash_mismatched'])}; left: {result['left']}"
        f"  -> {'OK' if ok else 'MISMATCH'}; worker log lines of trouble: {trouble}",
    ]
    for pid in pids:
        for line in logs.get(pid, {}).get("trouble", [])[:5]:
            lines.append(f"      worker {pids.index(pid) + 1}: {line[:300]}")
    return "\n".join(lines)


def postgres_cpu_text(result):
    found = result.get("postgres_cpu") or {}
    if not found:
        return "not sampled"
    return f"{sum(found.values()):.1f} s (" + ", ".join(f"{kind} {seconds:.1f}" for kind, seconds in
                                                   sorted(found.items(), key=lambda item: -item[1])) + ")"


def report_workers(step):
    n = step["items"]
    runs = step["runs"]
    if not (runs or step["spied"]):
        return report_in_process(step, {1: float("nan"), 2: float("nan")})
    first = (runs or step["spied"])[0]
    print(f"6. Updated rendered records on Celery workers (PostgreSQL, Redis; 'metadata' set): "
          f"Item.objects.update(title=...) of {n:,} items (not timed), then tracking.changed(model=Item, pks=...) "
          f"committed (changed() {first['changed_seconds']:.2f} s, to the end of the commit {first['commit_seconds']:.2f} s; "
          f"{first['dropped']:,} pending rows of the pages and bitstreams sources dropped before the commit); timed from "
          f"the commit until the {n:,} events are in the database (polled every 100 ms). celery worker --pool=solo processes: "
          f"the commit queues resourcesync.process_changes, whose worker has the objects described in parts "
          f"(resourcesync.share_job) by every free worker, then writes the events"
          + ("; ANALYZE of the pending changes' table before the commit (--analyze-pending)" if step["analyze"] else ""))
    for result in runs:
        print(worker_line(result))
    rates = {count: [rate(n, r["seconds"]) for r in runs if r["workers"] == count and r["seconds"]] for count in (1, 2)}
    medians = {count: statistics.median(values) if values else float("nan") for count, values in rates.items()}
    print(f"  median of {len(rates[1])} / {len(rates[2])} run(s): 1 worker {medians[1]:,.0f} records/s, "
          f"2 workers {medians[2]:,.0f} records/s  ->  2 workers / 1 worker {medians[2] / medians[1]:.2f}x  "
          f"(target: {TARGET_WORKER_RECORDS_PER_S:,} records/s with 2 workers)")
    waited = [r for r in runs if r["quiet"]["waited"] >= 1]
    noisy = [r for r in runs if not r["quiet"]["quiet"]]
    print(f"  load: waited before {len(waited)} of {len(runs)} runs; {len(noisy)} run(s) started with the load still "
          f">= the limit")
    for result in step["spied"]:
        print(worker_line(result).replace(f"#{result['run']:<2}", f"#{result['run']:<2}(py-spy)", 1))
        for number, pid in enumerate(result["pids"], 1):
            summary = result["profiles"].get(pid)
            if not isinstance(summary, dict):
                print(f"      worker {number}: {summary}")
                continue
            print(f"      py-spy, worker {number} ({summary['samples']:,} samples in our tasks, idle included):")
            print("        self:      " + "; ".join(f"{frame} {share:.1f}%" for frame, share in summary["self"][:12]))
            print("        self by file: " + "; ".join(f"{frame} {share:.1f}%" for frame, share in summary["files"][:12]))
            print("        inclusive: " + "; ".join(f"{frame} {share:.1f}%" for frame, share in summary["inclusive"][:30]))
    return report_in_process(step, medians)


def report_in_process(step, medians):
    for result in step["in_process"]:
        timed = result["timed"]
        stats = timed["stats"]
        label = "parallel=True (no worker: the parts done here)" if result["parallel"] else "parallel=False"
        print(f"  in process, process_pending(['metadata'], {label}) of {result['items']:,} items: {timed['seconds']:.2f} s  "
              f"{rate(timed['events'], timed['seconds']):,.0f} records/s ({timed['events']:,} events)"
              + (f"; preparation {stats.get('prepare_in_parts seconds', 0):.2f} s" if result["parallel"] else "")
              + f"; CPU {timed['cpu']['self'] / max(1, timed['events']) * 1000:.2f} ms a record here "
                f"(machine {timed['cpu']['machine']:.1f} s)"
              + f"; rendered while preparing {stats.get('prepare: rendered', 0):,}, "
                f"while writing {stats.get('write: rendered', 0):,}; found prepared "
                f"{stats.get('write: found prepared', 0):,} of {stats.get('write: asked for prepared', 0):,} asked; "
                f"load1 before {timed['quiet']['load']:.2f}, waited {timed['quiet']['waited']:.0f} s")
    for result in step["in_process"]:
        profiled = result.get("profiled")
        if profiled:
            print()
            print(f"cProfile: process_pending(['metadata'], parallel={result['parallel']}) of {result['items']:,} items in "
                  f"process ({profiled['seconds']:.2f} s under the profiler)")
            print(profiled["cumulative"])
            print(profiled["tottime"])
    return medians


def print_worker_target(medians):
    print(f"  6. >= {TARGET_WORKER_RECORDS_PER_S:,} updated rendered records/s, end to end, with 2 workers on PostgreSQL: "
          f"{medians[2]:,.0f}/s  ({met(medians[2] >= TARGET_WORKER_RECORDS_PER_S)}); 1 worker {medians[1]:,.0f}/s")


def report_workers_and_target(step):
    medians = report_workers(step)
    print()
    print("Target (printed, not asserted):")
    print_worker_target(medians)


def run(options):
    n = options.items
    n_update = options.update if options.update is not None else min(50_000, n // 2)
    n_delete = options.delete if options.delete is not None else min(20_000, n // 5)
    n_render = options.render if options.render is not None else min(10_000, n // 2)
    # Step 6 runs last: in a full run, on the items the deletion of step 2 left.
    n_workers = options.worker_items or min(50_000, n if options.workers_only else n - n_delete)
    if options.workers_only and not options.database_url:
        raise SystemExit("--workers-only needs --database-url: step 6 runs on PostgreSQL")
    var_dir = tempfile.mkdtemp(prefix="changes-bench-")
    result_dir = Path(var_dir) / "results"
    result_dir.mkdir()
    database_url = options.database_url
    pgoptions = "-c jit=off" if database_url and options.pg_jit == "off" else None
    broker = {
        "var_dir": var_dir,
        "database_url": database_url,
        "broker_url": options.broker_url,
        "pgoptions": pgoptions,
        "max_entries": options.max_entries,
    }
    eager = dict(broker, broker_url=None)
    if database_url:
        jit = recreate_database(database_url)
        if jit == "on" and options.pg_jit == "server":
            progress("PostgreSQL has jit=on (the server's setting); --pg-jit off measures without it")
    purge_broker(options.broker_url)
    try:
        progress(f"data in {var_dir}")
        seed = run_child("seed", result_dir, eager, n, options.file_size)
        # Step 6 alone needs the metadata set alone: the others would take minutes to baseline
        # (every landing page rendered through the view), and their changes are not measured.
        baseline = run_child("baseline", result_dir, eager, ["metadata"] if options.workers_only else None)
        if options.render_only:
            renders = run_renders(options, result_dir, broker, n_render)
            print(header(seed, pgoptions))
            report_seed(options, seed, baseline)
            print()
            report_renders(renders)
            return
        if options.saves_only:
            saves_broker = run_child("saves", result_dir, broker, options.saves, options.block, False)
            purge_broker(options.broker_url)
            saves_atomic = run_child("saves", result_dir, broker, options.saves, options.block, True)
            print(header(seed, pgoptions))
            report_seed(options, seed, baseline)
            print("\n1. Item.save() cost, tracked vs untracked twin, broker configuration (--saves-only)")
            ratio = report_saves("broker: task queued on Redis", saves_broker)
            report_saves("broker, save in transaction.atomic()", saves_atomic)
            print(f"  target: tracked save <= {TARGET_SAVE_RATIO}x its untracked twin (autocommit; median of the "
                  f"paired rounds): {ratio:.2f}x  ({met(ratio <= TARGET_SAVE_RATIO)})")
            return
        if options.workers_only:
            workers = run_worker_steps(options, result_dir, broker, n_workers)
            print(header(seed, pgoptions))
            report_seed(options, seed, baseline)
            print()
            report_workers_and_target(workers)
            return
        update = run_child("bulk_update", result_dir, broker, n_update)
        purge_broker(options.broker_url)
        serve_open = run_child("serve_open", result_dir, eager, options.reps)
        close = run_child("close", result_dir, broker)
        purge_broker(options.broker_url)
        serve_closed = run_child("serve_closed", result_dir, eager, options.reps, close["number"]) if close["closed"] else None
        reconcile = run_child("reconcile", result_dir, eager, options.fraction, options.file_size)
        delete = run_child("bulk_delete", result_dir, broker, n_delete)
        purge_broker(options.broker_url)
        saves_broker = run_child("saves", result_dir, broker, options.saves, options.block, False)
        purge_broker(options.broker_url)
        saves_atomic = run_child("saves", result_dir, broker, options.saves, options.block, True)
        purge_broker(options.broker_url)
        saves_eager = run_child("saves", result_dir, eager, options.eager_saves, min(options.block, options.eager_saves), False)
        renders = run_renders(options, result_dir, broker, n_render)
        workers = run_worker_steps(options, result_dir, broker, n_workers) if database_url else None
        profile = run_child("profile", result_dir, broker, min(5_000, n_update), options.top) if options.profile else None
        purge_broker(options.broker_url)

        # ---- report ----
        print(header(seed, pgoptions))
        report_seed(options, seed, baseline)

        print()
        print("1. Item.save() cost, tracked vs untracked twin (same model, receivers disconnected); the title changes; "
              "blocks of saves alternate ABBA")
        ratio = report_saves("broker: task queued on Redis", saves_broker)
        report_saves("eager: processed inline (demo default)", saves_eager)
        report_saves("broker, save in transaction.atomic()", saves_atomic)
        print(f"  broker: autocommit, {saves_broker['saves_each']:,} saves each in blocks of {saves_broker['block']}; "
              f"{saves_broker['pending_rows']:,} PendingChange rows written by the tracked saves; "
              f"{saves_broker['queued_tasks']} tasks on the queue (purged; nothing consumes it)")
        print(f"  eager: autocommit, {saves_eager['saves_each']:,} saves each in blocks of {saves_eager['block']}; "
              f"{total_events(saves_eager['events']):,} change events written {saves_eager['events']}")
        print(f"  broker, atomic: each save alone in transaction.atomic() (one outbox transaction with the save, "
              f"one on-commit dispatch); {saves_atomic['queued_tasks']} tasks on the queue (purged)")

        print()
        print("2. Events per second through the bulk API (broker configuration: changed() records pending changes, "
              "process_pending() turns them into change events, called here)")
        u = update
        update_events = total_events(u["events"])
        update_seconds = u["changed_seconds"] + u["process_seconds"]
        update_rate = rate(update_events, update_seconds)
        print(f"  update: Item.objects.filter(pk range).update(title=...) on {u['items']:,} items "
              f"took {u['update_seconds']:.2f} s (not timed)")
        print(f"    timed: tracking.changed(queryset) {u['changed_seconds']:.2f} s ({u['pending']:,} pending rows, both sources) "
              f"+ tracking.process_pending() {u['process_seconds']:.2f} s = {update_seconds:.2f} s")
        print(f"    events written: {update_events:,} {u['events']}  ->  {update_rate:,.0f} events/s  "
              f"(process_pending: {u['counts']['updated']:,} updated, {u['counts']['unchanged']:,} unchanged)")
        d = delete
        delete_events = total_events(d["events"])
        delete_seconds = d["changed_seconds"] + d["process_seconds"]
        delete_rate = rate(delete_events, delete_seconds)
        print(f"  delete: with tracking.paused(): Item.objects.filter(pk range).delete() of {d['items']:,} items "
              f"(and {d['files']:,} files by cascade) took {d['delete_seconds']:.2f} s (not timed)")
        print(f"    timed: tracking.changed(model=Item, pks) + tracking.changed(model=ItemFile, pks) "
              f"{d['changed_seconds']:.2f} s ({d['pending']:,} pending rows) + tracking.process_pending() "
              f"{d['process_seconds']:.2f} s = {delete_seconds:.2f} s")
        print(f"    events written: {delete_events:,} {d['events']}  ->  {delete_rate:,.0f} events/s")
        record_rates = [rate(x["pending"], x["changed_seconds"]) for x in (u, d)]
        print(f"  changed() alone (what the calling code waits for): {record_rates[0]:,.0f} pending changes/s (update), "
              f"{record_rates[1]:,.0f}/s (delete)")

        print()
        print(f"3. Reconcile with {options.fraction:.0%} changed behind the app's back "
              f"({reconcile['items_changed']:,} titles by queryset.update(); {reconcile['files_changed']:,} files rewritten "
              f"on disk, {options.file_size} -> {reconcile['new_size']} bytes, modified untouched)")
        reconcile_worst = 0.0
        for slug in ("metadata", "bitstreams"):
            r = reconcile[slug]
            reconcile_worst = max(reconcile_worst, r["seconds"])
            print(f"  tracking.reconcile('{slug}'): {r['resources']:,} resources in {r['seconds']:.2f} s "
                  f"({rate(r['resources'], r['seconds']):,.0f}/s); events found: {r['events']:,} "
                  f"({r['counts']['updated']:,} updated, {r['counts']['unchanged']:,} unchanged)")

        print()
        print("4. Serving the metadata set's Change List (Django test Client, whole body read)")
        open_label = f"open list #{serve_open['number']} ({serve_open['list_entries']:,} events, live)"
        open_seconds = report_serve(open_label, serve_open)
        print(f"  closing it (one more change arrives; changed() + process_pending(), list written to storage): "
              f"{close['seconds']:.2f} s; list #{close['number']} closed: {close['closed']}, "
              f"{close['entries']:,} entries, {close['size'] / 2**20:.1f} MB")
        if serve_closed:
            report_serve(f"closed list #{close['number']} (from storage)", serve_closed["closed"])
            report_serve(f"Change List Index ({close['lists']} lists)", serve_closed["index"])

        print()
        report_renders(renders)

        print()
        if workers:
            worker_medians = report_workers(workers)
        else:
            print("6. Updated rendered records on Celery workers: not run (it needs PostgreSQL: --database-url)")

        print()
        print("Targets (printed, not asserted):")
        print(f"  1. tracked save <= {TARGET_SAVE_RATIO}x its untracked twin (broker, autocommit; median of the paired "
              f"rounds): {ratio:.2f}x  "
              f"({met(ratio <= TARGET_SAVE_RATIO)})")
        worst_rate = min(update_rate, delete_rate)
        print(f"  2. >= {TARGET_EVENTS_PER_S:,} events/s, end to end: update {update_rate:,.0f}/s, delete {delete_rate:,.0f}/s  "
              f"({met(worst_rate >= TARGET_EVENTS_PER_S)}); recorded by changed(): {min(record_rates):,.0f}/s or more  "
              f"({met(min(record_rates) >= TARGET_EVENTS_PER_S)})")
        print(f"  3. reconcile of {n:,}-item sets with 1% changed < {TARGET_RECONCILE_S:.0f} s: "
              f"metadata {reconcile['metadata']['seconds']:.2f} s, bitstreams {reconcile['bitstreams']['seconds']:.2f} s  "
              f"({met(reconcile_worst < TARGET_RECONCILE_S)})")
        print(f"  4. {serve_open['list_entries']:,}-entry open Change List served < {TARGET_SERVE_S} s: "
              f"{open_seconds:.3f} s  ({met(open_seconds < TARGET_SERVE_S)})")
        if workers:
            print_worker_target(worker_medians)

        if profile:
            for name, title in (
                ("bulk", f"changed() + process_pending() of {min(5_000, n_update):,} updated items"),
                ("bulk_delete", f"changed() + process_pending() of {min(5_000, n_update):,} deleted items and their files"),
                ("reconcile", "tracking.reconcile('bitstreams'), nothing changed"),
            ):
                p = profile[name]
                print()
                print(f"cProfile: {title} ({p['seconds']:.2f} s under the profiler)")
                print(f"--- top {options.top} by cumulative time ---")
                print(p["cumulative"])
                print(f"--- top {options.top} by internal time (tottime) ---")
                print(p["tottime"])
    finally:
        purge_broker(options.broker_url)
        if not options.keep:
            shutil.rmtree(var_dir, ignore_errors=True)
            if database_url:
                recreate_database(database_url, create=False)
        else:
            progress(f"kept {var_dir}" + (f" and the database {database_name(database_url)}" if database_url else ""))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000, help="items seeded (default 100000)")
    parser.add_argument("--update", type=int, help="items updated in step 2 (default min(50000, items/2))")
    parser.add_argument("--delete", type=int, help="items deleted in step 2 (default min(20000, items/5))")
    parser.add_argument("--render", type=int, help="items updated in step 5, per round (default min(10000, items/2))")
    parser.add_argument("--render-rounds", type=int, default=2,
                        help="rounds of step 5, each one with and one without the hook (default 2)")
    parser.add_argument("--render-only", action="store_true", help="seed, baseline and step 5 alone")
    parser.add_argument("--saves-only", action="store_true",
                        help="seed, baseline and step 1 alone, broker configuration (autocommit and atomic)")
    parser.add_argument("--worker-items", type=int,
                        help="items updated in each run of step 6 (default min(50000, the items left))")
    parser.add_argument("--worker-rounds", type=int, default=3,
                        help="rounds of step 6, each one run with 1 worker and one with 2 (default 3)")
    parser.add_argument("--workers-only", action="store_true", help="seed, baseline and step 6 alone (PostgreSQL)")
    parser.add_argument("--worker-profile-items", type=int, default=10_000,
                        help="items of step 6's in-process comparison (default 10000)")
    parser.add_argument("--max-load", type=float, default=0.5,
                        help="step 6 waits for the 1-minute load average to fall below this before each run (default 0.5)")
    parser.add_argument("--load-wait", type=float, default=600,
                        help="seconds step 6 waits at most for that, per run (default 600)")
    parser.add_argument("--analyze-pending", action="store_true",
                        help="step 6: ANALYZE the pending changes' table before each commit (a diagnostic: the "
                             "planner then knows its size)")
    parser.add_argument("--py-spy", metavar="PATH",
                        help="py-spy executable: step 6 adds one run with 1 worker and one with 2, each worker sampled")
    parser.add_argument("--fraction", type=float, default=0.01, help="fraction changed before the reconcile (default 0.01)")
    parser.add_argument("--file-size", type=int, default=64, help="bytes per file (default 64)")
    parser.add_argument("--saves", type=int, default=2000, help="saves per variant in step 1, broker (default 2000)")
    parser.add_argument("--eager-saves", type=int, default=500, help="saves per variant in step 1, eager (default 500)")
    parser.add_argument("--block", type=int, default=250, help="saves per alternating block (default 250)")
    parser.add_argument("--reps", type=int, default=5, help="GETs per document in step 4 (default 5)")
    parser.add_argument(
        "--max-entries", type=int, help="override MAX_ENTRIES_PER_DOCUMENT (default: the setting, 50000), e.g. for a quick run"
    )
    parser.add_argument("--database-url", help="postgres://... (dropped and created); default SQLite in the temporary directory")
    parser.add_argument(
        "--pg-jit",
        choices=("server", "off"),
        default="server",
        help="PostgreSQL JIT for the children: the server's setting (default), or off (PGOPTIONS=-c jit=off)",
    )
    parser.add_argument(
        "--broker-url", default=DEFAULT_BROKER, help=f"Redis broker, purged before and after (default {DEFAULT_BROKER})"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (and the PostgreSQL database)")
    parser.add_argument("--profile", action="store_true", help="also cProfile a bulk update and a reconcile")
    parser.add_argument("--top", type=int, default=15, help="functions shown by --profile (default 15)")
    add_child_arguments(parser, CHILDREN)
    options = parser.parse_args()
    if run_as_child(options, CHILDREN):
        return
    run(options)


if __name__ == "__main__":
    main()
