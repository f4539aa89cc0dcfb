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
   pending change then commit together).
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

The steps run in this order: seed, baseline, 2 (update), 4 (open list), close, 4 (closed list),
3, 2 (delete), 1; the report prints them in the numbered order. Every step runs in its own child
process (this script re-run with the hidden ``--child`` option). Nothing is asserted: the script
prints figures, ratios and the targets (save at most 1.5x its untracked twin; at least 50,000
events/s; a reconcile of 100,000 resources under 10 s; a 50,000-entry Change List served in under
0.5 s). ``--profile`` additionally runs cProfile over a repeat of the bulk update (5,000 items),
a bulk deletion (as many items, with their files) and a reconcile of the ``bitstreams`` set, and
prints the top functions.

On PostgreSQL, ``--pg-jit off`` turns JIT compilation off for the children's sessions
(``PGOPTIONS=-c jit=off``). Change tracking no longer issues the ``UPDATE ... CASE WHEN``
statements of Django's ``bulk_update`` (which JIT compilation made take minutes per batch), so
the server's setting is the default.
"""

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import _steps
from _steps import add_child_arguments, run_as_child

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BROKER = "redis://127.0.0.1:6379/14"

TARGET_SAVE_RATIO = 1.5
TARGET_EVENTS_PER_S = 50_000
TARGET_RECONCILE_S = 10.0
TARGET_SERVE_S = 0.5


# --------------------------------------------------------------------------------------------
# Children: each runs one step in a fresh interpreter and writes a JSON result file.
# ``cfg`` is {"var_dir", "database_url", "broker_url"}; a broker_url of None means eager tasks.


def setup_django(cfg):
    os.environ["EXAMPLE_VAR_DIR"] = cfg["var_dir"]
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    settings_from_env = (
        ("DATABASE_URL", cfg["database_url"]),
        ("CELERY_BROKER_URL", cfg["broker_url"]),
        ("PGOPTIONS", cfg.get("pgoptions")),  # libpq: options for every PostgreSQL session
    )
    for name, value in settings_from_env:
        if value:
            os.environ[name] = value
        else:
            os.environ.pop(name, None)
    os.environ.pop("CELERY_RESULT_BACKEND", None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings

    assert settings.CELERY_TASK_ALWAYS_EAGER == (not cfg["broker_url"])
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


def child_baseline(cfg):
    """First reconcile of each set: records its resources silently and opens its change log."""
    setup_django(cfg)
    from django_resourcesync import tracking
    from django_resourcesync.models import ChangeList, Resource, ResourceSet

    result = {}
    for resource_set in ResourceSet.objects.order_by("pk"):
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

    def run_block(n):
        started = time.perf_counter()
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
            times[mode].append(run_block(block))
    tracked()
    pending = PendingChange.objects.count() - warm_pending
    result = {
        "saves_each": rounds * block,
        "block": block,
        "atomic": atomic,
        "tracked_blocks": times["tracked"],
        "untracked_blocks": times["untracked"],
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
}


def run_child(role, result_dir, *args):
    started = time.perf_counter()
    result = _steps.run_child(__file__, role, result_dir, *args)
    progress(f"{role} done in {time.perf_counter() - started:.1f} s")
    return result


def progress(message):
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Services: the PostgreSQL database and the broker's queue


def admin_url(database_url):
    """The same server, database ``postgres``."""
    parts = urlsplit(database_url)
    return urlunsplit(("postgresql", parts.netloc, "/postgres", "", ""))


def database_name(database_url):
    return urlsplit(database_url).path.lstrip("/")


def recreate_database(database_url, create=True):
    import psycopg
    from psycopg import sql

    name = database_name(database_url)
    with psycopg.connect(admin_url(database_url), autocommit=True) as connection:
        connection.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if create:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return connection.execute("SHOW jit").fetchone()[0]


def purge_broker(broker_url):
    try:
        import redis

        redis.Redis.from_url(broker_url).flushdb()
    except ImportError:
        db = urlsplit(broker_url).path.lstrip("/") or "0"
        subprocess.run(["redis-cli", "-n", db, "flushdb"], check=True, stdout=subprocess.DEVNULL)


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
    ratio = tracked / untracked
    print(
        f"  {label:<40} tracked {tracked:>8,.0f} us/save   untracked twin {untracked:>6,.0f} us/save   "
        f"ratio {ratio:5.2f}x   (block medians {statistics.median(blocks_t):,.0f} / {statistics.median(blocks_u):,.0f} us)"
    )
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


def run(options):
    n = options.items
    n_update = options.update if options.update is not None else min(50_000, n // 2)
    n_delete = options.delete if options.delete is not None else min(20_000, n // 5)
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
        baseline = run_child("baseline", result_dir, eager)
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
        profile = run_child("profile", result_dir, broker, min(5_000, n_update), options.top) if options.profile else None
        purge_broker(options.broker_url)

        # ---- report ----
        database = f"{seed['vendor']} {seed['db_version']}"
        if seed["jit"] is not None:
            database += f" (jit={seed['jit']}{', set by --pg-jit off' if pgoptions else ', the server setting'})"
        print(
            f"Change tracking benchmark, example project  (Python {platform.python_version()}, Django {seed['django']}, "
            f"{database}, {os.cpu_count()} CPUs)"
        )
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
        print("Targets (printed, not asserted):")
        print(f"  1. tracked save <= {TARGET_SAVE_RATIO}x its untracked twin (broker, autocommit): {ratio:.2f}x  "
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
