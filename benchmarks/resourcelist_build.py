"""Benchmark: building a large Resource List, against the ``resync`` library.

Run from the repository root::

    .venv/bin/python benchmarks/resourcelist_build.py --sizes 100000,1000000

For each size N the script:

1. creates a fresh temporary directory, points ``EXAMPLE_VAR_DIR`` at it (so the demo project's
   SQLite database and storage live there), runs ``migrate``, creates one ResourceSet
   (slug ``bench``, source ``bitstreams``) and seeds N ``Resource`` rows with raw ``executemany``
   INSERTs in batches of 50,000 (seeding is reported but not part of any timing);
2. times ``build_resourcelist(resource_set, refresh=False)``: the state table is already current,
   so the build renders the list from it into storage (an index and N / 50,000 parts) and
   publishes it;
3. times the ``resync`` library (``resync.resource_list.ResourceList``) writing a Resource List of
   the same rows with the same fields (uri, lastmod, md5, sha256, length, mime_type) to files,
   with ``allow_multifile=True`` and ``write(basename=...)``, so it writes the same structure: a
   sitemapindex plus parts of 50,000 entries. Its timing covers reading the rows from the same
   SQLite database (stdlib ``sqlite3``, ordered by uri), making the ``Resource`` objects and
   writing the files, which is the work our build does as well; the two phases are shown apart.

Every measured step runs in its own child process (this script re-run with the hidden ``--child``
option), so the peak resident set size (``ru_maxrss``, read at the end of the child) belongs to
that step alone. Each child also reports its RSS just before the timed step began, the baseline
(interpreter, Django or resync imports, database connection). The parent imports nothing heavy,
so its own small RSS cannot leak into a child's ``ru_maxrss`` across fork/exec.

Nothing is asserted: the script prints speeds, wall times, peak RSS (MB = 2**20 bytes), ratios,
a linearity check and the targets (one million entries in at most 5 s, at most 150 MB peak RSS).
``--profile`` additionally runs the build for the largest N once more under cProfile (in a child)
and prints the top functions.
"""

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import _steps
from _steps import add_child_arguments, current_rss_kib, mib, peak_rss_kib, run_as_child

ROOT = Path(__file__).resolve().parent.parent
SLUG = "bench"
SEED_BATCH = 50_000
BASE_URL = "http://127.0.0.1:8000"  # the demo project's default RESOURCESYNC["BASE_URL"]

TARGET_N = 1_000_000
TARGET_SECONDS = 5.0
TARGET_PEAK_MB = 150.0

OURS = "django-resourcesync"
RESYNC = "resync"


# --------------------------------------------------------------------------------------------
# Measuring


# --------------------------------------------------------------------------------------------
# Children: each runs one step in a fresh interpreter and writes a JSON result file.


setup_django = _steps.setup_django_sqlite


def child_seed(var_dir, n):
    """Migrate a fresh database, create the set and insert N Resource rows (not timed as a build)."""
    import datetime
    import hashlib

    setup_django(var_dir)
    from django.core.management import call_command
    from django.db import connection, transaction

    from django_resourcesync.models import Resource, ResourceSet
    from django_resourcesync.xml.writer import resource_entry

    call_command("migrate", verbosity=0, interactive=False)
    resource_set = ResourceSet.objects.create(
        name="Benchmark", slug=SLUG, source="bitstreams", capabilities=["resourcelist"]
    )

    started = time.perf_counter()
    fields = [field for field in Resource._meta.concrete_fields if not field.primary_key]
    columns = ", ".join(connection.ops.quote_name(field.column) for field in fields)
    placeholders = ", ".join(["%s"] * len(fields))
    sql = f"INSERT INTO {connection.ops.quote_name(Resource._meta.db_table)} ({columns}) VALUES ({placeholders})"

    def prep(name, value):
        return Resource._meta.get_field(name).get_db_prep_save(value, connection)

    utc = datetime.timezone.utc
    base = datetime.datetime(2024, 1, 1, tzinfo=utc)
    links = prep("links", [])
    recorded = prep("recorded", datetime.datetime.now(utc))
    media_type = "application/pdf"

    def row(i):
        key = str(i).encode()
        entry = {
            "uri": f"{BASE_URL}/items/{i}/files/{i}/file-{i}.pdf",
            "lastmod": base + datetime.timedelta(seconds=i),
            "md5": hashlib.md5(key).hexdigest(),
            "sha256": hashlib.sha256(key).hexdigest(),
            "length": 10_000 + (i * 7919) % 5_000_000,
            "media_type": media_type,
        }
        values = {
            **entry,
            "resource_set": resource_set.pk,
            "object_pk": str(i),
            "lastmod": prep("lastmod", entry["lastmod"]),
            "changefreq": "",
            "links": links,
            "fingerprint": "",
            "encoding": "",
            # What reconcile or change tracking stores for the resource: its rendered <url>.
            "entry_xml": resource_entry(**entry),
            "recorded": recorded,
        }
        return tuple(values[field.name] for field in fields)

    with connection.cursor() as cursor:
        for start in range(0, n, SEED_BATCH):
            batch = [row(i) for i in range(start, min(start + SEED_BATCH, n))]
            with transaction.atomic():
                cursor.executemany(sql, batch)
    return {
        "seconds": time.perf_counter() - started,
        "rows": Resource.objects.filter(resource_set=resource_set).count(),
        "db": str(connection.settings_dict["NAME"]),
        "table": Resource._meta.db_table,
        "set_id": resource_set.pk,
    }


def child_build(var_dir, n):
    """Time build_resourcelist(refresh=False), then check what it published."""
    setup_django(var_dir)
    from django_resourcesync import storage
    from django_resourcesync.builders.resourcelist import NAME, build_resourcelist
    from django_resourcesync.models import Document, ResourceSet

    resource_set = ResourceSet.objects.get(slug=SLUG)
    baseline = current_rss_kib()
    started = time.perf_counter()
    build = build_resourcelist(resource_set, refresh=False)
    seconds = time.perf_counter() - started
    peak = peak_rss_kib()

    # Validation (after the measurements): the index exists and the parts add up.
    # A list within one document's limits is a single <urlset> and has no parts.
    documents = Document.objects.filter(build=build)
    index = documents.get(name=NAME)
    parts = documents.exclude(pk=index.pk)
    with storage.get_storage().open(index.storage_name, "rb") as fh:
        index_entries = fh.read().count(b"<sitemap>")
    return {
        "seconds": seconds,
        "baseline_kib": baseline,
        "peak_kib": peak,
        "build": build.pk,
        "status": build.status,
        "entries": build.entries,
        "index_exists": storage.get_storage().exists(index.storage_name),
        "index_is_sitemapindex": index.is_index,
        "index_entries": index_entries,
        "parts": parts.count(),
        "part_entries": sum(parts.values_list("entries", flat=True)) if index.is_index else index.entries,
        "bytes": sum(documents.values_list("size", flat=True)),
    }


def child_resync(var_dir, n, db, table, set_id):
    """Time resync reading the same rows and writing a Resource List (index + parts) to files."""
    import datetime
    import sqlite3

    from resync.mapper import Mapper
    from resync.resource import Resource
    from resync.resource_list import ResourceList

    out_dir = Path(var_dir) / "resync"
    out_dir.mkdir()
    basename = str(out_dir / "resourcelist.xml")
    mapper = Mapper([f"{BASE_URL}/resourcesync/{SLUG}/={out_dir}/"])

    baseline = current_rss_kib()
    started = time.perf_counter()
    connection = sqlite3.connect(db)
    rows = connection.execute(
        f"SELECT uri, lastmod, md5, sha256, length, media_type FROM {table} WHERE resource_set_id = ? ORDER BY uri",
        (set_id,),
    )
    resource_list = ResourceList(allow_multifile=True, mapper=mapper)
    utc = datetime.timezone.utc
    for uri, lastmod, md5, sha256, length, media_type in rows:
        # Django stores aware datetimes in SQLite as naive UTC "YYYY-MM-DD HH:MM:SS[.ffffff]".
        # resync keeps times as float timestamps: hand it floats (parsing its own W3C strings
        # would cost it several times more, and this measures writing, not parsing).
        resource_list.add(
            Resource(
                uri=uri,
                timestamp=datetime.datetime.fromisoformat(lastmod).replace(tzinfo=utc).timestamp(),
                md5=md5,
                sha256=sha256,
                length=length,
                mime_type=media_type,
            )
        )
    connection.close()
    loaded = time.perf_counter()
    resource_list.write(basename=basename)
    seconds = time.perf_counter() - started
    peak = peak_rss_kib()

    files = sorted(out_dir.glob("*.xml"))
    index_text = Path(basename).read_text()
    return {
        "seconds": seconds,
        "load_seconds": loaded - started,
        "write_seconds": seconds - (loaded - started),
        "baseline_kib": baseline,
        "peak_kib": peak,
        "entries": len(resource_list),
        "index_entries": index_text.count("<sitemap>"),
        "parts": len(files) - 1,
        "bytes": sum(path.stat().st_size for path in files),
    }


def child_profile(var_dir, n, top):
    """Run the build once more under cProfile; return the top functions as text."""
    setup_django(var_dir)
    from django_resourcesync.builders.resourcelist import build_resourcelist
    from django_resourcesync.models import ResourceSet

    resource_set = ResourceSet.objects.get(slug=SLUG)
    return _steps.profiled(build_resourcelist, resource_set, refresh=False, top=top)


CHILDREN = {"seed": child_seed, "build": child_build, "resync": child_resync, "profile": child_profile}


def run_child(role, result_dir, *args):
    return _steps.run_child(__file__, role, result_dir, *args)


# --------------------------------------------------------------------------------------------
# Reporting


def rate(n, seconds):
    return n / seconds if seconds else float("inf")


def contender_line(name, n, result, extra=""):
    return (
        f"  {name:<20} {rate(n, result['seconds']):>11,.0f} resources/s  {result['seconds']:>8.2f} s wall"
        f"  peak RSS {mib(result['peak_kib']):>8.1f} MB  baseline RSS {mib(result['baseline_kib']):>6.1f} MB{extra}"
    )


def run(sizes, keep, profile, top):
    results = {}
    print(f"Resource List build benchmark: {OURS} vs resync {resync_version()}  (Python {sys.version.split()[0]})")
    print(f"sizes: {', '.join(f'{n:,}' for n in sizes)}; each step in its own child process; MB = 2**20 bytes")
    for n in sizes:
        var_dir = tempfile.mkdtemp(prefix=f"resourcelist-bench-{n}-")
        try:
            seed = run_child("seed", var_dir, var_dir, n)
            ours = run_child("build", var_dir, var_dir, n)
            theirs = run_child("resync", var_dir, var_dir, n, seed["db"], seed["table"], seed["set_id"])
            results[n] = (ours, theirs)
            print()
            print(f"N = {n:,}  (seeded {seed['rows']:,} rows in {seed['seconds']:.1f} s, not timed; data in {var_dir})")
            print(contender_line(OURS, n, ours))
            split = f"  (read rows {theirs['load_seconds']:.2f} s + write {theirs['write_seconds']:.2f} s)"
            print(contender_line(RESYNC, n, theirs, split))
            speed = rate(n, ours["seconds"]) / rate(n, theirs["seconds"])
            memory = ours["peak_kib"] / theirs["peak_kib"]
            print(f"  ratio: our speed / resync speed = {speed:.2f}x;  our peak RSS / resync peak RSS = {memory:.2f}x"
                  f" ({mib(ours['peak_kib']):.1f} MB vs {mib(theirs['peak_kib']):.1f} MB)")
            ok = (
                ours["status"] == "published" and ours["index_exists"] and ours["entries"] == n
                and ours["part_entries"] == n and ours["index_entries"] == ours["parts"]
            )
            if ours["index_is_sitemapindex"]:
                shape = f"sitemapindex with {ours['index_entries']} <sitemap> entries"
            else:
                shape = "a single urlset, no parts"
            print(f"  check {OURS}: build #{ours['build']} {ours['status']}; resourcelist.xml in storage: "
                  f"{ours['index_exists']} ({shape}); {ours['parts']} part Documents; "
                  f"{ours['part_entries']:,} entries; {ours['bytes'] / 2**20:.1f} MB written -> {'OK' if ok else 'MISMATCH'}")
            print(f"  check {RESYNC}: resourcelist.xml with {theirs['index_entries']} <sitemap> entries; "
                  f"{theirs['parts']} part files; {theirs['entries']:,} entries; {theirs['bytes'] / 2**20:.1f} MB written")
            if profile and n == max(sizes):
                report = run_child("profile", var_dir, var_dir, n, top)
                print()
                print(f"cProfile of a second build at N = {n:,} ({report['seconds']:.2f} s under the profiler)")
                print(f"--- top {top} by cumulative time ---")
                print(report["cumulative"])
                print(f"--- top {top} by internal time (tottime) ---")
                print(report["tottime"])
        finally:
            if not keep:
                shutil.rmtree(var_dir, ignore_errors=True)

    smallest = min(results)
    print()
    print(f"Linearity (time per resource relative to N = {smallest:,}; 1.00 = cost linear in N)")
    for index, name in enumerate((OURS, RESYNC)):
        base = results[smallest][index]["seconds"] / smallest
        cells = []
        for n in sorted(results):
            per = results[n][index]["seconds"] / n
            cells.append(f"N={n:,}: {per * 1e6:.2f} us/resource ({per / base:.2f}x)")
        print(f"  {name:<20} " + ";  ".join(cells))

    print()
    print(f"Targets for {OURS} (printed, not asserted): {TARGET_N:,} resources in <= {TARGET_SECONDS:.0f} s wall, "
          f"<= {TARGET_PEAK_MB:.0f} MB peak RSS")
    if TARGET_N in results:
        ours = results[TARGET_N][0]
        peak = mib(ours["peak_kib"])
        print(f"  wall: {ours['seconds']:.2f} s  ({'met' if ours['seconds'] <= TARGET_SECONDS else 'NOT met'})")
        print(f"  peak RSS: {peak:.1f} MB  ({'met' if peak <= TARGET_PEAK_MB else 'NOT met'})")
    else:
        print(f"  (N = {TARGET_N:,} not among the sizes run)")


def resync_version():
    try:
        from importlib.metadata import version

        return version("resync")
    except Exception:
        return "?"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000", help="comma-separated N (default: 100000,1000000)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directories")
    parser.add_argument("--profile", action="store_true", help="also cProfile a build at the largest N")
    parser.add_argument("--top", type=int, default=15, help="functions shown by --profile (default 15)")
    add_child_arguments(parser, CHILDREN)
    options = parser.parse_args()
    if run_as_child(options, CHILDREN):
        return
    sizes = sorted({int(size.replace("_", "")) for size in options.sizes.split(",") if size.strip()})
    run(sizes, options.keep, options.profile, options.top)


if __name__ == "__main__":
    main()
