"""Benchmark: the cost of the version store when a change of a large file is processed.

Run from the repository root::

    .venv/bin/python benchmarks/versions.py                      # 24 rounds each way, 10 MB
    .venv/bin/python benchmarks/versions.py --rounds 48 --megabytes 50

Setup (not timed), in a child process: a fresh temporary ``EXAMPLE_VAR_DIR`` (SQLite database,
media files, documents), ``migrate`` (which creates the demo's sets), the ``bitstreams`` set given
the capabilities ``["resourcelist", "changelist", "changedump"]`` and the ``metadata`` and
``pages`` sets disabled (they add no work), ``--items`` items with their files by the
``seed_repository`` command, and the ``bitstreams`` set published once (``rebuild_set``); the
changes it left unpackaged are packaged, so that the package cut at the end holds the
benchmark's changes alone.

Then, in a second child, rounds of one change each. Each round, not timed: one file (the first
``ItemFile`` of the first public item) is written again with ``--megabytes`` of fresh random bytes
(``os.urandom``), under a new name, by ``upload.file.save(name, ContentFile(data))`` inside
``tracking.paused()``, and its previous file is deleted; ``tracking.changed(model=ItemFile,
pks=[pk])`` records the change; ``os.sync()`` writes dirty pages back (unless ``--no-sync``), so
that no round pays for the writeback of an earlier one, and the store's files are dropped from
the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``; not with ``--keep-store-cache`` or
``--no-sync``), so that it does not grow by a file each round: on a machine whose memory is in
use, new pages come from pages freed, while pages taken anew can cost much more (on a virtual
machine, a fault to the host each; the context line measures both). Nothing processes the
change on commit: ``outbox.send`` is replaced by a function that does nothing, as when the
workers are down (the demo's tasks run in process otherwise). Timed:
``tracking.process_pending(["bitstreams"])`` alone, which reads the new file once, hashes it (md5,
sha-256) and writes the change event; with the store on (``KEEP_VERSIONS``) it also writes the
bytes into the version store on the way.

The store is turned on and off by ``settings.RESOURCESYNC["KEEP_VERSIONS"]`` and
``app_settings.reload()``, in ABBA order (on, off, off, on, ...), ``--rounds`` timed rounds each
way after ``--warmup`` untimed rounds of each. The new file was just written, so it is read from
the page cache in both cases; the store's copy goes to the page cache too (the store does not
fsync), and its writeback is not timed.

A third child cuts a Change Dump package (``package_changes``) and counts its entries with a
bitstream against the changes processed with the store on (matched by sha-256: every round's
bytes are new), and measures the storage the store uses. Nothing is asserted: the script prints
figures, the ratio and the target (a change processed with the store at most 1.3x the cost
without it). MB = 2**20 bytes.
"""

import argparse
import hashlib
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import _steps
from _steps import add_child_arguments, run_as_child

SLUG = "bitstreams"  # the demo project's set of files of public items (made by its migrations)
CAPABILITIES = ["resourcelist", "changelist", "changedump"]
OTHER_SETS = ("metadata", "pages")
TARGET_RATIO = 1.3
MB = 2**20

setup_django = _steps.setup_django_sqlite


def progress(message):
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def store_usage():
    """Bytes and files under ``<STORAGE_PREFIX>/versions`` of the documents' storage (and the
    spool files left in its ``tmp`` folder), with the Version rows."""
    from django.db.models import Sum

    from django_resourcesync import storage, versions
    from django_resourcesync.models import Version

    root = storage.get_storage().path(storage.storage_name(versions.FOLDER))
    spool = os.path.join(root, "tmp")
    files = nbytes = spooled = 0
    for folder, _dirs, names in os.walk(root):
        for name in names:
            if os.path.commonpath([folder, spool]) == spool:
                spooled += 1
                continue
            files += 1
            nbytes += os.path.getsize(os.path.join(folder, name))
    return {
        "files": files,
        "bytes": nbytes,
        "spooled": spooled,
        "rows": Version.objects.count(),
        "row_bytes": Version.objects.aggregate(total=Sum("length"))["total"] or 0,
    }


def drop_from_page_cache(root):
    """Drop the (clean) pages of the files under ``root`` from the page cache."""
    if not hasattr(os, "posix_fadvise"):
        return
    for folder, _dirs, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def write_file(folder, data, sync, chunk=MB):
    """``(seconds, name)``: ``data`` written in ``chunk``-byte writes into a new file of
    ``folder``, renamed into place (what the store does; no fsync)."""
    if sync:
        os.sync()
    started = time.perf_counter()
    with tempfile.NamedTemporaryFile(dir=folder, delete=False) as spool:
        for start in range(0, len(data), chunk):
            spool.write(data[start : start + chunk])
    os.replace(spool.name, spool.name + ".placed")
    return time.perf_counter() - started, spool.name + ".placed"


# --------------------------------------------------------------------------------------------
# Children: each runs one step in a fresh interpreter and writes a JSON result file.


def child_setup(var_dir, items):
    """Migrate, configure the sets, seed, publish (not timed)."""
    setup_django(var_dir)
    import sqlite3

    import django
    from django.core.management import call_command

    from django_resourcesync.builders import changedump
    from django_resourcesync.models import ChangeEvent, ResourceSet
    from django_resourcesync.rebuild import rebuild_set
    from example_project.repository.models import Item, ItemFile

    call_command("migrate", verbosity=0, interactive=False)
    started = time.perf_counter()
    ResourceSet.objects.filter(slug__in=OTHER_SETS).update(enabled=False)
    resource_set = ResourceSet.objects.get(slug=SLUG)
    resource_set.capabilities = CAPABILITIES
    resource_set.save(update_fields=["capabilities"])
    call_command("seed_repository", items=items, verbosity=0)
    rebuild_set(resource_set)
    while changedump.package_changes(resource_set) is not None:
        pass
    return {
        "seconds": time.perf_counter() - started,
        "items": Item.objects.count(),
        "files": ItemFile.objects.count(),
        "enabled": list(ResourceSet.objects.filter(enabled=True).values_list("slug", flat=True)),
        "events": ChangeEvent.objects.filter(resource_set=resource_set).count(),
        "packages": resource_set.changedump_packages.count(),
        "store": store_usage(),
        "django": django.get_version(),
        "sqlite": sqlite3.sqlite_version,
    }


def child_rounds(var_dir, rounds, warmup, size, sync, keep_store_cache):
    """The timed rounds: one change of one file each, store on and off in ABBA order."""
    setup_django(var_dir)
    from django.conf import settings
    from django.core.files.base import ContentFile

    from django_resourcesync import storage, tracking, versions
    from django_resourcesync.conf import app_settings
    from django_resourcesync.models import ChangeEvent, ResourceSet, Version
    from django_resourcesync.tracking import outbox
    from example_project.repository.models import ItemFile

    # Nobody processes changes on commit (the demo runs its tasks in process): the workers are
    # down, and process_pending() below is the only processing.
    outbox.send = lambda task, source_names: None
    resource_set = ResourceSet.objects.get(slug=SLUG)
    versions_root = storage.get_storage().path(storage.storage_name(versions.FOLDER))
    upload = ItemFile.objects.filter(item__is_public=True).order_by("item_id", "pk").first()

    def store(on):
        settings.RESOURCESYNC = {**settings.RESOURCESYNC, "KEEP_VERSIONS": on}
        app_settings.reload()
        return versions.keeps(resource_set)

    def one_round(number, on):
        keeps = store(on)
        data = os.urandom(size)
        digest = hashlib.sha256(data).hexdigest()
        previous = upload.file.name
        with tracking.paused():
            upload.file.save(f"round-{number}.bin", ContentFile(data))
        del data
        upload.file.storage.delete(previous)
        tracking.changed(model=ItemFile, pks=[upload.pk])
        if sync:
            os.sync()
            if not keep_store_cache:
                drop_from_page_cache(versions_root)
        events_before = ChangeEvent.objects.filter(resource_set=resource_set).count()
        started = time.perf_counter()
        counts = tracking.process_pending([SLUG])
        seconds = time.perf_counter() - started
        events = ChangeEvent.objects.filter(resource_set=resource_set)
        last = events.order_by("-id").values_list("change", "sha256", "length").first()
        return {
            "number": number,
            "on": on,
            "keeps": keeps,
            "seconds": seconds,
            "sha256": digest,
            "updated": counts.updated,
            "new_events": events.count() - events_before,
            "event_ok": last == ("updated", digest, size),
            "kept": Version.objects.filter(sha256=digest).exists(),
        }

    plan = [(False, None), (True, None)] * warmup
    for index in range(rounds):
        plan += [(True, index), (False, index)] if index % 2 == 0 else [(False, index), (True, index)]
    results = []
    for number, (on, index) in enumerate(plan, start=1):
        result = one_round(number, on)
        result["warmup"] = index is None
        results.append(result)
        if number % 10 == 0:
            progress(f"{number}/{len(plan)} rounds")

    # Context, single thread: what the store's work comes to at the least (hashing; writing the
    # bytes in 1 MB chunks into a new file, placed by a rename, no fsync).
    data = os.urandom(size)
    folder = os.path.join(versions_root, "tmp")
    hashing = []
    for _ in range(3):
        started = time.perf_counter()
        hashlib.md5(data).hexdigest(), hashlib.sha256(data).hexdigest()
        hashing.append(time.perf_counter() - started)
    # Into pages the page cache takes anew (the files are kept), then into pages just freed.
    growing = [write_file(folder, data, sync) for _ in range(3)]
    for name in growing:
        os.unlink(name[1])
    recycled = []
    for _ in range(3):
        seconds, name = write_file(folder, data, sync)
        recycled.append(seconds)
        os.unlink(name)
    store(True)
    return {
        "rounds": results,
        "hash_seconds": min(hashing),
        "write_new_seconds": statistics.median(seconds for seconds, _name in growing),
        "write_recycled_seconds": statistics.median(recycled),
        "store": store_usage(),
    }


def child_check(var_dir, setup_events):
    """Cut the Change Dump package of the benchmark's changes and list its bitstreams."""
    setup_django(var_dir)
    import io
    import zipfile
    from xml.etree import ElementTree

    from django_resourcesync import storage
    from django_resourcesync.builders import changedump
    from django_resourcesync.models import ChangeEvent, ResourceSet

    resource_set = ResourceSet.objects.get(slug=SLUG)
    events = ChangeEvent.objects.filter(resource_set=resource_set).order_by("id")
    started = time.perf_counter()
    package = changedump.package_changes(resource_set)
    seconds = time.perf_counter() - started
    result = {"seconds": seconds, "events": events.count() - setup_events, "package": None, "store": store_usage()}
    if package is None:
        return result
    rs, sm = "{http://www.openarchives.org/rs/terms/}", "{http://www.sitemaps.org/schemas/sitemap/0.9}"
    with storage.get_storage().open(package.storage_name, "rb") as handle, zipfile.ZipFile(handle) as archive:
        manifest = ElementTree.parse(io.BytesIO(archive.read("manifest.xml"))).getroot()
        members = len(archive.namelist()) - 1
    entries = manifest.findall(f"{sm}url")
    bitstreams = []
    for entry in entries:
        md = entry.find(f"{rs}md")
        if md is not None and md.get("path"):
            hashes = dict(part.split(":", 1) for part in md.get("hash", "").split())
            bitstreams.append(hashes.get("sha-256", ""))
    result["package"] = {
        "number": package.number,
        "entries": len(entries),
        "bitstreams": bitstreams,
        "members": members,
        "size": package.size,
        "first_event": package.first_event,
        "first_benchmark_event": events.values_list("id", flat=True)[setup_events] if result["events"] else None,
    }
    return result


CHILDREN = {"setup": child_setup, "rounds": child_rounds, "check": child_check}


# --------------------------------------------------------------------------------------------
# Reporting


def ms(seconds):
    return seconds * 1000


def p90(values):
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def figures(rounds):
    times = [r["seconds"] for r in rounds]
    return {
        "median": statistics.median(times),
        "p90": p90(times),
        "mean": statistics.fmean(times),
        "min": min(times),
        "max": max(times),
    }


def met(ok):
    return "met" if ok else "NOT met"


def run(options):
    size = int(options.megabytes * MB)
    var_dir = tempfile.mkdtemp(prefix="versions-bench-")
    result_dir = os.path.join(var_dir, "results")
    os.makedirs(result_dir)
    script = __file__
    try:
        progress(f"setup: {options.items} items, the '{SLUG}' set published")
        setup = _steps.run_child(script, "setup", result_dir, var_dir, options.items)
        progress(f"rounds: {options.rounds} each way, {size / MB:.1f} MB a change")
        measured = _steps.run_child(
            script,
            "rounds",
            result_dir,
            var_dir,
            options.rounds,
            options.warmup,
            size,
            not options.no_sync,
            options.keep_store_cache,
        )
        progress("cutting the Change Dump package")
        check = _steps.run_child(script, "check", result_dir, var_dir, setup["events"])

        rounds = measured["rounds"]
        timed = [r for r in rounds if not r["warmup"]]
        on = [r for r in timed if r["on"]]
        off = [r for r in timed if not r["on"]]
        with_store, without = figures(on), figures(off)
        ratio = with_store["median"] / without["median"]

        print(
            f"Version store benchmark, example project  (Python {platform.python_version()}, Django {setup['django']}, "
            f"SQLite {setup['sqlite']}, {os.cpu_count()} CPUs)"
        )
        print(
            f"Setup (not timed): seed_repository --items {options.items} ({setup['files']} files), the '{SLUG}' set with "
            f"{', '.join(CAPABILITIES)} published once, {setup['seconds']:.1f} s; enabled sets: {', '.join(setup['enabled'])}"
        )
        if options.no_sync:
            settle = "no sync (--no-sync)"
        elif options.keep_store_cache:
            settle = "os.sync(), the store's files left in the page cache (--keep-store-cache)"
        else:
            settle = "os.sync() and the store's files dropped from the page cache (posix_fadvise DONTNEED)"
        print(
            f"Each round (not timed): one file written again with {size / MB:.1f} MB of fresh random bytes (os.urandom), "
            f"tracking.changed(model=ItemFile, pks=[pk]), {settle}; nothing processes the change on commit."
        )
        print(
            f'Timed: tracking.process_pending(["{SLUG}"]) alone: reads and hashes (md5, sha-256) the new file and writes '
            f"the change event; with the store on, also writes the bytes into the version store."
        )
        print(
            "The new file was just written: it is read from the page cache in both cases (no disk read is timed); "
            "the store's copy goes to the page cache (no fsync), its writeback is not timed."
        )
        print(
            f"{len(on)} rounds with the store on, {len(off)} without, in ABBA order, "
            f"after {options.warmup} untimed warm-up round(s) of each."
        )
        print()
        print(f"process_pending, one change of a {size / MB:.1f} MB file, ms per change:")
        for label, f in (("store on  (KEEP_VERSIONS=True) ", with_store), ("store off (KEEP_VERSIONS=False)", without)):
            print(
                f"  {label}  median {ms(f['median']):7.1f}   p90 {ms(f['p90']):7.1f}   "
                f"mean {ms(f['mean']):7.1f}   min {ms(f['min']):7.1f}   max {ms(f['max']):7.1f}   "
                f"({size / MB / f['median']:,.0f} MB/s at the median)"
            )
        print(
            f"  ratio with/without: median {ratio:.2f}x, p90 {with_store['p90'] / without['p90']:.2f}x, "
            f"mean {with_store['mean'] / without['mean']:.2f}x;  "
            f"the store adds {ms(with_store['median'] - without['median']):.1f} ms a change at the median"
        )
        print(
            f"  context, single thread, in memory: md5 + sha-256 of {size / MB:.1f} MB {ms(measured['hash_seconds']):.1f} ms; "
            f"writing it in 1 MB chunks to a new file and renaming it (no fsync): "
            f"{ms(measured['write_recycled_seconds']):.1f} ms into pages just freed, "
            f"{ms(measured['write_new_seconds']):.1f} ms into pages the page cache takes anew"
        )
        if not options.no_sync and not options.keep_store_cache:
            print(
                "  (the store's files leave the page cache between rounds, so that it does not grow: pages it takes anew can "
                "cost more, on a virtual machine a fault to the host each; --keep-store-cache measures with it growing)"
            )
        print(f"  target: with the store <= {TARGET_RATIO}x without: {ratio:.2f}x ({met(ratio <= TARGET_RATIO)})")

        # Checks of every round (all of them, warm-up included: each one is a change).
        rounds_on = [r for r in rounds if r["on"]]
        rounds_off = [r for r in rounds if not r["on"]]
        good = sum(1 for r in rounds if r["updated"] == 1 and r["new_events"] == 1 and r["event_ok"])
        kept_on = sum(1 for r in rounds_on if r["kept"] and r["keeps"])
        kept_off = sum(1 for r in rounds_off if r["kept"] or r["keeps"])
        print()
        print(
            f"Checks: {good} of {len(rounds)} rounds wrote one 'updated' event with the new bytes' sha-256 and length; "
            f"{kept_on} of {len(rounds_on)} store-on changes kept in the store; {kept_off} of {len(rounds_off)} "
            f"store-off changes kept (0 expected)"
        )

        # Storage.
        before, after = setup["store"], measured["store"]
        changed_on = size * len(rounds_on)
        grown = after["bytes"] - before["bytes"]
        print()
        print(
            f"Storage the store uses after the run (<documents storage>/<STORAGE_PREFIX>/versions): {after['bytes']:,} bytes "
            f"({after['bytes'] / MB:.1f} MB) in {after['files']} files; {after['rows']} Version rows "
            f"({after['row_bytes']:,} bytes by their lengths); spool files left in its tmp folder: {after['spooled']}"
        )
        print(
            f"  before the rounds: {before['bytes']:,} bytes in {before['files']} files, {before['rows']} Version rows; "
            f"the benchmark's changes added {grown:,} bytes"
        )
        print(
            f"Bytes of the changed files: {len(rounds)} changes of {size:,} bytes = {size * len(rounds):,} bytes "
            f"({size * len(rounds) / MB:.1f} MB); of the {len(rounds_on)} store-on changes {changed_on:,} bytes "
            f"({changed_on / MB:.1f} MB): the store holds {grown / changed_on if changed_on else 0:.2f}x their bytes"
        )

        # The Change Dump package.
        print()
        package = check["package"]
        if package is None:
            print(f"Change Dump: no package cut ({check['events']} change events since the setup)")
        else:
            on_hashes = {r["sha256"] for r in rounds_on}
            off_hashes = {r["sha256"] for r in rounds_off}
            packed = package["bitstreams"]
            packed_on = sum(1 for digest in packed if digest in on_hashes)
            packed_off = sum(1 for digest in packed if digest in off_hashes)
            only_ours = package["first_benchmark_event"] == package["first_event"]
            print(
                f"Change Dump package #{package['number']} cut at the end (package_changes, not timed: {check['seconds']:.1f} s, "
                f"{package['size'] / MB:.1f} MB): {package['entries']} entries for the {check['events']} changes of the run "
                f"(it starts at the run's first change: {only_ours}), {len(packed)} with a bitstream "
                f"({package['members']} members)"
            )
            print(
                f"  bitstream entries of store-on changes: {packed_on} of {len(rounds_on)} "
                f"({'OK' if packed_on == len(rounds_on) else 'MISMATCH'}); of store-off changes: {packed_off} of "
                f"{len(rounds_off)} (packed from the file's current bytes, only if they are still that change's)"
            )
        if check["store"]["bytes"] != after["bytes"]:
            print(
                f"  after the cut the store holds {check['store']['bytes']:,} bytes in {check['store']['files']} files, "
                f"{check['store']['rows']} Version rows"
            )
    finally:
        if options.keep:
            progress(f"kept {var_dir}")
        else:
            shutil.rmtree(var_dir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=24, help="timed rounds with the store on, and as many off (default 24)")
    parser.add_argument("--megabytes", type=float, default=10.0, help="size of the changed file in MB (default 10)")
    parser.add_argument("--items", type=int, default=20, help="items seeded (default 20)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds of each before the timed ones (default 1)")
    parser.add_argument("--no-sync", action="store_true", help="do not os.sync() before each timed step")
    parser.add_argument(
        "--keep-store-cache",
        action="store_true",
        help="leave the store's files in the page cache after each round (it then grows by a file a store-on round)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    add_child_arguments(parser, CHILDREN)
    options = parser.parse_args()
    if run_as_child(options, CHILDREN):
        return
    if options.rounds < 2:
        parser.error("--rounds must be 2 or more (a p90 needs a few figures)")
    sys.stdout.reconfigure(line_buffering=True)  # the report and the progress lines (stderr) in order
    run(options)


if __name__ == "__main__":
    main()
