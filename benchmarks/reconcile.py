"""Benchmark: a reconcile with nothing changed, beside the raw read of the same rows.

Run from the repository root::

    .venv/bin/python benchmarks/reconcile.py                       # SQLite, sizes 10000,100000
    .venv/bin/python benchmarks/reconcile.py --sizes 10000
    .venv/bin/python benchmarks/reconcile.py --database-url postgres://postgres:postgres@127.0.0.1:5432/resourcesync_bench
    .venv/bin/python benchmarks/reconcile.py --sizes 10000 --s3 --s3-files 100000   # S3 request count (moto)

For each size N (resources of the example's file set; its metadata set then has about 3/4 as
many) it seeds a fresh database (``seed_repository``'s ``add_items(items, file_size=64,
track=False)``, items = 3/4 N) and rebuilds both sets once, the baseline (not timed). Then, in
one child process, each step twice, the faster kept (the rows are in the page cache for all):

- **reconcile**: ``tracking.reconcile(resource_set)`` with nothing changed, the way it runs
  (fingerprints made and compared in the database; the example's files record their sizes
  (``fingerprint_file_sizes``), so the storage is not asked: without that, file sizes would
  come from the storage's listing, a stat per file on the filesystem);
- **values_list**: ``values_list("pk", *fingerprint_fields)`` of the set's items iterated;
- **raw cursor**: the same SQL through a DB-API cursor, every row fetched;
- **python path** (reference): ``tracking.reconcile(resource_set, in_database=False)``, each
  fingerprint read out (made by the database, an IN list a batch) and compared in Python;
- **old fingerprinting** (reference): what reconcile did per row before, without building any
  object: ``values_list`` rows, ``sha256(repr(values))`` in Python, ``storage.size()`` per file,
  the recorded fingerprints read with an IN list per batch.

It prints µs per resource of each and the ratio of reconcile to the raw cursor read (the
limit), and checks that the reconcile found nothing to change. Nothing is asserted; the target
(at most 5 µs per resource with nothing changed) is printed beside the figures.

``--database-url`` runs on PostgreSQL: the database named in the URL is dropped and created
(use a throwaway name) and dropped again at the end unless ``--keep``.

``--s3`` starts moto's S3 server (``python -m moto.server``), puts ``--s3-files`` files of one
item into a bucket (the rows in bulk), records them as a reconcile would without reading their
bytes (made-up hashes, the source's own fingerprints), then times a reconcile with nothing
changed and counts the requests the storage's client sends (botocore's ``before-send``): none,
since the rows record their files' sizes (the listing is used by a source without a size field).
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import _steps
from _steps import add_child_arguments, best_of, raw_read, run_as_child

ROOT = Path(__file__).resolve().parent.parent
SETS = ("bitstreams", "metadata")
TARGET_US = 5.0
S3_TARGET_REQUESTS = 200


# --------------------------------------------------------------------------------------------
# Children


def setup_django(cfg):
    os.environ["EXAMPLE_VAR_DIR"] = cfg["var_dir"]
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    for name in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "AWS_STORAGE_BUCKET_NAME"):
        os.environ.pop(name, None)
    if cfg.get("database_url"):
        os.environ["DATABASE_URL"] = cfg["database_url"]
    else:
        os.environ.pop("DATABASE_URL", None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    if cfg.get("s3"):
        from django.conf import settings
        from django.test.utils import override_settings

        endpoint, bucket = cfg["s3"]
        override_settings(STORAGES={
            **settings.STORAGES,
            "default": {
                "BACKEND": "storages.backends.s3.S3Storage",
                "OPTIONS": {"bucket_name": bucket, "endpoint_url": endpoint, "access_key": "bench", "secret_key": "bench",
                            "region_name": "us-east-1", "file_overwrite": True},
            },
        }).enable()


def child_seed(cfg, items):
    """Migrate, add the items and their files, rebuild both sets once (the baseline); on
    PostgreSQL then ``VACUUM ANALYZE``, as autovacuum would after such a load (without it the
    planner, which has never counted the tables, reads the records' wide rows by a bitmap scan:
    the comparison took 1.15 s instead of 0.30 s at 100,000)."""
    setup_django(cfg)
    from django.core.management import call_command

    from django_resourcesync.models import Resource, ResourceSet
    from django_resourcesync.rebuild import rebuild_set
    from example_project.repository.management.commands.seed_repository import add_items

    call_command("migrate", verbosity=0, interactive=False)
    started = time.perf_counter()
    add_items(items, file_size=64, track=False)
    seeded = time.perf_counter() - started
    for slug in SETS:
        rebuild_set(ResourceSet.objects.get(slug=slug))
    from django.db import connection

    if connection.vendor == "postgresql":  # what autovacuum does within a minute of such a load
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")
    return {
        "seed_seconds": seeded,
        "baseline_seconds": time.perf_counter() - started - seeded,
        "resources": {slug: Resource.objects.filter(resource_set__slug=slug).count() for slug in SETS},
    }


def old_fingerprinting(resource_set, batch_size):
    """The per-row work of the reconcile before fingerprints were made in the database, without
    building any object: values read out, digested in Python, each file's size asked of its
    storage, the recorded fingerprints read with an IN list a batch."""
    import hashlib

    from django_resourcesync import bulk
    from django_resourcesync.models import Resource

    source = resource_set.get_source()
    queryset = source.queryset(resource_set.lookups)
    files = source._fingerprint_files
    last, matched = None, 0
    while True:
        page = queryset.order_by("pk").values_list("pk", *source.fingerprint_fields)
        if last is not None:
            page = page.filter(pk__gt=last)
        batch = list(page[:batch_size])
        if not batch:
            return matched
        fingerprints = {}
        for pk, *values in batch:
            for index, storage in files:
                if values[index]:
                    values[index] = (values[index], storage.size(values[index]))
            fingerprints[str(pk)] = hashlib.sha256(repr(values).encode()).hexdigest()
        recorded = bulk.filter_in(Resource.objects.filter(resource_set=resource_set), "object_pk", fingerprints)
        matched += sum(1 for key, fp in recorded.values_list("object_pk", "fingerprint") if fingerprints[key] == fp)
        last = batch[-1][0]


def child_measure(cfg, runs):
    setup_django(cfg)
    from django.db import connections

    from django_resourcesync import tracking
    from django_resourcesync.conf import app_settings
    from django_resourcesync.models import ChangeEvent, ResourceSet

    report = {}
    for slug in SETS:
        resource_set = ResourceSet.objects.get(slug=slug)
        source = resource_set.get_source()
        queryset = source.queryset(resource_set.lookups)
        n = queryset.count()
        rows = queryset.order_by("pk").values_list("pk", *source.fingerprint_fields)
        connection = connections[queryset.db]
        events_before = ChangeEvent.objects.filter(resource_set=resource_set).count()

        def raw():
            return raw_read(rows)

        def values():
            return sum(1 for _row in rows.iterator(chunk_size=10_000))

        def reconcile():
            counts = tracking.reconcile(resource_set)
            return [counts.created, counts.updated, counts.deleted, counts.unchanged, counts.skipped]

        def python_path():
            counts = tracking.reconcile(resource_set, in_database=False)
            return [counts.created, counts.updated, counts.deleted, counts.unchanged, counts.skipped]

        def file_sizes():
            # The sizes of the set's files as reconcile reads them (a stat each on the filesystem).
            files = source.fingerprint_expression(queryset.db)[1] if source.fingerprints_in_database(queryset.db) else []
            if not files:
                return 0
            names = [name for name in queryset.values_list(files[0], flat=True) if name]
            listing = source.file_sizes()[0]
            listing.prepare(names)
            started = time.perf_counter()
            for name in names:
                listing.size(name)
            return time.perf_counter() - started

        figures = {"n": n}
        figures["sizes"] = min(file_sizes() for _ in range(runs))
        figures["raw"], raw_rows = best_of(runs, raw)
        figures["values"], _ = best_of(runs, values)
        figures["reconcile"], counts = best_of(runs, reconcile)
        figures["python"], python_counts = best_of(runs, python_path)
        figures["old"], matched = best_of(1, lambda: old_fingerprinting(resource_set, app_settings.BATCH_SIZE))
        figures.update(
            raw_rows=raw_rows, counts=counts, python_counts=python_counts, old_matched=matched,
            events=ChangeEvent.objects.filter(resource_set=resource_set).count() - events_before,
            vendor=connection.vendor,
        )
        report[slug] = figures
    return report


def child_s3(cfg, files):
    """Files in the bucket, their records written as a reconcile would (made-up hashes), then
    a reconcile with nothing changed: its time and the storage requests it sent."""
    setup_django(cfg)
    from concurrent.futures import ThreadPoolExecutor

    import boto3
    from django.core.files.storage import default_storage
    from django.core.management import call_command

    from django_resourcesync import tracking
    from django_resourcesync.models import Resource, ResourceSet
    from django_resourcesync.tracking.writer import entry_values
    from example_project.repository.models import Collection, Item, ItemFile

    call_command("migrate", verbosity=0, interactive=False)
    endpoint, bucket = cfg["s3"]
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench",
                          region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    started = time.perf_counter()
    collection = Collection.objects.create(name="Bench", slug="bench")
    items = [Item.objects.create(collection=collection, title=f"Item {n}") for n in range(max(1, files // 1000))]
    names = [(items[n % len(items)], f"items/{items[n % len(items)].pk}/file-{n:06}.txt") for n in range(files)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda pair: client.put_object(Bucket=bucket, Key=pair[1], Body=b"x" * 64), names))
    with tracking.paused():
        ItemFile.objects.bulk_create(
            # Their sizes recorded, as ItemFile.save() and the seeding do (bulk_create skips save()).
            (ItemFile(item=item, name=name.rsplit("/", 1)[1], media_type="text/plain", file=name, size=64)
             for item, name in names),
            batch_size=5000,
        )
    resource_set = ResourceSet.objects.get(slug="bitstreams")
    source = resource_set.get_source()
    queryset = source.queryset(resource_set.lookups)
    fingerprints = tracking.fingerprints_of_rows(source, queryset.values_list("pk", *source.fingerprint_fields))
    records = []
    for obj in queryset.order_by("pk").iterator(chunk_size=5000):
        key = str(obj.pk)
        known = {"fingerprint": fingerprints[key], "md5": "0" * 32, "sha256": "0" * 64, "length": 64, "media_type": "text/plain"}
        records.append(Resource(resource_set=resource_set, object_pk=key, **entry_values(source, obj, known, fingerprints[key])))
    Resource.objects.bulk_create(records, batch_size=5000)
    del records
    seeded = time.perf_counter() - started

    requests = []
    s3 = default_storage.bucket.meta.client
    s3.meta.events.register("before-send.s3", lambda request=None, **kwargs: requests.append(request.method))
    started = time.perf_counter()
    counts = tracking.reconcile(resource_set)
    seconds = time.perf_counter() - started
    return {
        "files": files, "seed_seconds": seeded, "seconds": seconds, "requests": len(requests),
        "methods": sorted(set(requests)), "unchanged": counts.unchanged,
        "changed": counts.created + counts.updated + counts.deleted,
    }


CHILDREN = {"seed": child_seed, "measure": child_measure, "s3": child_s3}


def run_child(role, result_dir, *args):
    return _steps.run_child(__file__, role, result_dir, *args)


# --------------------------------------------------------------------------------------------
# Services


def admin_url(database_url):
    parts = urlsplit(database_url)
    return urlunsplit(("postgresql", parts.netloc, "/postgres", "", ""))


def recreate_database(database_url, create=True):
    import psycopg
    from psycopg import sql

    name = urlsplit(database_url).path.lstrip("/")
    with psycopg.connect(admin_url(database_url), autocommit=True) as connection:
        connection.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if create:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def start_moto():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server, f"http://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise RuntimeError("moto's S3 server did not start") from None
            time.sleep(0.2)


# --------------------------------------------------------------------------------------------
# Reporting


def us(seconds, n):
    return seconds / n * 1e6 if n else float("nan")


def report(n, seed, measured):
    print()
    print(f"N = {n:,}  (seeded in {seed['seed_seconds']:.1f} s, baseline rebuild {seed['baseline_seconds']:.1f} s, not timed)")
    for slug in SETS:
        m = measured[slug]
        count = m["n"]
        ratio = m["reconcile"] / m["raw"] if m["raw"] else float("nan")
        print(f"  {slug} ({m['vendor']}, {count:,} resources):")
        print(f"    reconcile, nothing changed   {us(m['reconcile'], count):8.2f} us/resource  {m['reconcile']:7.3f} s"
              f"  counts c/u/d/unchanged/skipped {m['counts']}, events written {m['events']}")
        print(f"    raw cursor read (the limit)  {us(m['raw'], count):8.2f} us/resource  {m['raw']:7.3f} s"
              f"  ({m['raw_rows']:,} rows)")
        if m["sizes"]:
            print(f"    file sizes alone (stat each) {us(m['sizes'], count):8.2f} us/resource  {m['sizes']:7.3f} s")
        print(f"    values_list iterated         {us(m['values'], count):8.2f} us/resource  {m['values']:7.3f} s")
        print(f"    python path (reference)      {us(m['python'], count):8.2f} us/resource  {m['python']:7.3f} s")
        print(f"    old fingerprinting (ref.)    {us(m['old'], count):8.2f} us/resource  {m['old']:7.3f} s")
        verdict = "met" if us(m["reconcile"], count) <= TARGET_US else "NOT met"
        print(f"    ratio reconcile / raw read = {ratio:.2f}x;  python path / reconcile = {m['python'] / m['reconcile']:.2f}x;"
              f"  target <= {TARGET_US:.0f} us/resource: {verdict}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000", help="comma-separated N, at most 100000 (default 10000,100000)")
    parser.add_argument("--database-url", help="a PostgreSQL database to drop, create and use (a throwaway name)")
    parser.add_argument("--runs", type=int, default=2, help="runs of each step, the fastest kept (default 2)")
    parser.add_argument("--s3", action="store_true", help="also count the S3 requests of a reconcile (starts moto)")
    parser.add_argument("--s3-files", type=int, default=100_000, help="files in the bucket with --s3 (default 100000)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory and database")
    add_child_arguments(parser, CHILDREN)
    options = parser.parse_args()
    if run_as_child(options, CHILDREN):
        return
    sizes = sorted({int(size.replace("_", "")) for size in options.sizes.split(",") if size.strip()})
    if any(n > 100_000 for n in sizes) or options.s3_files > 100_000:
        parser.error("at most 100,000 resources")
    print(f"Reconcile benchmark (Python {sys.version.split()[0]}); "
          f"{'PostgreSQL' if options.database_url else 'SQLite'}; sizes {', '.join(f'{n:,}' for n in sizes)}")
    for n in sizes:
        var_dir = tempfile.mkdtemp(prefix=f"reconcile-bench-{n}-")
        cfg = {"var_dir": var_dir, "database_url": options.database_url}
        try:
            if options.database_url:
                recreate_database(options.database_url)
            seed = run_child("seed", var_dir, cfg, max(1, n * 3 // 4))
            measured = run_child("measure", var_dir, cfg, options.runs)
            report(n, seed, measured)
        finally:
            if not options.keep:
                shutil.rmtree(var_dir, ignore_errors=True)
                if options.database_url:
                    recreate_database(options.database_url, create=False)
    if options.s3:
        server, endpoint = start_moto()
        var_dir = tempfile.mkdtemp(prefix="reconcile-bench-s3-")
        try:
            cfg = {"var_dir": var_dir, "database_url": None, "s3": [endpoint, "reconcile-bench"]}
            result = run_child("s3", var_dir, cfg, options.s3_files)
            print()
            print(f"S3 (moto's server): {result['files']:,} files"
                  f" (put and recorded in {result['seed_seconds']:.0f} s, not timed)")
            verdict = "met" if result["requests"] <= S3_TARGET_REQUESTS else "NOT met"
            print(f"  reconcile, nothing changed: {result['seconds']:.2f} s,"
                  f" {us(result['seconds'], result['files']):.2f} us/file; "
                  f"{result['requests']} storage requests ({', '.join(result['methods'])}); "
                  f"{result['unchanged']:,} unchanged, {result['changed']} changed; "
                  f"target <= {S3_TARGET_REQUESTS} requests: {verdict}")
        finally:
            server.terminate()
            server.wait(timeout=30)
            if not options.keep:
                shutil.rmtree(var_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
