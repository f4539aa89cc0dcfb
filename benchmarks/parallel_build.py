"""Benchmark: a parallel Resource List build of 1,000,000 resources, one worker against two.

Run from the repository root::

    .venv/bin/python benchmarks/parallel_build.py
    .venv/bin/python benchmarks/parallel_build.py --resources 200000 --repeat 1      # quicker
    .venv/bin/python benchmarks/parallel_build.py --database-url postgres://postgres:postgres@127.0.0.1:5432/bench_parallel

Setup (not timed): a temporary ``EXAMPLE_VAR_DIR`` (documents, the SQLite database), and the
PostgreSQL database of ``--database-url``, which the script drops and creates (and drops again
at the end unless ``--keep``). Both databases are migrated and get the same N ``Resource`` rows of
one set, as ``resourcelist_build.py`` seeds them (the rows that reconcile would have written,
each with its rendered ``<url>``); the PostgreSQL table is then vacuumed and analyzed, as
autovacuum would do after such a load.

Then it times, each in its own child process:

- **PostgreSQL, 1 worker** and **PostgreSQL, 2 workers**: real ``celery -A example_project
  worker`` processes (``--pool=solo``: one process, one task at a time each) on the Redis broker
  of ``--broker-url``, started before the step and stopped after it. The child calls
  ``rebuild_set(resource_set, only=["resourcelist"], refresh=False, parallel=True)``, as the
  ``resourcesync.rebuild_set`` task does in a worker (without the reconcile: the rows are
  current): it takes the build lock, plans the parts (N / 50,000 key ranges) and sends one
  ``resourcesync.build_part`` task per part; the workers render them, and the one that renders
  the last part sends ``resourcesync.finish_build``, which writes the index and publishes the
  build. The time runs from the call until the build is published (the child polls the database
  every 20 ms), and is split into the part in the child (snapshot, count, plan, sending) and the
  rest;
- **PostgreSQL, in process** and **SQLite, in process**: ``build_resourcelist(resource_set,
  refresh=False)`` in the child, the same parts rendered one after the other, no Celery.

``--repeat R`` runs the worker steps R times, alternating which goes first, and reports each run
and the median. After the runs it checks the last build of each kind: published, the index in
storage, as many parts as planned and N entries. Nothing is asserted: the script prints seconds
and ratios (two workers against one, PostgreSQL against SQLite) and the target (two workers at
least 1.7x as fast as one).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _steps
import resourcelist_build
from _steps import add_child_arguments, run_as_child
from changes import purge_broker, recreate_database

ROOT = Path(__file__).resolve().parent.parent
SLUG = resourcelist_build.SLUG
TARGET_SPEEDUP = 1.7


# --------------------------------------------------------------------------------------------
# Children. ``cfg`` is {"var_dir", "database_url", "broker_url", "pgoptions"}; no database_url
# means the SQLite database in var_dir.


def environment(cfg):
    """The environment of a child or a worker: the demo project on the chosen services."""
    env = dict(os.environ, EXAMPLE_VAR_DIR=cfg["var_dir"], DJANGO_SETTINGS_MODULE="example_project.settings")
    for name, value in (
        ("DATABASE_URL", cfg["database_url"]), ("CELERY_BROKER_URL", cfg["broker_url"]), ("PGOPTIONS", cfg["pgoptions"])
    ):
        if value:
            env[name] = value
        else:
            env.pop(name, None)
    env.pop("CELERY_RESULT_BACKEND", None)
    return env


def setup_django(cfg):
    os.environ.clear()
    os.environ.update(environment(cfg))
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def child_seed(cfg, n):
    """Migrate and seed N rows, as resourcelist_build.py does (its Django setup is ours here)."""
    setup_django(cfg)
    from django.db import connection

    resourcelist_build.setup_django = lambda var_dir: None
    seeded = resourcelist_build.child_seed(cfg["var_dir"], n)
    if connection.vendor == "postgresql":
        # What autovacuum does after a bulk load: statistics, and the visibility map that lets
        # the parts be planned from the (set, key) index alone.
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM ANALYZE {seeded['table']}")
    return seeded


def child_build(cfg, parallel):
    """Time one full Resource List build; ``parallel``: on the running workers."""
    setup_django(cfg)
    from django.db import connection

    from django_resourcesync.builders.resourcelist import build_resourcelist
    from django_resourcesync.models import Build, ResourceSet
    from django_resourcesync.rebuild import rebuild_set

    resource_set = ResourceSet.objects.get(slug=SLUG)
    # Older builds go now, so that no timed build spends time pruning them when it publishes.
    Build.objects.filter(resource_set=resource_set).exclude(status=Build.Status.PUBLISHED).delete()
    started = time.perf_counter()
    if parallel:
        (build,) = rebuild_set(resource_set, only=["resourcelist"], refresh=False, parallel=True)
        sent = time.perf_counter()
        while Build.objects.values_list("status", flat=True).get(pk=build.pk) == Build.Status.RUNNING:
            time.sleep(0.02)
    else:
        build = build_resourcelist(resource_set, refresh=False)
        sent = time.perf_counter()
    seconds = time.perf_counter() - started
    build = Build.objects.get(pk=build.pk)
    return {
        "seconds": seconds,
        "in_child": sent - started,
        "vendor": connection.vendor,
        **check(build),
    }


def check(build):
    """What the build published: status, index in storage, parts, entries."""
    from django_resourcesync import storage
    from django_resourcesync.builders.resourcelist import NAME
    from django_resourcesync.models import Document

    documents = Document.objects.filter(build=build)
    index = documents.filter(name=NAME).first()
    return {
        "build": build.pk,
        "status": build.status,
        "error": build.error[-500:],
        "entries": build.entries,
        "index_in_storage": bool(index) and storage.get_storage().exists(index.storage_name),
        "parts_planned": build.parts.count(),
        "part_documents": documents.exclude(name=NAME).count(),
        "part_entries": sum(documents.exclude(name=NAME).values_list("entries", flat=True)),
    }


CHILDREN = {"seed": child_seed, "build": child_build}


def run_child(role, result_dir, *args):
    return _steps.run_child(__file__, role, result_dir, *args)


# --------------------------------------------------------------------------------------------
# Workers


class Workers:
    """``with Workers(cfg, k):`` k worker processes, ready to take tasks."""

    def __init__(self, cfg, count):
        self.cfg, self.count = cfg, count

    def __enter__(self):
        self.processes = []
        ready = []
        for number in range(self.count):
            process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "example_project", "worker", "--pool=solo", "-n", f"bench{number}@%h",
                 "--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"],
                cwd=ROOT, env=environment(self.cfg), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            event = threading.Event()
            threading.Thread(target=self._drain, args=(process, event), daemon=True).start()
            self.processes.append(process)
            ready.append(event)
        for event in ready:
            if not event.wait(120):
                raise RuntimeError("a worker did not start")
        return self

    @staticmethod
    def _drain(process, ready):
        for line in process.stdout:
            if " ready." in line:
                ready.set()
            if "ERROR" in line or "Traceback" in line:
                print(f"  worker: {line.rstrip()}", file=sys.stderr)

    def __exit__(self, *exc_info):
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait(timeout=120)
        return False


# --------------------------------------------------------------------------------------------
# Reporting


def progress(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def line(label, n, result):
    extra = f"  (plan and send in the caller {result['in_child']:.2f} s)" if result.get("parallel") else ""
    return f"  {label:<26} {result['seconds']:>7.2f} s  {n / result['seconds']:>10,.0f} resources/s{extra}"


def check_line(label, n, result):
    ok = (
        result["status"] == "published" and result["index_in_storage"] and result["entries"] == n
        and result["part_entries"] == n and result["part_documents"] == result["parts_planned"]
    )
    return (f"  check {label}: build #{result['build']} {result['status']}; index in storage: {result['index_in_storage']}; "
            f"{result['parts_planned']} parts planned, {result['part_documents']} part documents, "
            f"{result['part_entries']:,} entries -> {'OK' if ok else 'MISMATCH ' + result['error']}")


def run(options):
    n = options.resources
    var_dir = tempfile.mkdtemp(prefix="parallel-bench-")
    pgoptions = "-c jit=off" if options.pg_jit == "off" else None
    pg = {"var_dir": var_dir, "database_url": options.database_url, "broker_url": options.broker_url, "pgoptions": pgoptions}
    lite = {"var_dir": var_dir, "database_url": None, "broker_url": None, "pgoptions": None}
    jit = recreate_database(options.database_url)
    purge_broker(options.broker_url)
    try:
        print(f"Parallel Resource List build benchmark: {n:,} resources  "
              f"(Python {sys.version.split()[0]}, {os.cpu_count()} CPUs)")
        print(f"PostgreSQL {options.database_url.rsplit('@', 1)[-1]} "
              f"(jit={'off, set by --pg-jit off' if pgoptions else jit + ', the server setting'}), "
              f"Redis {options.broker_url}; documents in {var_dir}")
        progress(f"seeding {n:,} rows into PostgreSQL")
        seeded = run_child("seed", var_dir, pg, n)
        progress(f"seeded in {seeded['seconds']:.0f} s; seeding SQLite")
        seeded_lite = run_child("seed", var_dir, lite, n)
        progress(f"seeded in {seeded_lite['seconds']:.0f} s")

        runs = {1: [], 2: []}
        for round_number in range(options.repeat):
            for count in ((1, 2) if round_number % 2 == 0 else (2, 1)):
                progress(f"round {round_number + 1}: {count} worker(s)")
                with Workers(pg, count):
                    result = run_child("build", var_dir, pg, True)
                purge_broker(options.broker_url)
                runs[count].append({**result, "parallel": True})
                progress(f"  {result['seconds']:.2f} s ({result['status']})")
        progress("PostgreSQL, in process")
        in_process = run_child("build", var_dir, {**pg, "broker_url": None}, False)
        progress("SQLite, in process")
        sqlite = run_child("build", var_dir, lite, False)

        median = {count: sorted(results, key=lambda r: r["seconds"])[len(results) // 2] for count, results in runs.items()}
        print()
        for count in (1, 2):
            for number, result in enumerate(runs[count], start=1):
                print(line(f"PostgreSQL, {count} worker{'s' if count > 1 else ''} #{number}", n, result))
        print(line("PostgreSQL, in process", n, in_process))
        print(line("SQLite, in process", n, sqlite))
        print()
        print(f"Medians of {options.repeat} run(s): 1 worker {median[1]['seconds']:.2f} s, "
              f"2 workers {median[2]['seconds']:.2f} s")
        speedup = median[1]["seconds"] / median[2]["seconds"]
        print(f"  2 workers / 1 worker: {speedup:.2f}x as fast  "
              f"(target >= {TARGET_SPEEDUP}x: {'met' if speedup >= TARGET_SPEEDUP else 'NOT met'})")
        print(f"  best runs: {min(r['seconds'] for r in runs[1]) / min(r['seconds'] for r in runs[2]):.2f}x")
        print(f"  SQLite in process / PostgreSQL 1 worker: {median[1]['seconds'] / sqlite['seconds']:.2f}x as fast;  "
              f"/ PostgreSQL 2 workers: {median[2]['seconds'] / sqlite['seconds']:.2f}x;  "
              f"/ PostgreSQL in process: {in_process['seconds'] / sqlite['seconds']:.2f}x")
        print(f"  PostgreSQL: 1 worker / in process: {in_process['seconds'] / median[1]['seconds']:.2f}x as fast "
              f"(the cost of the tasks and the broker)")
        print()
        for label, result in (("1 worker", runs[1][-1]), ("2 workers", runs[2][-1]), ("PostgreSQL in process", in_process),
                              ("SQLite in process", sqlite)):
            print(check_line(label, n, result))
        print(f"  the resource counts: PostgreSQL {seeded['rows']:,}, SQLite {seeded_lite['rows']:,}")
    finally:
        purge_broker(options.broker_url)
        if not options.keep:
            recreate_database(options.database_url, create=False)
            shutil.rmtree(var_dir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resources", type=int, default=1_000_000, help="N (default 1,000,000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each worker step (default 3)")
    parser.add_argument("--database-url", default="postgres://postgres:postgres@127.0.0.1:5432/bench_parallel",
                        help="postgres://... (dropped and created; default %(default)s)")
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/11", help="Redis (flushed; default %(default)s)")
    parser.add_argument("--pg-jit", choices=["server", "off"], default="server",
                        help="PostgreSQL JIT for every session: the server's setting (default), or off (PGOPTIONS=-c jit=off)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory and the database")
    add_child_arguments(parser, CHILDREN)
    options = parser.parse_args()
    if run_as_child(options, CHILDREN):
        return
    run(options)


if __name__ == "__main__":
    main()
