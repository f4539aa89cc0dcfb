"""Benchmark: a reconcile of 1,000,000 resources shared among Celery workers, one worker against two.

Run from the repository root::

    .venv/bin/python benchmarks/parallel_reconcile.py
    .venv/bin/python benchmarks/parallel_reconcile.py --resources 100000 --repeat 1      # quicker
    .venv/bin/python benchmarks/parallel_reconcile.py --database-url postgres://postgres:postgres@127.0.0.1:5432/bench_reconcile

Setup (not timed): a temporary ``EXAMPLE_VAR_DIR`` (the items' files), and the PostgreSQL
database of ``--database-url``, which the script drops and creates (and drops again at the end
unless ``--keep``; ``--reuse VAR_DIR`` runs again on what ``--keep`` left, without the setup).
It is migrated and seeded with the example repository's items by ``seed_repository``'s
``add_items(items, file_size=..., track=False)``: enough items for N files (every third item
has two), each file written into the temporary media folder (``--file-size`` bytes, 0 by
default: an inode each, no data block). Change tracking is not told (processing the other sets,
whose records are rendered, would take most of an hour at 1M): one in-process
``tracking.reconcile()`` of the ``bitstreams`` set, the set measured, records its N resources
instead (its first reconcile: silently, then it opens the set's change log). Then ``VACUUM
ANALYZE``, as autovacuum would do after such a load.

Timed, R times each (``--repeat``), in rounds that alternate which of one and two workers goes
first, in two variants: **unchanged** (nothing changed since the last reconcile) and **1%
changed** (before each run, not timed, every hundredth file of the set gets
``ItemFile.objects.filter(...).update(media_type="application/octet-stream")``, or its own
type again where it has that one (left so by the run before, or by an earlier invocation), which
bypasses the signals: a change of the representation, an ``updated`` event each; after the run,
not timed either, the tables are vacuumed):

- **1 worker** and **2 workers**: real ``celery -A example_project worker --pool=solo``
  processes on the Redis broker of ``--broker-url``, started before the run and stopped after it.
  This script sends ``send_task("resourcesync.reconcile_set", args=[set_id])`` (a bare Celery app
  on the broker, as any client would) and the time runs from sending until the worker that ran
  the task logs ``Task resourcesync.reconcile_set[<id>] succeeded in ...`` (Celery's own log line
  at INFO, read from the worker's output by a thread as it is written; the line also carries the
  task's result, the reconcile's counts). The task plans the key ranges, records them
  (``SharedPart`` rows), sends a ``resourcesync.share_job`` task per range but one and takes
  ranges itself; the parts each worker did are read from its ``share_job`` lines. After the run
  a child checks that no ``SharedPart`` row of the set is left and counts the change events
  written;
- **in process**: ``tracking.refresh(resource_set)`` in a child, what the task does without
  workers (``parallel=False``: one pass over the whole set);
- **raw cursor read** (unchanged variant): the SQL of ``values_list("pk", *fingerprint_fields,
  "size")`` of the set's queryset, every row fetched through the DB-API cursor: the floor of any
  reconcile that reads the rows once.

Before the timing starts the script waits (up to ``--max-wait`` seconds, 600) for the 1-minute
load average (``os.getloadavg()``) to fall to ``--max-load`` (0.5), since other benchmarks may
share the machine; before each run it samples ``/proc/stat`` for a second and waits (up to
``--run-wait`` seconds, 120) while more than ``--max-load`` CPUs are busy (the load average lags
a minute behind, and our own previous run keeps it up). It prints what it waited, and the load
average at each run.

It prints, per run and as medians: seconds, µs per resource, how many of the machine's CPUs
were busy on average during a worker run (``/proc/stat``: with one worker, PostgreSQL's own
parallel workers of a query can keep more than one busy), the ratio 1 worker / 2 workers
against the target (2 workers at least 1.7x as fast as 1), and the checks (updated events =
objects changed, nothing left in ``SharedPart``). Then, with ``--phases`` (the default), a child
times the pieces of the reconcile one after the other in process, as the task runs them: pending
changes, the key-range planning (``_key_ranges``), each range (``_reconcile_range``: its comparison,
and the writing of what differs), the search for gone records (``_gone_keys``), and the forgetting of
left-out objects; from them, the serial part and the ratio two workers could reach (Amdahl: the
ranges, the job's parts, dealt to two workers as they come; the set's count, in the task's worker
once it has no range left, beside the other worker's last one (after the ranges with one worker);
then the gone search only where records outnumber objects). Nothing is asserted.
"""

import argparse
import importlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import _steps
import parallel_build
from _steps import add_child_arguments, run_as_child
from changes import purge_broker, recreate_database
from parallel_build import progress, setup_django

ROOT = Path(__file__).resolve().parent.parent
SLUG = "bitstreams"
TARGET_SPEEDUP = 1.7
CHANGED_EVERY = 100  # 1%: every hundredth file of the set (by key) is changed
CHANGED_TYPE = "application/octet-stream"  # the media type the change gives the files


# --------------------------------------------------------------------------------------------
# Children. ``cfg`` is {"var_dir", "database_url", "broker_url", "pgoptions"} (parallel_build's).


def set_and_queryset():
    from django_resourcesync.models import ResourceSet

    resource_set = ResourceSet.objects.get(slug=SLUG)
    return resource_set, resource_set.get_source().queryset(resource_set.lookups)


def vacuum(*tables):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE " + ", ".join(connection.ops.quote_name(table) for table in tables))


def items_for(resources):
    """The fewest items whose files number at least ``resources`` (item n has two if 3 divides n)."""
    items = resources * 3 // 4
    while items + items // 3 < resources:
        items += 1
    return items


def child_seed(cfg, resources, file_size):
    setup_django(cfg)
    from django.core.management import call_command
    from django.db import connection

    from django_resourcesync import tracking
    from django_resourcesync.models import Resource
    from example_project.repository.management.commands.seed_repository import add_items

    call_command("migrate", verbosity=0, interactive=False)
    items = items_for(resources)
    started = time.perf_counter()
    last = [started]

    def report(done):
        if time.perf_counter() - last[0] > 30:
            last[0] = time.perf_counter()
            progress(f"  {done:,} of {items:,} items")

    add_items(items, file_size=file_size, track=False, progress=report)
    seeded = time.perf_counter() - started
    resource_set, queryset = set_and_queryset()
    started = time.perf_counter()
    counts = tracking.reconcile(resource_set)
    reconciled = time.perf_counter() - started
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return {
        "items": items,
        "files": queryset.count(),
        "resources": Resource.objects.filter(resource_set=resource_set).count(),
        "set_id": resource_set.pk,
        "seed_seconds": seeded,
        "reconcile_seconds": reconciled,
        "vacuum_seconds": time.perf_counter() - started,
        "counts": str(counts),
        "db_version": ".".join(map(str, connection.get_database_version())),
    }


def changed_files(queryset):
    """Every hundredth file of the set, by key."""
    from django.db.models import F

    return queryset.alias(_bench_mod=F("pk") % CHANGED_EVERY).filter(_bench_mod=0)


def child_change(cfg, change):
    """With ``change``, 1% of the set's files get another media type, or theirs again where they
    have the other one (left so by the run before, or by an earlier invocation with ``--keep``);
    either way not through the model: no signal, as a script or a raw SQL update would; a change
    of the representation, so an "updated" event each. Returns how many changed, and the last
    event id so far."""
    setup_django(cfg)
    from django.db.models import Case, Max, Value, When

    from django_resourcesync.models import ChangeEvent
    from example_project.repository.models import ItemFile

    _resource_set, queryset = set_and_queryset()
    changed = 0
    if change:
        keys = changed_files(queryset).values("pk")
        # The seed's types: text/csv for its .csv files, text/plain for the others.
        original = Case(When(name__endswith=".csv", then=Value("text/csv")), default=Value("text/plain"))
        files = ItemFile.objects.filter(pk__in=keys)
        back = files.filter(media_type=CHANGED_TYPE).exists()
        changed = files.update(media_type=original if back else CHANGED_TYPE)
    return {"changed": changed, "last_event": ChangeEvent.objects.aggregate(last=Max("id"))["last"] or 0}


def events_since(resource_set, last_event):
    from django.db.models import Count

    from django_resourcesync.models import ChangeEvent

    rows = ChangeEvent.objects.filter(resource_set=resource_set, id__gt=last_event).values_list("change").annotate(n=Count("id"))
    return dict(rows)


def counts_dict(counts):
    return {name: getattr(counts, name) for name in ("created", "updated", "deleted", "unchanged", "skipped")}


def child_check(cfg, last_event, clean):
    """After a run: the events it wrote, the shared parts left; with ``clean``, the tables the
    run wrote vacuumed, so that every run starts from the same state (all pages visible)."""
    setup_django(cfg)
    from django_resourcesync.models import ChangeEvent, Resource, SharedPart
    from example_project.repository.models import ItemFile

    resource_set, _queryset = set_and_queryset()
    result = {
        "events": events_since(resource_set, last_event),
        "parts_left": SharedPart.objects.filter(resource_set=resource_set).count(),
    }
    if clean:
        started = time.perf_counter()
        vacuum(ItemFile._meta.db_table, Resource._meta.db_table, ChangeEvent._meta.db_table)
        result["vacuum_seconds"] = time.perf_counter() - started
    return result


def child_in_process(cfg, _unused):
    """The reconcile without workers, as the task runs it in process (``parallel=False``)."""
    setup_django(cfg)
    from django_resourcesync import tracking

    resource_set, _queryset = set_and_queryset()
    started = time.perf_counter()
    counts = tracking.refresh(resource_set)
    return {"seconds": time.perf_counter() - started, "counts": counts_dict(counts)}


def child_raw(cfg):
    """Every row of the set's pk and fingerprint fields, through the DB-API cursor."""
    setup_django(cfg)
    from django.db import connection

    resource_set, queryset = set_and_queryset()
    source = resource_set.get_source()
    sizes = list(dict(source.fingerprint_file_sizes or {}).values())
    sql, params = queryset.order_by("pk").values_list("pk", *source.fingerprint_fields, *sizes).query.sql_with_params()
    started = time.perf_counter()
    rows = 0
    with connection.cursor() as cursor:
        cursor.cursor.execute(sql, params)
        while chunk := cursor.fetchmany(10_000):
            rows += len(chunk)
        seconds = time.perf_counter() - started
        settings = {}
        for name in ("jit", "max_parallel_workers_per_gather", "shared_buffers", "work_mem"):
            cursor.execute(f"SHOW {name}")
            settings[name] = cursor.fetchone()[0]
    return {"seconds": seconds, "rows": rows, "settings": settings}


def child_phases(cfg, profile=False):
    """The pieces of a reconcile in parts, timed one after the other in process; ``profile``:
    the batches written under the set's lock run under cProfile (its top functions returned)."""
    setup_django(cfg)
    import cProfile
    import io
    import pstats

    from django.db import connection

    from django_resourcesync import tracking
    from django_resourcesync.conf import app_settings

    module = importlib.import_module("django_resourcesync.tracking.reconcile")
    resource_set, queryset = set_and_queryset()
    source = resource_set.get_source()
    timings = {"apply": 0.0}
    # The batches written under the set's lock (one writer at a time, whichever worker): timed.
    apply_batch = module._apply_batch
    profiler = cProfile.Profile() if profile else None

    def timed_apply(*args, **kwargs):
        started = time.perf_counter()
        if profiler:
            profiler.enable()
        try:
            return apply_batch(*args, **kwargs)
        finally:
            if profiler:
                profiler.disable()
            timings["apply"] += time.perf_counter() - started

    module._apply_batch = timed_apply

    def timed(name, func, *args):
        started = time.perf_counter()
        value = func(*args)
        timings[name] = time.perf_counter() - started
        return value

    queryset.filter(pk=0).exists()  # the connection opened, the source imported: not in the first figure
    # What a fresh process pays once, at the first object it describes (inside the set's lock):
    # the URLconf loaded, with the views it imports. Timed apart, so the figures below are warm.
    from django.urls import get_resolver

    timed("urlconf", lambda: len(get_resolver().reverse_dict))
    timed("pending", tracking.process_pending, [resource_set.source])
    timed("count", queryset.count)
    ranges = timed("plan", module._key_ranges, queryset, app_settings.MAX_ENTRIES_PER_DOCUMENT)
    parts = []
    for bounds in ranges:
        applied = timings["apply"]
        started = time.perf_counter()
        result = module._reconcile_range(
            resource_set, {**bounds, "record_events": True, "batch_size": app_settings.BATCH_SIZE}, lambda: None
        )
        parts.append({"seconds": time.perf_counter() - started, "updated": result["updated"],
                      "apply": timings["apply"] - applied})
    gone = timed("gone", lambda: sum(len(keys) for keys in module._gone_keys(resource_set, queryset, app_settings.BATCH_SIZE)))
    timed("left_out", module._forget_gone_left_out, resource_set, queryset)
    plans = {}
    if connection.vendor == "postgresql":
        # What the database does with the set's two big queries: the gone records, one range.
        records = module.Resource.objects.filter(resource_set=resource_set)
        plans["range"] = explain(connection, first_range_query(resource_set, queryset, ranges[0], source))
        plans["gone"] = explain(connection, gone_query(resource_set, queryset, records))
    profiled = ""
    if profiler and timings["apply"]:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).strip_dirs().sort_stats("tottime").print_stats(20)
        profiled = out.getvalue()
    return {"timings": timings, "parts": parts, "ranges": len(ranges), "gone": gone, "plans": plans,
            "range_size": app_settings.MAX_ENTRIES_PER_DOCUMENT, "profile": profiled}


def first_range_query(resource_set, queryset, bounds, source):
    from django.db import models
    from django.db.models import Exists, OuterRef
    from django.db.models.functions import Cast

    from django_resourcesync.models import Resource

    if bounds["last"] is not None:
        queryset = queryset.filter(pk__lte=bounds["last"])
    expression, _files = source.fingerprint_expression(queryset.db)
    record = Resource.objects.filter(resource_set=resource_set, object_pk=Cast(OuterRef("pk"), models.CharField()))
    rows = queryset.order_by().annotate(_rs_fingerprint=expression)
    rows = rows.filter(~Exists(record.filter(fingerprint=OuterRef("_rs_fingerprint"))))
    return rows.order_by("pk").values_list("pk", "_rs_fingerprint")[:5000]


def gone_query(resource_set, queryset, records):
    """``_gone_keys``'s query, as it builds it on PostgreSQL."""
    from django.db import models
    from django.db.models import Case, Exists, OuterRef, Q, When
    from django.db.models.functions import Cast

    as_integer = Cast("object_pk", models.BigIntegerField())
    integer = Q(object_pk__regex=r"^(0|-?[1-9][0-9]{0,17})$")
    key = Case(When(integer, then=as_integer), default=None, output_field=models.BigIntegerField())
    present = queryset.order_by().filter(pk=OuterRef("key"))
    return records.annotate(key=key).filter(~Exists(present)).values_list("object_pk", flat=True)


def explain(connection, queryset):
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


CHILDREN = {
    "seed": child_seed, "change": child_change, "check": child_check, "in_process": child_in_process,
    "raw": child_raw, "phases": child_phases,
}


def run_child(role, result_dir, *args):
    return _steps.run_child(__file__, role, result_dir, *args)


# --------------------------------------------------------------------------------------------
# Workers, and waiting for a task's end in their logs


class LoggedWorkers(parallel_build.Workers):
    """parallel_build's workers, whose output lines are kept: ``wait_for(task_id)`` waits for
    Celery's line saying the task ended (``Task <name>[<id>] succeeded in <s>s: <result>``)."""

    def __enter__(self):
        self.lines = []  # (perf_counter when read, worker pid, line)
        self.condition = threading.Condition()
        return super().__enter__()

    def _drain(self, process, ready):
        for line in process.stdout:
            now = time.perf_counter()
            with self.condition:
                self.lines.append((now, process.pid, line.rstrip()))
                self.condition.notify_all()
            if " ready." in line:
                ready.set()
            if "ERROR" in line or "Traceback" in line:
                print(f"  worker: {line.rstrip()}", file=sys.stderr)

    def wait_for(self, task_id, timeout):
        """``(perf_counter of the line, the line, succeeded)`` of the task's end."""
        ended = re.compile(rf"\[{re.escape(task_id)}\] (succeeded in|raised|failed|retry)")
        deadline = time.monotonic() + timeout
        seen = 0
        with self.condition:
            while True:
                for when, _pid, line in self.lines[seen:]:
                    match = ended.search(line)
                    if match:
                        return when, line, match.group(1) == "succeeded in"
                seen = len(self.lines)
                if any(process.poll() is not None for process in self.processes):
                    raise RuntimeError("a worker exited during the run")
                if not self.condition.wait(max(0.0, min(5.0, deadline - time.monotonic()))) and time.monotonic() > deadline:
                    raise TimeoutError(f"task {task_id} did not end in {timeout} s")

    def share_jobs(self):
        """Parts done by each worker in its ``resourcesync.share_job`` tasks: {pid: parts}."""
        done = {process.pid: 0 for process in self.processes}
        pattern = re.compile(r"Task resourcesync\.share_job\[[^]]+\] succeeded in [0-9.e-]+s: (\d+)")
        for _when, pid, line in self.lines:
            match = pattern.search(line)
            if match:
                done[pid] += int(match.group(1))
        return done


def worker_run(cfg, count, set_id, timeout):
    """Send the reconcile to ``count`` fresh workers; time it from sending to its log line."""
    from celery import Celery

    client = Celery("bench-client", broker=cfg["broker_url"])
    with LoggedWorkers(cfg, count) as workers:
        ticks = cpu_ticks()
        started = time.perf_counter()
        sent = client.send_task("resourcesync.reconcile_set", args=[set_id])
        ended, line, succeeded = workers.wait_for(sent.id, timeout)
        busy = cpus_busy_between(ticks, cpu_ticks())
        seconds = ended - started
        owner, received = next((pid, when) for when, pid, text in workers.lines if f"[{sent.id}]" in text)
        parts = workers.share_jobs()
        # When the other worker received its first range task: after the plan and the sending.
        helper = [when for when, pid, text in workers.lines
                  if pid != owner and "resourcesync.share_job[" in text and " received" in text]
    client.close()
    runtime = re.search(r"succeeded in ([0-9.e-]+)s", line)
    counts = dict((name, int(value)) for value, name in re.findall(r"(\d+) (created|updated|deleted|unchanged|skipped)", line))
    return {
        "seconds": seconds,
        "cpus_busy": busy,
        "task_seconds": float(runtime.group(1)) if runtime else None,
        "succeeded": succeeded,
        "line": line[-300:],
        "counts": counts,
        "helper_parts": sum(done for pid, done in parts.items() if pid != owner),
        "received": received - started,
        "helper_received": helper[0] - started if helper else None,
        "owner_helper_parts": parts.get(owner, 0),  # the owner's own share_job tasks, after its reconcile
    }


# --------------------------------------------------------------------------------------------
# The machine's load


def cpu_ticks():
    """``(all ticks, idle ticks)`` of the machine's CPUs so far, from /proc/stat (idle counts
    the time waiting on I/O); ``None`` where it cannot be read."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except OSError:
        return None
    return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0)


def cpus_busy_between(before, after):
    """CPUs busy on average between two ``cpu_ticks()`` samples."""
    if before is None or after is None or after[0] == before[0]:
        return 0.0
    total = after[0] - before[0]
    return (total - (after[1] - before[1])) / total * (os.cpu_count() or 1)


def busy_cpus(seconds=1.0):
    """CPUs busy (not idle, not waiting on I/O) over the next ``seconds``."""
    before = cpu_ticks()
    time.sleep(seconds)
    return cpus_busy_between(before, cpu_ticks())


def wait_for_quiet(max_load, max_wait, *, use_loadavg):
    """Wait while the 1-minute load average (``use_loadavg``) or the CPUs busy right now exceed
    ``max_load``, at most ``max_wait`` seconds; returns (seconds waited, load average after)."""
    started = time.monotonic()
    announced = False
    while True:
        load = os.getloadavg()[0]
        busy = load if use_loadavg else busy_cpus()
        if busy <= max_load or time.monotonic() - started >= max_wait:
            waited = time.monotonic() - started
            if announced:
                state = "fell" if busy <= max_load else f"did not fall in {max_wait:.0f} s; going on"
                progress(f"  waited {waited:.0f} s for the machine to be quiet ({state}: "
                         f"{'load average' if use_loadavg else 'CPUs busy'} {busy:.2f})")
            return waited, os.getloadavg()[0]
        if not announced:
            progress(f"  {'1-minute load average' if use_loadavg else 'CPUs busy'} {busy:.2f} > {max_load}: waiting")
            announced = True
        time.sleep(5)


# --------------------------------------------------------------------------------------------
# Reporting


def us(seconds, n):
    return seconds / n * 1e6


def median_run(runs):
    return sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]


def line(label, n, result):
    extra = []
    if result.get("task_seconds") is not None:
        extra.append(f"task {result['task_seconds']:.2f} s in the worker")
    if result.get("cpus_busy") is not None:
        extra.append(f"CPUs busy {result['cpus_busy']:.2f} of {os.cpu_count()}")
    if result.get("helper_received") is not None:
        extra.append(f"2nd worker's first range task at {result['helper_received']:.2f} s, "
                     f"{result['helper_parts']} ranges done by it")
    if "load" in result:
        extra.append(f"load {result['load']:.2f}" + (f", waited {result['waited']:.0f} s" if result.get("waited") else ""))
    extra = f"  ({'; '.join(extra)})" if extra else ""
    return f"  {label:<24} {result['seconds']:>8.2f} s  {us(result['seconds'], n):>7.2f} µs/resource{extra}"


def check_line(label, result):
    changed = result["changed"]
    events = result["events"]
    updated = events.get("updated", 0)
    counted = result["counts"].get("updated", 0)
    others = {name: value for name, value in events.items() if name != "updated" and value}
    ok = updated == changed and counted == changed and not others and not result.get("parts_left")
    left = f", SharedPart rows left {result['parts_left']}" if "parts_left" in result else ""
    return (f"  check {label}: {changed:,} changed -> {updated:,} 'updated' events, counts say {counted:,} updated"
            f"{', other events ' + str(others) if others else ''}{left} -> {'OK' if ok else 'MISMATCH'}")


def report_variant(title, n, runs, in_process, raw):
    print(title)
    for count in (1, 2):
        for number, result in enumerate(runs[count], start=1):
            print(line(f"{count} worker{'s' if count > 1 else ''} #{number}", n, result))
    for number, result in enumerate(in_process, start=1):
        print(line(f"in process #{number}", n, result))
    for number, result in enumerate(raw, start=1):
        print(line(f"raw cursor read #{number}", n, result))
    one, two = median_run(runs[1])["seconds"], median_run(runs[2])["seconds"]
    speedup = one / two
    print(f"  medians of {len(runs[1])}: 1 worker {one:.2f} s ({us(one, n):.2f} µs/resource), "
          f"2 workers {two:.2f} s ({us(two, n):.2f} µs/resource)"
          + (f", in process {median_run(in_process)['seconds']:.2f} s" if in_process else "")
          + (f", raw read {median_run(raw)['seconds']:.2f} s" if raw else ""))
    print(f"  1 worker / 2 workers: {speedup:.2f}x  (target >= {TARGET_SPEEDUP}x: "
          f"{'met' if speedup >= TARGET_SPEEDUP else 'NOT met'}); best runs "
          f"{min(r['seconds'] for r in runs[1]) / min(r['seconds'] for r in runs[2]):.2f}x")
    if in_process:
        print(f"  in process / 1 worker: {median_run(in_process)['seconds'] / one:.2f}x as fast; "
              f"in process / 2 workers: {median_run(in_process)['seconds'] / two:.2f}x")
    for count in (1, 2):
        for number, result in enumerate(runs[count], start=1):
            print(check_line(f"{count} worker{'s' if count > 1 else ''} #{number}", result))
    for number, result in enumerate(in_process, start=1):
        print(check_line(f"in process #{number}", result))
    return speedup


def report_phases(label, phases, measured):
    t, parts = phases["timings"], phases["parts"]
    ranges_total = sum(part["seconds"] for part in parts)
    locked = sum(part["apply"] for part in parts)
    # The task's worker counts the set once no range is left that it could take: with one
    # worker after the ranges, with two beside the other's last range. It searches for gone
    # records only where the records outnumber the objects (some were found gone).
    searched = t["gone"] if phases["gone"] else 0.0
    serial = t["pending"] + t["plan"] + t["left_out"] + t["count"] + searched
    # Two workers: the ranges dealt as they come to whichever is free first (the owner starts
    # after the plan, the helper when its task arrives: about the same time); the batches
    # written under the set's lock cannot overlap, whichever worker writes them.
    loads = [0.0, 0.0]
    for seconds in (part["seconds"] for part in parts):
        loads[loads.index(min(loads))] += seconds
    one = serial + ranges_total
    two = serial - t["count"] + max(max(loads), min(loads) + t["count"], locked)
    print(f"Where the time goes, {label}: the pieces timed one after the other in process "
          f"({phases['ranges']} ranges of up to {phases['range_size']:,}, the last open above):")
    print(f"  pending changes {t['pending']:.2f} s; plan (_key_ranges) {t['plan']:.2f} s; "
          f"gone records (_gone_keys) {t['gone']:.2f} s ({phases['gone']} gone; searched only then); "
          f"left-out {t['left_out']:.3f} s; the set's count() {t['count']:.2f} s [the URLconf loaded at a fresh worker's first "
          f"describe, under the lock: {t['urlconf']:.2f} s]")
    print(f"  ranges: {ranges_total:.2f} s in all, each {min(p['seconds'] for p in parts):.2f}-"
          f"{max(p['seconds'] for p in parts):.2f} s; of which "
          f"the batches written under the set's lock {locked:.2f} s ({sum(p['updated'] for p in parts):,} updated)")
    print(f"  serial part (pending + plan + left-out + count, and the gone search if any is gone; with two workers "
          f"the count goes beside the other's last range): {serial:.2f} s = "
          f"{serial / one:.0%} of one worker's work"
          + (f"; under the set's lock, serial across workers: {locked:.2f} s = {locked / one:.0%}" if locked else ""))
    print(f"  predicted: 1 worker {one:.2f} s, 2 workers {two:.2f} s -> {one / two:.2f}x "
          f"(measured medians {measured[1]:.2f} s and {measured[2]:.2f} s -> {measured[1] / measured[2]:.2f}x); "
          f"the parts alone {ranges_total / max(max(loads), locked):.2f}x")


def run(options):
    n_asked = options.resources
    var_dir = options.reuse or tempfile.mkdtemp(prefix="parallel-reconcile-")
    keep = options.keep or bool(options.reuse)
    pgoptions = " ".join(
        ([f"-c jit={options.pg_jit}"] if options.pg_jit != "server" else [])
        + ([f"-c max_parallel_workers_per_gather={options.pg_gather}"] if options.pg_gather is not None else [])
    ) or None
    cfg = {"var_dir": var_dir, "database_url": options.database_url, "broker_url": options.broker_url, "pgoptions": pgoptions}
    local = {**cfg, "broker_url": None}  # children that run everything in process
    if not options.reuse:
        recreate_database(options.database_url)
    purge_broker(options.broker_url)
    try:
        if options.reuse:
            seeded = json.loads((Path(var_dir) / "seeded.json").read_text())
            progress(f"reusing the {seeded['resources']:,} resources seeded in {var_dir} and {options.database_url}")
        else:
            progress(f"seeding {n_asked:,} resources of the '{SLUG}' set into PostgreSQL ({var_dir})")
            seeded = run_child("seed", var_dir, local, n_asked, options.file_size)
            (Path(var_dir) / "seeded.json").write_text(json.dumps(seeded))
        n = seeded["resources"]
        progress(f"seeded {seeded['items']:,} items and {seeded['files']:,} files in {seeded['seed_seconds']:.0f} s, "
                 f"first reconcile {seeded['reconcile_seconds']:.0f} s, VACUUM ANALYZE {seeded['vacuum_seconds']:.0f} s")

        waited, load = wait_for_quiet(options.max_load, options.max_wait, use_loadavg=True)
        start_load = {"load": load, "waited": waited}
        runs = {"unchanged": {1: [], 2: []}, "changed": {1: [], 2: []}}
        in_process = {"unchanged": [], "changed": []}
        raw = []
        timeout = max(600, n / 1000)

        def step(variant, label, measure):
            """Change the 1% (the "changed" variant: to the other type or back), wait for a quiet
            machine, ``measure()``, then check (and vacuum after a change)."""
            change = variant == "changed"
            state = run_child("change", var_dir, local, change)
            waited, load = wait_for_quiet(options.max_load, options.run_wait, use_loadavg=False)
            progress(f"{label}, {variant} (load {load:.2f})")
            result = measure()
            result.update(run_child("check", var_dir, local, state["last_event"], bool(change)))
            result.update(load=load, waited=waited, changed=state["changed"])
            progress(f"  {result['seconds']:.2f} s; {str(result.get('line', result.get('counts', '')))[-110:]}")
            return result

        for round_number in range(options.repeat):
            order = (1, 2) if round_number % 2 == 0 else (2, 1)
            label = f"round {round_number + 1}"
            for variant in ("unchanged", "changed"):
                for count in order:
                    def on_workers(count=count):
                        result = worker_run(cfg, count, seeded["set_id"], timeout)
                        purge_broker(options.broker_url)
                        if not result["succeeded"]:
                            print(f"  the task failed: {result['line']}", file=sys.stderr)
                        return result

                    runs[variant][count].append(step(variant, f"{label}: {count} worker(s)", on_workers))
                in_process[variant].append(
                    step(variant, f"{label}: in process", lambda: run_child("in_process", var_dir, local, 0))
                )
            waited, load = wait_for_quiet(options.max_load, options.run_wait, use_loadavg=False)
            result = run_child("raw", var_dir, local)
            result.update(load=load, waited=waited)
            raw.append(result)
            progress(f"{label}: raw cursor read {result['seconds']:.2f} s, {result['rows']:,} rows (load {load:.2f})")
        phases = {}
        if options.phases:
            for variant in ("unchanged", "changed"):
                progress(f"phases, {variant}")
                change = variant == "changed"
                state = run_child("change", var_dir, local, change)
                phases[variant] = run_child("phases", var_dir, local, options.profile)
                phases[variant]["changed"] = state["changed"]
                run_child("check", var_dir, local, state["last_event"], bool(change))

        changed = runs["changed"][1][0]["changed"]
        print()
        print(f"Parallel reconcile benchmark: {n:,} resources of the '{SLUG}' set ({seeded['items']:,} items), "
              f"measured {time.strftime('%Y-%m-%d %H:%M')} (Python {sys.version.split()[0]}, {os.cpu_count()} CPUs)")
        print(f"PostgreSQL {seeded['db_version']} {options.database_url.rsplit('@', 1)[-1]} "
              f"(in the sessions: {', '.join(f'{k}={v}' for k, v in raw[0]['settings'].items())}; "
              f"PGOPTIONS {pgoptions or 'none'}), Redis {options.broker_url}; "
              f"{options.repeat} round(s)")
        print(f"Setup (not timed): seeding {seeded['seed_seconds']:.0f} s, first reconcile {seeded['reconcile_seconds']:.0f} s "
              f"({seeded['counts']}), VACUUM ANALYZE {seeded['vacuum_seconds']:.0f} s")
        print(f"Load average before the timing: {start_load['load']:.2f}"
              + (f" (waited {start_load['waited']:.0f} s for it to fall to {options.max_load})" if start_load["waited"] else "")
              + f"; at the runs {min(r['load'] for r in all_runs(runs, in_process, raw)):.2f}-"
              f"{max(r['load'] for r in all_runs(runs, in_process, raw)):.2f}; "
              f"waited before runs {sum(r['waited'] for r in all_runs(runs, in_process, raw)):.0f} s in all")
        print()
        speedups = {}
        speedups["unchanged"] = report_variant("Unchanged: nothing changed since the last reconcile", n,
                                               runs["unchanged"], in_process["unchanged"], raw)
        print()
        title = f"1% changed: {changed:,} files' media_type changed by queryset.update() before each run"
        speedups["changed"] = report_variant(title, n, runs["changed"], in_process["changed"], [])
        print()
        for variant, label in (("unchanged", "unchanged"), ("changed", "1% changed")):
            if variant in phases:
                measured = {count: median_run(runs[variant][count])["seconds"] for count in (1, 2)}
                report_phases(label, phases[variant], measured)
        print()
        print("Target: 2 workers at least 1.7x as fast as 1 -> "
              + "; ".join(f"{variant} {value:.2f}x {'met' if value >= TARGET_SPEEDUP else 'NOT met'}"
                          for variant, value in speedups.items()))
        if options.plans and phases:
            for name, plan in phases["unchanged"]["plans"].items():
                print(f"\nEXPLAIN ANALYZE, {name}:\n{plan}")
        if options.profile and phases.get("changed", {}).get("profile"):
            print("\ncProfile of the batches written under the set's lock, 1% changed (in process):")
            print(phases["changed"]["profile"])
    finally:
        purge_broker(options.broker_url)
        if keep:
            print(f"Kept: {var_dir} and {options.database_url} (--reuse {var_dir} runs on them again)", file=sys.stderr)
        else:
            recreate_database(options.database_url, create=False)
            shutil.rmtree(var_dir, ignore_errors=True)


def all_runs(runs, in_process, raw):
    for variant in runs.values():
        for results in variant.values():
            yield from results
    for results in in_process.values():
        yield from results
    yield from raw


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resources", type=int, default=1_000_000, help="N, files of the set (default 1,000,000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the timed steps (default 3)")
    parser.add_argument("--file-size", type=int, default=0, help="bytes of each seeded file (default 0)")
    parser.add_argument("--database-url", default="postgres://postgres:postgres@127.0.0.1:5432/bench_parallel_reconcile",
                        help="postgres://... (dropped and created; default %(default)s)")
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/14", help="Redis (flushed; default %(default)s)")
    parser.add_argument("--pg-jit", choices=["server", "off", "on"], default="server",
                        help="PostgreSQL JIT for every session: the server's setting (default), or off or on (PGOPTIONS)")
    parser.add_argument("--pg-gather", type=int, metavar="N",
                        help="max_parallel_workers_per_gather for every session (PGOPTIONS; default: the server's)")
    parser.add_argument("--max-load", type=float, default=0.5, help="wait while the machine is busier (default 0.5)")
    parser.add_argument("--max-wait", type=float, default=600,
                        help="wait at most this many seconds for the load average before the timing (default 600)")
    parser.add_argument("--run-wait", type=float, default=120,
                        help="wait at most this many seconds for idle CPUs before each run (default 120)")
    parser.add_argument("--no-phases", dest="phases", action="store_false", help="skip the in-process timing of the pieces")
    parser.add_argument("--plans", action="store_true",
                        help="print EXPLAIN ANALYZE of a range's query and of the gone-records query")
    parser.add_argument("--profile", action="store_true", help="cProfile the batches written under the set's lock")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory and the database")
    parser.add_argument("--reuse", metavar="VAR_DIR",
                        help="skip the setup: run on the directory and database an earlier --keep left (kept again)")
    add_child_arguments(parser, CHILDREN)
    options = parser.parse_args()
    if run_as_child(options, CHILDREN):
        return
    run(options)


if __name__ == "__main__":
    main()
