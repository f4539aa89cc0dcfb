"""Benchmark: a whole ``resourcesync_rebuild`` of one set, as a user runs it, against ``resync``.

Run from the repository root::

    .venv/bin/python benchmarks/rebuild.py                          # SQLite, sizes 100000,1000000
    .venv/bin/python benchmarks/rebuild.py --sizes 20000            # a quick run
    .venv/bin/python benchmarks/rebuild.py --database-url postgres://postgres:postgres@127.0.0.1:5432/bench_rebuild

For each size N, in a fresh temporary ``EXAMPLE_VAR_DIR`` (and, with ``--database-url``, a
PostgreSQL database dropped and created: give it a throwaway name), the script:

1. seeds the example repository (not timed, its rate printed): ``seed_repository``'s
   ``add_items(items, file_size=64, track=False)``, with the number of items that gives the
   ``bitstreams`` set exactly N files (an item has one file, every third one two), and gives the
   set the capabilities ``resourcelist`` and ``changelist``. Nothing is recorded yet. The set is
   the example's files, not its ``metadata`` records (whose first record renders the site's view
   once per item). ``add_items`` is called without tracking: the command ``seed_repository``
   tells change tracking of every item and file. The seeded state is kept (the SQLite file
   copied, or a PostgreSQL database made from it as a template);
2. **the first publication**, ``--first-rounds`` paired rounds (default 3), each from the seeded
   state put back: ``manage.py resourcesync_rebuild --set bitstreams`` with nothing recorded
   (every file read and hashed md5 and sha-256, every entry rendered and recorded, the Resource
   List published), and ``resync-build --write-resourcelist --hash md5 --hash sha-256`` over
   the same files (its script loaded first, as Django is set up first for ours, then its
   ``main()`` timed), which of the two goes first alternating; the ratio is taken per round;
3. **republishing with little changed** (what a nightly rebuild does), ``--repeat`` turns
   (default 3): the command with nothing changed since (pending changes, the reconcile, the
   Resource List rebuilt and published, the Change List closed if due, the storage sweep; the
   time split comes from timers wrapped around the functions the command calls), then with 1%
   of the files changed (every 100th by key, the next one each turn) by
   ``queryset.update(media_type=..., modified=Now())``, which sends no signal (not timed), so
   that the reconcile must find them; the change events it wrote are counted; then ``resync``
   (the reference library) making and writing a Resource List of the same N entries from the
   set's ``Resource`` rows, streamed from a cursor (its peak RSS is then its own, not that of
   a list of every row made first); the rows are read once alone before, and that read is
   taken off its time. The reconcile's µs per resource is printed beside the raw cursor read
   of the rows it compares (in a child, best of 2).

Every step runs in its own child process (this script re-run with ``--child``), so each peak
RSS (``ru_maxrss``) is that step's own. It prints per N our wall and CPU seconds, µs per
resource and peak RSS, resync's, the ratio resync time / our time, our peak RSS (target under
200 MB), a linearity line (µs per resource at the largest N relative to the smallest), and a
closing table per N with one row each for the first publication (target at least 1.5x
resync-build), the rebuild with nothing changed and with 1% changed (target at least 3x resync;
and at most 0.2 ms a changed file): ours, resync, the ratio (median of the rounds, min to max),
the cost per file and the peak RSS of each. Nothing is asserted. ``--profile auto`` (the default) runs the rebuild twice more
under cProfile at the largest N when the ratio there is below target (``always`` / ``never``):
with nothing changed, then with another 1% of the files changed. ``--keep`` keeps the directory
and database; ``--skip-resync`` skips resync and resync-build. On a machine whose speed drifts by tens of
percent from one minute to the next, one round's ratio can be off by as much: read the medians
of the paired rounds.
"""

import argparse
import io
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _steps
from _steps import add_child_arguments, current_rss_kib, mib, peak_rss_kib, run_as_child

SLUG = "bitstreams"
CAPABILITIES = ["resourcelist", "changelist"]
FILE_SIZE = 64
CHANGED_EVERY = 100  # 1% of the files
CHANGED_MEDIA_TYPE = "application/octet-stream"
BASE_URL = "http://127.0.0.1:8000"  # the example's default RESOURCESYNC["BASE_URL"]

TARGET_RATIO = 3.0
TARGET_FIRST_RATIO = 1.5
TARGET_PEAK_MB = 200.0
TARGET_RECONCILE_US = 5.0

OURS = "resourcesync_rebuild"
RESYNC = "resync"

CHOICE = (
    f"set '{SLUG}' (the example's files, {FILE_SIZE}-byte files): its first publication reads and hashes each file;"
    " then republishing it with nothing, or 1%, changed (what a nightly rebuild does)"
)


def items_for(n):
    """The fewest items whose files are at least ``n`` (item k has two files when k % 3 == 0)."""
    items = max(0, (3 * n) // 4 - 2)
    while items + items // 3 < n:
        items += 1
    return items


# --------------------------------------------------------------------------------------------
# Children: each runs one step in a fresh interpreter and writes a JSON result file.
# ``cfg`` is {"var_dir", "database_url"}.


def setup_django(cfg):
    _steps.setup_django_example(cfg["var_dir"], cfg["database_url"])


def cpu_seconds():
    """CPU seconds of this process so far, every thread's, user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --------------------------------------------------------------------------------------------
# The state before a first publication, kept and put back for each round of it.

SNAPSHOT = "seeded"


def snapshot(cfg):
    """Keep the seeded state (nothing recorded): the SQLite file copied, or a PostgreSQL
    database made from this one as a template."""
    if cfg["database_url"]:
        _pg_copy(cfg["database_url"], _suffixed(cfg["database_url"]), from_url=cfg["database_url"])
    else:
        var_dir = Path(cfg["var_dir"])
        shutil.copyfile(var_dir / "db.sqlite3", var_dir / f"{SNAPSHOT}.sqlite3")


def restore(cfg):
    """Put the seeded state back (nothing recorded, no document stored): the database, and the
    app's storage emptied; the files (media) are the same."""
    var_dir = Path(cfg["var_dir"])
    shutil.rmtree(var_dir / "resourcesync", ignore_errors=True)
    if cfg["database_url"]:
        _pg_copy(_suffixed(cfg["database_url"]), cfg["database_url"], from_url=_suffixed(cfg["database_url"]))
    else:
        for suffix in ("-wal", "-shm"):
            (var_dir / f"db.sqlite3{suffix}").unlink(missing_ok=True)
        shutil.copyfile(var_dir / f"{SNAPSHOT}.sqlite3", var_dir / "db.sqlite3")


def drop_snapshot(cfg):
    if cfg["database_url"]:
        _steps.recreate_database(_suffixed(cfg["database_url"]), create=False)


def _suffixed(database_url):
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(database_url)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + f"_{SNAPSHOT}"))


def _pg_copy(source_url, target_url, *, from_url):
    """``target_url``'s database dropped and made again as a copy of ``source_url``'s."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg
    from psycopg import sql

    source, target = (urlsplit(url).path.lstrip("/") for url in (source_url, target_url))
    parts = urlsplit(from_url)
    with psycopg.connect(urlunsplit(("postgresql", parts.netloc, "/postgres", "", "")), autocommit=True) as connection:
        connection.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(target)))
        connection.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(target), sql.Identifier(source)))


def child_seed(cfg, n):
    """Migrate, add the items and files, and offer the set's capabilities (none of it timed):
    nothing is recorded yet, as before a first publication."""
    setup_django(cfg)
    from django.core.management import call_command
    from django.db import connection

    from django_resourcesync.models import ResourceSet
    from example_project.repository.management.commands.seed_repository import add_items
    from example_project.repository.models import ItemFile

    call_command("migrate", verbosity=0, interactive=False)
    items = items_for(n)
    started = time.perf_counter()
    add_items(items, file_size=FILE_SIZE, track=False)
    seeded = time.perf_counter() - started

    resource_set = ResourceSet.objects.get(slug=SLUG)
    resource_set.capabilities = CAPABILITIES
    resource_set.enabled = True
    resource_set.save(update_fields=["capabilities", "enabled"])
    vacuum = 0.0
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # What autovacuum does after a bulk load (statistics, visibility map), done now so
            # that it does not run during a timed step.
            started = time.perf_counter()
            cursor.execute("VACUUM ANALYZE")
            vacuum = time.perf_counter() - started
        else:  # the database in one file, to be copied for each round of the first publication
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return {
        "items": items,
        "files": ItemFile.objects.count(),
        "seed_seconds": seeded,
        "vacuum_seconds": vacuum,
        "vendor": connection.vendor,
    }


def instrument():
    """Wrap timers around what the command calls; returns ``{phase: seconds}``, filled as it runs.
    Phases nested in another are named with a leading '  '."""
    import importlib

    from django.urls.resolvers import URLResolver

    from django_resourcesync import sweep, tracking
    from django_resourcesync.builders import changelist, resourcelist
    from django_resourcesync.builders.context import BuildContext

    reconciling = importlib.import_module("django_resourcesync.tracking.reconcile")
    phases = {}

    def timed(owner, name, label, generator=False):
        original = getattr(owner, name)
        phases[label] = 0.0
        if generator:  # only the time spent inside the generator, not in its caller's loop
            def wrapper(*args, **kwargs):
                found = original(*args, **kwargs)
                while True:
                    started = time.perf_counter()
                    try:
                        item = next(found)
                    except StopIteration:
                        phases[label] += time.perf_counter() - started
                        return
                    phases[label] += time.perf_counter() - started
                    yield item
        else:
            def wrapper(*args, **kwargs):
                started = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    phases[label] += time.perf_counter() - started
        setattr(owner, name, wrapper)

    timed(tracking, "process_pending", "pending changes")
    timed(tracking, "reconcile", "reconcile")
    timed(reconciling, "_reconcile_in_database", "  fingerprints compared in the database, changed described")
    timed(reconciling, "_apply_batch", "    of which: changed objects described and written (the set locked)")
    timed(reconciling, "_objects_of", "    changed objects read (summed over the reading threads)")
    timed(reconciling, "_gone_keys", "  records whose object is gone (anti-join)", generator=True)
    timed(resourcelist, "update", "resourcelist")
    timed(resourcelist, "render_part", "  parts rendered and written (summed over threads)")
    timed(resourcelist, "finish", "  index written")
    timed(BuildContext, "publish", "  published")
    timed(changelist, "update", "changelist (close if due)")
    timed(sweep, "sweep", "storage sweep")

    # The site's URLconf (its views and their imports) is loaded by the first reverse(), inside
    # whichever phase makes it: a cost a user pays once per ``manage.py`` run, shown apart.
    label = "(inside the above) URLconf imported by the first reverse()"
    phases[label] = 0.0
    populate, depth = URLResolver._populate, [0]

    def populate_timed(self):
        depth[0] += 1
        started = time.perf_counter()
        try:
            return populate(self)
        finally:
            depth[0] -= 1
            if not depth[0]:
                phases[label] += time.perf_counter() - started

    URLResolver._populate = populate_timed
    return phases


def last_progress(text):
    """The last progress line of each phase the command's progress bar showed."""
    lines = {}
    for line in text.replace("\r", "\n").split("\n"):
        line = line.strip()
        if line and not line.startswith(("Built", "storage")):
            lines[line.split()[0]] = line
    return list(lines.values())


def child_rebuild(cfg, n):
    """Time ``manage.py resourcesync_rebuild --set bitstreams`` as a user runs it."""
    started = time.perf_counter()
    setup_django(cfg)
    from django.core.management import call_command

    from django_resourcesync.models import Build, ChangeEvent, Resource

    setup = time.perf_counter() - started
    phases = instrument()
    events = ChangeEvent.objects.filter(resource_set__slug=SLUG)
    last_event = events.order_by("-id").values_list("id", flat=True).first() or 0
    out, err = io.StringIO(), io.StringIO()
    baseline = current_rss_kib()
    cpu = cpu_seconds()
    started = time.perf_counter()
    call_command("resourcesync_rebuild", "--set", SLUG, stdout=out, stderr=err)
    seconds = time.perf_counter() - started
    cpu = cpu_seconds() - cpu
    peak = peak_rss_kib()

    new_events = list(events.filter(id__gt=last_event).values_list("change", flat=True))
    build = Build.objects.filter(resource_set__slug=SLUG, capability="resourcelist").order_by("-pk").first()
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "setup_seconds": setup,
        "baseline_kib": baseline,
        "peak_kib": peak,
        "phases": phases,
        "events": len(new_events),
        "event_kinds": {kind: new_events.count(kind) for kind in sorted(set(new_events))},
        "resources": Resource.objects.filter(resource_set__slug=SLUG).count(),
        "changed_in_record": Resource.objects.filter(resource_set__slug=SLUG, media_type=CHANGED_MEDIA_TYPE).count(),
        "build": [build.pk, build.status, build.entries, build.documents] if build else None,
        "stdout": out.getvalue().strip(),
        "progress": last_progress(err.getvalue()),
    }


def child_change(cfg, every, offset=0):
    """Change every ``every``-th file (from the ``offset``-th) through ``queryset.update()``: no
    signal, no pending change."""
    setup_django(cfg)
    from django.db import transaction
    from django.db.models.functions import Now

    from example_project.repository.models import ItemFile

    keys = list(ItemFile.objects.order_by("pk").values_list("pk", flat=True))[offset::every]
    started = time.perf_counter()
    updated = 0
    with transaction.atomic():
        for start in range(0, len(keys), 5000):
            batch = keys[start : start + 5000]
            updated += ItemFile.objects.filter(pk__in=batch).update(media_type=CHANGED_MEDIA_TYPE, modified=Now())
    return {"changed": updated, "seconds": time.perf_counter() - started}


def child_resync(cfg, n):
    """Time resync making and writing the Resource List from the set's rows, streamed from a
    cursor (as a publisher would feed it, so that its peak RSS is resync's own, not that of a
    list of every row made first); the rows are read once alone before, and that read is
    taken off its time (so the figure is resync's making and writing, as before)."""
    setup_django(cfg)
    from django_resourcesync.models import Resource

    rows = (
        Resource.objects.filter(resource_set__slug=SLUG)
        .order_by("pk")
        .values_list("uri", "lastmod", "md5", "sha256", "length", "media_type")
    )
    started = time.perf_counter()
    for _row in rows.iterator(chunk_size=5000):
        pass
    read = time.perf_counter() - started

    from resync.mapper import Mapper
    from resync.resource import Resource as ResyncResource
    from resync.resource_list import ResourceList

    out_dir = Path(cfg["var_dir"]) / "resync"
    out_dir.mkdir(exist_ok=True)
    basename = str(out_dir / "resourcelist.xml")
    mapper = Mapper([f"{BASE_URL}/resourcesync/{SLUG}/={out_dir}/"])

    baseline = current_rss_kib()
    cpu = cpu_seconds()
    started = time.perf_counter()
    resource_list = ResourceList(allow_multifile=True, mapper=mapper)
    for uri, lastmod, md5, sha256, length, media_type in rows.iterator(chunk_size=5000):
        resource_list.add(
            ResyncResource(
                uri=uri, timestamp=lastmod.timestamp(), md5=md5, sha256=sha256, length=length, mime_type=media_type or None
            )
        )
    made = time.perf_counter() - started
    resource_list.write(basename=basename)
    total = time.perf_counter() - started
    cpu = cpu_seconds() - cpu
    peak = peak_rss_kib()
    files = sorted(out_dir.glob("*.xml"))
    return {
        "seconds": max(0.0, total - read),
        "streamed_seconds": total,
        "cpu_seconds": cpu,
        "make_seconds": max(0.0, made - read),
        "write_seconds": total - made,
        "read_seconds": read,
        "baseline_kib": baseline,
        "peak_kib": peak,
        "entries": len(resource_list),
        "parts": len(files) - 1,
        "bytes": sum(path.stat().st_size for path in files),
    }


def child_resync_build(cfg):
    """Time ``resync-build --write-resourcelist --hash md5 --hash sha-256`` over the example's
    files (every file read and hashed, its entry written): resync's first publication of them.
    Its script is loaded first (its imports, like Django's setup for ours, not timed), then its
    ``main()`` timed in this process."""
    import runpy
    import shutil

    script = shutil.which("resync-build", path=str(Path(sys.executable).parent)) or shutil.which("resync-build")
    main = runpy.run_path(script, run_name="resync_build")["main"]
    media = Path(cfg["var_dir"]) / "media"
    out_dir = Path(cfg["var_dir"]) / "resync-build"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir()
    sys.argv = ["resync-build", "--write-resourcelist", "--hash", "md5", "--hash", "sha-256",
                "--outfile", str(out_dir / "resourcelist.xml"), f"{BASE_URL}/media/={media}"]
    baseline = current_rss_kib()
    cpu = cpu_seconds()
    started = time.perf_counter()
    main()
    seconds = time.perf_counter() - started
    cpu = cpu_seconds() - cpu
    peak = peak_rss_kib()
    files = sorted(out_dir.glob("*.xml"))
    entries = sum(path.read_bytes().count(b"<url>") for path in files)
    return {
        "seconds": seconds, "cpu_seconds": cpu, "baseline_kib": baseline, "peak_kib": peak, "entries": entries,
        "parts": max(0, len(files) - 1), "bytes": sum(path.stat().st_size for path in files),
    }


def child_raw(cfg):
    """The raw cursor read of the rows a reconcile of the set compares, each read twice, the
    faster kept: the set's objects (key and fingerprint fields, in key order) and their records
    (key and recorded fingerprint)."""
    setup_django(cfg)
    from django_resourcesync.models import Resource, ResourceSet

    resource_set = ResourceSet.objects.get(slug=SLUG)
    source = resource_set.get_source()
    objects = source.queryset(resource_set.lookups).order_by("pk").values_list("pk", *source.fingerprint_fields)
    records = Resource.objects.filter(resource_set=resource_set).order_by("pk").values_list("object_pk", "fingerprint")
    figures = {}
    for name, rows in (("objects", objects), ("records", records)):
        figures[name], figures[f"{name}_rows"] = _steps.best_of(2, lambda rows=rows: _steps.raw_read(rows))
    figures["fields"] = list(source.fingerprint_fields)
    return figures


def child_profile(cfg, top):
    """The rebuild once more, under cProfile."""
    setup_django(cfg)
    from django.core.management import call_command

    return _steps.profiled(
        call_command, "resourcesync_rebuild", "--set", SLUG, stdout=io.StringIO(), stderr=io.StringIO(), top=top
    )


CHILDREN = {
    "seed": child_seed, "rebuild": child_rebuild, "raw": child_raw, "change": child_change, "resync": child_resync,
    "resync_build": child_resync_build, "profile": child_profile,
}


def run_child(role, var_dir, *args):
    return _steps.run_child(__file__, role, var_dir, *args)


# --------------------------------------------------------------------------------------------
# Reporting


def us(seconds, n):
    return seconds / n * 1e6 if n else float("nan")


def line(name, n, result, extra=""):
    return (
        f"  {name:<32} {result['seconds']:8.2f} s wall  {us(result['seconds'], n):7.2f} us/resource"
        f"  peak RSS {mib(result['peak_kib']):7.1f} MB (baseline {mib(result['baseline_kib']):5.1f} MB){extra}"
    )


def print_split(result):
    phases = result["phases"]
    top_level = sum(seconds for label, seconds in phases.items() if not label.startswith((" ", "(")))
    print(f"    time split of {result['seconds']:.2f} s:")
    for label, seconds in phases.items():
        if seconds >= 0.0005 or not label.startswith((" ", "(")):
            print(f"      {label:<62} {seconds:8.3f} s  {100 * seconds / result['seconds']:5.1f} %")
    other = result["seconds"] - top_level
    print(f"      {'other (the command: sets, lock, left-out count, ...)':<62} {other:8.3f} s  "
          f"{100 * other / result['seconds']:5.1f} %")


def print_rebuild(label, n, result):
    build = result["build"]
    kinds = ", ".join(f"{count:,} {kind}" for kind, count in result["event_kinds"].items()) or "none"
    print(line(label, n, result))
    print(f"    change events written: {result['events']:,} ({kinds}); resourcelist build #{build[0]} {build[1]}, "
          f"{build[2]:,} entries in {build[3]} file(s); Django setup before it {result['setup_seconds']:.2f} s"
          " (not in the figure)")
    print(f"    command said: {result['stdout']}")
    for progress in result["progress"]:
        print(f"    progress: {progress}")
    print_split(result)


def verdict(ok):
    return "met" if ok else "NOT met"


def cold(options):
    """With ``--cold``: write out what is dirty and drop the page cache, dentries and inodes."""
    if not options.cold:
        return
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as caches:
            caches.write("3\n")
    except OSError as exc:
        raise SystemExit(f"--cold needs to write /proc/sys/vm/drop_caches (root, Linux): {exc}") from exc


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000", help="comma-separated N (default 100000,1000000)")
    parser.add_argument("--database-url", help="a PostgreSQL database to drop, create and use (a throwaway name)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory and database")
    parser.add_argument("--skip-resync", action="store_true", help="do not time resync")
    parser.add_argument("--cold", action="store_true",
                        help="empty the operating system's caches before each timed step (root): the files, "
                             "their folders and the database read from the disk, as after a night of other work")
    parser.add_argument("--profile", choices=("auto", "always", "never"), default="auto",
                        help="cProfile the rebuild, nothing changed and 1%% changed, at the largest N"
                             " (auto: when the ratio is below target)")
    parser.add_argument("--top", type=int, default=25, help="functions shown by the profile (default 25)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="time the three steps (nothing changed, another 1%% changed, resync) this many times"
                             " in turn at each N, and give the median of the ratios of each turn (default 3)")
    parser.add_argument("--first-rounds", type=int, default=3,
                        help="paired rounds of the first publication, ours and resync-build (default 3)")
    add_child_arguments(parser, CHILDREN)
    options = parser.parse_args()
    if run_as_child(options, CHILDREN):
        return
    sizes = sorted({int(size.replace("_", "")) for size in options.sizes.split(",") if size.strip()})
    database = "PostgreSQL" if options.database_url else "SQLite"
    print(f"resourcesync_rebuild benchmark vs resync {resync_version()} (Python {sys.version.split()[0]}); {database}; "
          f"sizes {', '.join(f'{n:,}' for n in sizes)}; each step in its own child process; MB = 2**20 bytes")
    print(f"measured: {CHOICE}")
    if options.cold:
        print("--cold: the operating system's caches emptied before each timed step (files, folders, database)")
    results, summaries = {}, {}
    for n in sizes:
        var_dir = tempfile.mkdtemp(prefix=f"rebuild-bench-{n}-")
        cfg = {"var_dir": var_dir, "database_url": options.database_url}
        try:
            if options.database_url:
                _steps.recreate_database(options.database_url)
            seed = run_child("seed", var_dir, cfg, n)
            count = seed["files"]
            snapshot(cfg)
            print()
            print(f"N = {count:,} resources ({database})")
            print(f"  seeded {seed['items']:,} items, {seed['files']:,} files in {seed['seed_seconds']:.1f} s "
                  f"({seed['files'] / seed['seed_seconds']:,.0f} files/s)"
                  + (f"; VACUUM ANALYZE {seed['vacuum_seconds']:.1f} s" if seed["vacuum_seconds"] else "")
                  + f"; not timed{'; data in ' + var_dir if options.keep else ''}")
            firsts = first_publication(options, var_dir, cfg, count)
            cold(options)
            unchanged = run_child("rebuild", var_dir, cfg, count)
            print_rebuild(f"{OURS}, nothing changed", count, unchanged)
            raw = run_child("raw", var_dir, cfg)
            reconciled = unchanged["phases"]["reconcile"]
            print(f"  reconcile with nothing changed {us(reconciled, count):.2f} us/resource (target <= {TARGET_RECONCILE_US:.0f}"
                  f" {verdict(us(reconciled, count) <= TARGET_RECONCILE_US)}), beside the raw cursor read of the rows it"
                  f" compares (the limit; best of 2, after the rebuild):")
            print(f"    the objects' key and {', '.join(raw['fields'])}: {us(raw['objects'], count):.2f} us/resource"
                  f" ({raw['objects']:.2f} s, {raw['objects_rows']:,} rows); their records' key and fingerprint:"
                  f" {us(raw['records'], count):.2f} us/resource ({raw['records']:.2f} s, {raw['records_rows']:,} rows)")
            print(f"    ratio reconcile / raw read: {reconciled / raw['objects']:.2f}x the objects' rows,"
                  f" {reconciled / (raw['objects'] + raw['records']):.2f}x both")
            change = run_child("change", var_dir, cfg, CHANGED_EVERY)
            print(f"  changed {change['changed']:,} files ({100 / CHANGED_EVERY:.0f}%) with queryset.update() "
                  f"in {change['seconds']:.2f} s (no signal; not timed)")
            cold(options)
            changed = run_child("rebuild", var_dir, cfg, count)
            print_rebuild(f"{OURS}, 1% changed", count, changed)
            if changed["changed_in_record"] != change["changed"]:
                print(f"  MISMATCH: {changed['changed_in_record']:,} records carry the new media type, "
                      f"{change['changed']:,} files were changed")
            theirs = None
            if not options.skip_resync:
                cold(options)
                theirs = run_child("resync", var_dir, cfg, count)
                print(line(RESYNC, count, theirs,
                           f"  (make objects {theirs['make_seconds']:.2f} s + write {theirs['write_seconds']:.2f} s;"
                           f" the rows streamed from a cursor, their read alone, {theirs['read_seconds']:.2f} s, taken off)"))
                print(f"    {theirs['entries']:,} entries, {theirs['parts']} part files,"
                      f" {theirs['bytes'] / 2**20:.1f} MB written")
            turns = [(unchanged, changed, theirs)]
            for turn in range(2, options.repeat + 1):
                turns.append(another_turn(options, var_dir, cfg, count, turn))
            if len(turns) > 1:
                reconciles = [us(ours["phases"]["reconcile"], count) for ours, _changed, _theirs in turns]
                median = statistics.median(reconciles)
                print(f"  reconcile with nothing changed, each turn: {', '.join(f'{value:.2f}' for value in reconciles)}"
                      f" us/resource; median {median:.2f} (target <= {TARGET_RECONCILE_US:.0f}"
                      f" {verdict(median <= TARGET_RECONCILE_US)})")
            results[count] = (unchanged, changed, theirs)
            summaries[count] = summary(count, firsts, turns)
            peak = mib(max(result["peak_kib"] for ours, changed_now, _theirs in turns for result in (ours, changed_now)))
            print(f"  our peak RSS {peak:.1f} MB: target < {TARGET_PEAK_MB:.0f} MB {verdict(peak < TARGET_PEAK_MB)}")
            ratio = None
            if theirs:
                ratios = [theirs_now["seconds"] / ours["seconds"] for ours, _changed, theirs_now in turns]
                ratios_changed = [theirs_now["seconds"] / changed_now["seconds"] for _ours, changed_now, theirs_now in turns]
                ratio, ratio_changed = statistics.median(ratios), statistics.median(ratios_changed)
                each = "" if len(turns) == 1 else (
                    f" (the median of {len(turns)} turns: {', '.join(f'{value:.2f}' for value in ratios)}"
                    f" / {', '.join(f'{value:.2f}' for value in ratios_changed)})"
                )
                print(f"  ratio resync time / our time: {ratio:.2f}x nothing changed, {ratio_changed:.2f}x with 1% changed"
                      f"{each}; target >= {TARGET_RATIO:.0f}x {verdict(ratio >= TARGET_RATIO)}"
                      f" / {verdict(ratio_changed >= TARGET_RATIO)}")
            wanted = options.profile == "always" or (
                options.profile == "auto" and ratio is not None and ratio < TARGET_RATIO
            )
            if n == max(sizes) and wanted:
                for label in ("nothing changed", "1% changed"):
                    if label != "nothing changed":  # another 1% of the files (the next key of each hundred)
                        run_child("change", var_dir, cfg, CHANGED_EVERY, options.repeat)
                    report = run_child("profile", var_dir, cfg, options.top)
                    print()
                    print(f"cProfile of a rebuild with {label} at N = {count:,} ({report['seconds']:.2f} s under the profiler)")
                    print(f"--- top {options.top} by cumulative time ---")
                    print(report["cumulative"])
                    print(f"--- top {options.top} by internal time (tottime) ---")
                    print(report["tottime"])
        finally:
            if not options.keep:
                shutil.rmtree(var_dir, ignore_errors=True)
                if options.database_url:
                    _steps.recreate_database(options.database_url, create=False)
                    drop_snapshot(cfg)

    for count, rows in summaries.items():
        print_summary(count, database, rows)

    if len(results) > 1:
        smallest, largest = min(results), max(results)
        print()
        print(f"Linearity: us/resource at N = {largest:,} relative to N = {smallest:,} (1.00 = linear in N; target near 1.0)")
        names = (f"{OURS}, nothing changed", f"{OURS}, 1% changed", RESYNC)
        for index, name in enumerate(names):
            if results[smallest][index] is None:
                continue
            low = us(results[smallest][index]["seconds"], smallest)
            high = us(results[largest][index]["seconds"], largest)
            print(f"  {name:<32} {low:7.2f} -> {high:7.2f} us/resource  ({high / low:.2f}x)")


def first_publication(options, var_dir, cfg, count):
    """``--first-rounds`` paired rounds of the first publication: ours (``resourcesync_rebuild``
    with nothing recorded: every file read and hashed md5 and sha-256, every entry rendered and
    recorded, the Resource List published) and ``resync-build`` over the same files, in turn
    (which goes first alternates). Each round starts from the seeded state put back. Returns
    ``[(ours, theirs or None)]``; the state left is that of our last round's publication."""
    rounds = []
    for index in range(options.first_rounds):
        restore(cfg)
        ours = theirs = None
        order = ("ours", "theirs") if index % 2 == 0 else ("theirs", "ours")
        for who in order:
            if who == "theirs" and options.skip_resync:
                continue
            cold(options)
            if who == "ours":
                ours = run_child("rebuild", var_dir, cfg, count)
            else:
                theirs = run_child("resync_build", var_dir, cfg)
        if index == 0:
            print_rebuild(f"{OURS}, first publication", count, ours)
        text = (f"  first publication, round {index + 1} ({'ours first' if order[0] == 'ours' else 'resync first'}):"
                f" ours {ours['seconds']:.2f} s ({ours['cpu_seconds']:.2f} s CPU, peak RSS {mib(ours['peak_kib']):.1f} MB,"
                f" {ours['resources']:,} recorded)")
        if theirs:
            ratio = theirs["seconds"] / ours["seconds"]
            text += (f", resync-build {theirs['seconds']:.2f} s ({theirs['cpu_seconds']:.2f} s CPU, peak RSS"
                     f" {mib(theirs['peak_kib']):.1f} MB, {theirs['entries']:,} entries): {ratio:.2f}x")
        print(text)
        rounds.append((ours, theirs))
    return rounds


def _spread(values):
    values = [value for value in values if value is not None]
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def summary(count, firsts, turns):
    """The rows of the closing table for one N: ``[(what, ours, theirs, ratios, per file, peaks)]``."""
    rows = []

    def row(what, ours, theirs, per_file):
        ratios = [them["seconds"] / us_["seconds"] for us_, them in zip(ours, theirs) if them]
        rows.append({
            "what": what,
            "ours": _spread([result["seconds"] for result in ours]),
            "theirs": _spread([result["seconds"] for result in theirs if result]),
            "ratio": _spread(ratios),
            "per_file": per_file,
            "peak": (max(mib(result["peak_kib"]) for result in ours),
                     max((mib(result["peak_kib"]) for result in theirs if result), default=None)),
        })

    ours = [first for first, _theirs in firsts]
    row("first publication (vs resync-build over the files)", ours, [theirs for _ours, theirs in firsts],
        f"{statistics.median(us(result['seconds'], count) for result in ours):.1f} us/file")
    unchanged = [turn[0] for turn in turns]
    changed = [turn[1] for turn in turns]
    theirs = [turn[2] for turn in turns]
    row("republish, nothing changed (vs resync from the rows)", unchanged, theirs,
        f"{statistics.median(us(result['seconds'], count) for result in unchanged):.1f} us/resource")
    extra = [
        (now["seconds"] - before["seconds"]) / now["events"] * 1e3 for before, now in zip(unchanged, changed) if now["events"]
    ]
    locked = "    of which: changed objects described and written (the set locked)"
    written = [now["phases"].get(locked, 0.0) / now["events"] * 1e3 for now in changed if now["events"]]
    row("republish, 1% changed (vs resync from the rows)", changed, theirs,
        (f"{statistics.median(extra):.3f} ms a changed file more than nothing changed; described and written under"
         f" the lock {statistics.median(written):.3f} ms a file") if extra else "")
    return rows


def print_summary(count, database, rows):
    def spread(values, unit="s", digits=2):
        if values is None:
            return "-"
        median, low, high = values
        return f"{median:.{digits}f} {unit} ({low:.{digits}f} to {high:.{digits}f})"

    print()
    print(f"Summary, N = {count:,} ({database}): medians of the paired rounds (min to max); ratio = resync / ours"
          f" per round, target >= {TARGET_FIRST_RATIO}x for the first publication, {TARGET_RATIO:.0f}x otherwise")
    for found in rows:
        peak_ours, peak_theirs = found["peak"]
        print(f"  {found['what']}")
        print(f"    ours {spread(found['ours'])}; resync {spread(found['theirs'])}; ratio {spread(found['ratio'], 'x')}")
        print(f"    {found['per_file']}; peak RSS ours {peak_ours:.1f} MB"
              + (f", resync {peak_theirs:.1f} MB" if peak_theirs is not None else ""))


def another_turn(options, var_dir, cfg, count, turn):
    """The three timed steps once more (``--repeat``): with nothing changed, with another 1% of
    the files changed (the next key of each hundred), and resync; each on a line."""
    cold(options)
    unchanged = run_child("rebuild", var_dir, cfg, count)
    run_child("change", var_dir, cfg, CHANGED_EVERY, turn - 1)
    cold(options)
    changed = run_child("rebuild", var_dir, cfg, count)
    theirs = None
    if not options.skip_resync:
        cold(options)
        theirs = run_child("resync", var_dir, cfg, count)
    print(f"  turn {turn}: nothing changed {unchanged['seconds']:.2f} s (reconcile {unchanged['phases']['reconcile']:.2f} s),"
          f" 1% changed {changed['seconds']:.2f} s (reconcile {changed['phases']['reconcile']:.2f} s,"
          f" {changed['events']:,} events)" + (f", resync {theirs['seconds']:.2f} s" if theirs else ""))
    return unchanged, changed, theirs


def resync_version():
    try:
        from importlib.metadata import version

        return version("resync")
    except Exception:
        return "?"


if __name__ == "__main__":
    main()
