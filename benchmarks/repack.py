"""Benchmark: packing a ~1 GiB Resource Dump package again after a withdrawal, against ``zip -0``.

Run from the repository root::

    .venv/bin/python benchmarks/repack.py                         # 500 files, 1 GiB, 3 rounds
    .venv/bin/python benchmarks/repack.py --rounds 5 --cache warm
    .venv/bin/python benchmarks/repack.py --files 1000 --total-gb 1 --profile always

When a resource leaves a set, each Resource Dump package that held its bytes is packed again at
once without them, by copying the package's other members (see ``repack`` and ``_repack`` in
``django_resourcesync/builders/resourcedump.py``). This measures that for one package of about
1 GiB, against Info-ZIP ``zip -0`` writing a package of the same files.

Setup (not timed): a fresh temporary ``EXAMPLE_VAR_DIR`` (the example project, SQLite, files on
the filesystem) is seeded as ``dumps.py`` seeds it: one Collection, Items of 4 files each, N
files of seeded, incompressible bytes whose sizes (a few KB to a few MB) sum to exactly
``--total-gb`` GiB, and the ``bitstreams`` set with the capabilities ``resourcelist`` and
``resourcedump``. ``DUMP_PACKAGE_BYTES`` is set above the total so that the dump is ONE package.

Each round, in children of their own (this script re-run with ``--child``):

1. **publish** (not timed): every item is made public again (the item made private the round
   before) and ``rebuild_set`` brings the set's record up to date and publishes a Resource List
   and a Resource Dump: a fresh package of all N files, of the same size every round. Retired
   builds are deleted, so that the timed step touches the published build alone. The item to
   make private is the middle one of the package (by key);
2. **ours**: in the embedded mode (no broker: change processing runs on a thread of the
   process after the commit), ``item.is_public = False; item.save()``, then
   ``outbox.dispatcher.flush()`` waits until the change is processed. Two figures come from
   that one step: the **repack**, the wall time of ``resourcedump.withdraw_from_build`` (a
   timer wrapped around it: the package and its manifest copied without the item's files, the
   Resource Dump written again, all inside the processing's transaction), which is what the
   target is about; and the **round**, from the save to the change processed (the thread's
   50 ms wait to gather changes, the Resource List cut, the commit, which deletes the old
   package's file), which is what a Destination waits for before the dump covers the list again.
   Checks (untimed, after): one package left, ``-r2``, with N minus the item's files, ``unzip
   -tqq`` OK, its manifest the same bytes as the one beside it, the old package's file gone,
   no pending change left;
3. **zip -0**: ``zip -0 -q out.zip -@`` run in ``MEDIA_ROOT`` with the same files (the
   package's members after the withdrawal: every file but the item's) on its standard input,
   writing into the same filesystem, under ``/usr/bin/time`` for its peak RSS.

The two timed steps alternate which goes first, round by round, since the machine is noisy.
Before each, the page cache is dropped (``sync; echo 3 > /proc/sys/vm/drop_caches``, which needs
root; the script says whether it worked), so ours reads the stored package from disk and zip the
media files; with ``--cache warm``, ``sync`` then a read of what the step reads (the package, or
the media files) instead, so both read from memory.

It prints per round the repack's and the round's wall seconds, zip's, the ratio repack / zip,
and our peak RSS beside the baseline (RSS before the save: interpreter and Django); then the
medians, the median of the rounds' ratios, and the target (repack at most 1.2x zip's time;
memory flat, whatever the package's size). Nothing is asserted. With ``--profile auto`` (the
default), a median ratio above the target runs one more round of ours under cProfile: then
``withdraw_from_build`` is called on the main thread, in a transaction, as the withdrawal
receiver calls it (cProfile sees only the thread it runs on). GB = GiB = 2**30 bytes,
MB = MiB = 2**20 bytes.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _steps
import dumps
from _steps import add_child_arguments, current_rss_kib, mib, peak_rss_kib, run_as_child

SLUG = dumps.SLUG
TARGET_RATIO = 1.2
OURS = "ours (repack)"
ZIP = "zip -0"


def setup_django(var_dir):
    """The example project in ``var_dir``, with no broker (the embedded mode), its URLconf
    loaded, as a running site has it (documents are written with URIs that it reverses)."""
    _steps.setup_django_example(var_dir)
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018  (imports the URLconf and the views)


def _package_bytes(total):
    """A ``DUMP_PACKAGE_BYTES`` above ``total``: the set packs into one package."""
    from django.conf import settings

    from django_resourcesync.conf import app_settings

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "DUMP_PACKAGE_BYTES": max(2**30, total) + 2**30}
    app_settings.reload()
    return app_settings.DUMP_PACKAGE_BYTES


def _published(resource_set):
    """The published Resource Dump build and its live (not withdrawn) packages."""
    from django_resourcesync import capabilities
    from django_resourcesync.models import Build, Document
    from django_resourcesync.packaging import ZIP_MEDIA_TYPE

    build = Build.objects.get(resource_set=resource_set, capability=capabilities.RESOURCEDUMP,
                              status=Build.Status.PUBLISHED)
    packages = list(Document.objects.filter(build=build, media_type=ZIP_MEDIA_TYPE, withdrawn__isnull=True))
    return build, packages


# --------------------------------------------------------------------------------------------
# Children: each runs one step in a fresh interpreter and writes a JSON result file.


def child_publish(var_dir, total):
    """Every item public again, a rebuild, retired builds deleted (not timed); returns the
    package and the item to make private, with the files a package without it holds."""
    setup_django(var_dir)
    from django.conf import settings

    from django_resourcesync import storage
    from django_resourcesync.models import Build, ResourceSet
    from django_resourcesync.rebuild import rebuild_set
    from example_project.repository.models import Item, ItemFile

    package_bytes = _package_bytes(total)
    Item.objects.filter(is_public=False).update(is_public=True)  # no signal: the rebuild's reconcile finds it
    resource_set = ResourceSet.objects.get(slug=SLUG)
    started = time.perf_counter()
    rebuild_set(resource_set)
    seconds = time.perf_counter() - started
    Build.objects.filter(resource_set=resource_set, status=Build.Status.RETIRED).delete()  # their files go too
    _build, packages = _published(resource_set)
    files = list(ItemFile.objects.filter(item__is_public=True).order_by("pk").values_list("item_id", "file"))
    items = sorted({item for item, _name in files})
    item = items[len(items) // 2]
    media_root = Path(settings.MEDIA_ROOT)
    backend = storage.get_storage()
    return {
        "seconds": seconds,
        "package_bytes": package_bytes,
        "packages": [{"name": p.name, "size": p.size, "entries": p.entries, "path": backend.path(p.storage_name)}
                     for p in packages],
        "item": item,
        "leaving_bytes": sum((media_root / name).stat().st_size for owner, name in files if owner == item),
        "leaving": sum(1 for owner, _name in files if owner == item),
        "keep": [name for owner, name in files if owner != item],
        "keep_bytes": sum((media_root / name).stat().st_size for owner, name in files if owner != item),
        "media_root": str(media_root),
    }


def child_withdraw(var_dir, item_pk):
    """Time one item made private, from its save to its change processed, and the repack (the
    call of ``withdraw_from_build`` for the published dump) within it; then check the result."""
    setup_django(var_dir)
    from django_resourcesync import running
    from django_resourcesync.builders import resourcedump
    from django_resourcesync.models import PendingChange, ResourceSet
    from django_resourcesync.tracking import outbox
    from example_project.repository.models import Item

    resource_set = ResourceSet.objects.get(slug=SLUG)
    build, before = _published(resource_set)
    item = Item.objects.get(pk=item_pk)
    calls = []
    withdraw_from_build = resourcedump.withdraw_from_build

    def timed(build, record_ids, locs):
        started = time.perf_counter()
        try:
            return withdraw_from_build(build, record_ids, locs)
        finally:
            calls.append({"build": build.pk, "seconds": time.perf_counter() - started, "resources": len(record_ids)})

    resourcedump.withdraw_from_build = timed  # the withdrawal receiver looks it up on the module
    baseline = current_rss_kib()
    started = time.perf_counter()
    item.is_public = False
    item.save()
    saved = time.perf_counter() - started
    flushed = outbox.dispatcher.flush(timeout=3600)
    seconds = time.perf_counter() - started
    peak = peak_rss_kib()
    resourcedump.withdraw_from_build = withdraw_from_build
    build.refresh_from_db()
    return {
        "mode": running.mode().name,
        "seconds": seconds,
        "save_seconds": saved,
        "repack_seconds": sum(call["seconds"] for call in calls if call["build"] == build.pk),
        "calls": calls,
        "flushed": flushed,
        "pending": PendingChange.objects.count(),
        "baseline_kib": baseline,
        "peak_kib": peak,
        "entries": build.entries,
        **_check(build, before),
    }


def _check(build, before):
    """What the repack left: the packages served, each tested, and the old packages' files."""
    import zipfile

    from django_resourcesync import storage
    from django_resourcesync.builders.resourcedump import manifest_of
    from django_resourcesync.models import Document
    from django_resourcesync.packaging import MANIFEST, ZIP_MEDIA_TYPE

    backend = storage.get_storage()
    live = {document.name: document for document in Document.objects.filter(build=build, withdrawn__isnull=True)}
    packages = []
    for name in sorted(name for name, document in live.items() if document.media_type == ZIP_MEDIA_TYPE):
        path = backend.path(live[name].storage_name)
        with zipfile.ZipFile(path) as archive:
            members = len(archive.namelist()) - 1
            inner = archive.read(MANIFEST)
        with backend.open(live[manifest_of(name)].storage_name, "rb") as beside:
            same = beside.read() == inner
        test = subprocess.run(["unzip", "-tqq", path], capture_output=True)
        packages.append({"name": name, "size": live[name].size, "on_disk": os.path.getsize(path), "entries": live[name].entries,
                         "members": members, "manifest_same": same, "unzip": test.returncode})
    return {"packages": packages, "old_gone": not any(os.path.exists(backend.path(p.storage_name)) for p in before)}


def child_zip(var_dir, media_root, names):
    """Time ``zip -0 -q out.zip -@`` run in ``MEDIA_ROOT`` over ``names`` (on its standard
    input), with its peak RSS; ``out.zip`` is in ``var_dir``, on the same filesystem."""
    import zipfile

    out_dir = Path(var_dir) / "zip"
    out_dir.mkdir(exist_ok=True)
    out = out_dir / "out.zip"
    out.unlink(missing_ok=True)
    time_file = out_dir / "time.txt"
    command = ["/usr/bin/time", "-f", "%M", "-o", str(time_file), "zip", "-0", "-q", str(out), "-@"]
    started = time.perf_counter()
    subprocess.run(command, cwd=media_root, input="\n".join(names) + "\n", text=True, check=True)
    seconds = time.perf_counter() - started
    with zipfile.ZipFile(out) as archive:
        files = [info for info in archive.infolist() if not info.is_dir()]
    test = subprocess.run(["unzip", "-tqq", str(out)], capture_output=True)
    return {
        "seconds": seconds,
        "peak_kib": int(time_file.read_text().split()[-1]),
        "files": len(files),
        "bytes": sum(info.file_size for info in files),
        "size": out.stat().st_size,
        "unzip": test.returncode,
    }


def child_profile(var_dir, item_pk, top):
    """The repack of one item's files under cProfile, on the main thread: the item made private
    without a signal, then ``withdraw_from_build`` in a transaction, as the receiver calls it."""
    setup_django(var_dir)
    from django.db import transaction

    from django_resourcesync.builders import resourcedump
    from django_resourcesync.models import Resource, ResourceSet
    from example_project.repository.models import Item, ItemFile

    resource_set = ResourceSet.objects.get(slug=SLUG)
    build, _packages = _published(resource_set)
    Item.objects.filter(pk=item_pk).update(is_public=False)
    keys = [str(pk) for pk in ItemFile.objects.filter(item_id=item_pk).values_list("pk", flat=True)]
    records = list(Resource.objects.filter(resource_set=resource_set, object_pk__in=keys).values_list("pk", "uri"))

    def withdraw():
        with transaction.atomic():
            return resourcedump.withdraw_from_build(build, [pk for pk, _uri in records], [uri for _pk, uri in records])

    return _steps.profiled(withdraw, top=top, keys=("tottime", "cumulative"))


CHILDREN = {
    "seed": dumps.child_seed, "read": dumps.child_read, "publish": child_publish, "withdraw": child_withdraw,
    "zip": child_zip, "profile": child_profile,
}


def run_child(role, result_dir, *args, tag=""):
    return _steps.run_child(__file__, role, result_dir, *args, tag=tag)


# --------------------------------------------------------------------------------------------
# Reporting


def prepare(cache, folder, result_dir, tag):
    """The page cache in the same state before a timed step; returns a note. ``folder``: what
    the step reads (the package's folder, or the media files)."""
    if cache == "warm":
        subprocess.run(["sync"], check=False)
        read = run_child("read", result_dir, folder, tag=tag)
        speed = dumps.mb_per_s(read["bytes"], read["seconds"])
        return f"synced, then warmed: read {read['bytes'] / 2**20:,.0f} MB at {speed:,.0f} MB/s"
    _worked, note = dumps.drop_caches()
    return note


def check_line(result, published):
    old = published["packages"]
    expected = sum(p["entries"] for p in old) - published["leaving"]
    packages = result["packages"]
    ok = (
        result["flushed"] and result["pending"] == 0 and result["old_gone"] and len(packages) == len(old)
        and all(p["unzip"] == 0 and p["manifest_same"] and p["members"] == p["entries"] and p["size"] == p["on_disk"]
                for p in packages)
        and sum(p["entries"] for p in packages) == expected == result["entries"]
    )
    described = ", ".join(f"{p['name'].rsplit('/', 1)[-1]}: {p['members']} members, {p['size'] / 2**20:,.1f} MB"
                          for p in packages)
    return (
        f"    check: {described or 'no package'} (expected {expected} members), "
        f"unzip -tqq {'OK' if all(p['unzip'] == 0 for p in packages) else 'FAILED'}, manifest copy "
        f"{'identical' if all(p['manifest_same'] for p in packages) else 'DIFFERS'}, old file "
        f"{'gone' if result['old_gone'] else 'STILL THERE'}, pending changes {result['pending']} -> {'OK' if ok else 'MISMATCH'}"
    )


def run(n, total_gib, rounds, cache, profile, top, keep):
    total = int(total_gib * 2**30)
    var_dir = tempfile.mkdtemp(prefix="repack-bench-")
    print(f"Packing a Resource Dump package again after a withdrawal: {OURS} against Info-ZIP zip -0 "
          f"(Python {sys.version.split()[0]}; every step a child process of its own; MB = 2**20 bytes)")
    try:
        results = Path(var_dir, "results")
        results.mkdir()
        seed = run_child("seed", results, var_dir, n, total)
        print(f"data in {var_dir}: {seed['files']:,} files of {seed['items']:,} items, {seed['bytes'] / 2**30:.2f} GiB "
              f"({seed['bytes']:,} bytes) for one package, each from {seed['min'] / 1024:,.1f} KB "
              f"to {seed['max'] / 2**20:,.2f} MB (median {seed['median'] / 1024:,.1f} KB), "
              f"written in {seed['seconds']:.1f} s (not timed)")
        if cache == "warm":
            print("page cache before each timed step: sync, then what the step reads is read once [--cache warm]")
        else:
            worked, note = dumps.drop_caches()
            print("page cache before each timed step: "
                  f"{'dropped (sync; echo 3 > /proc/sys/vm/drop_caches)' if worked else note} [--cache cold]")
        ours, theirs, ratios, round_ratios, published = [], [], [], [], None
        for number in range(rounds):
            published = run_child("publish", results, var_dir, total, tag=f"-{number}")
            (package,) = published["packages"]  # one package, by DUMP_PACKAGE_BYTES
            print()
            print(f"round {number + 1}/{rounds}: published {package['name']} ({package['size'] / 2**20:,.1f} MB, "
                  f"{package['entries']} members; DUMP_PACKAGE_BYTES {published['package_bytes'] / 2**30:.0f} GiB) "
                  f"by a rebuild in {published['seconds']:.1f} s (not timed); "
                  f"item {published['item']} ({published['leaving']} files, {published['leaving_bytes'] / 2**20:,.1f} MB) "
                  f"to be made private")
            steps = ["ours", "zip"] if number % 2 == 0 else ["zip", "ours"]
            for step in steps:
                tag = f"-{step}-{number}"
                if step == "ours":
                    note = prepare(cache, str(Path(package["path"]).parent), results, tag)
                    result = run_child("withdraw", results, var_dir, published["item"], tag=tag)
                    ours.append(result)
                    print(f"  {OURS:<16} {result['repack_seconds']:>7.2f} s   (save to processed {result['seconds']:.2f} s; "
                          f"the save {result['save_seconds'] * 1000:.1f} ms; mode {result['mode']})  "
                          f"peak RSS {mib(result['peak_kib']):.1f} MB, baseline {mib(result['baseline_kib']):.1f} MB  [{note}]")
                    print(check_line(result, published))
                else:
                    note = prepare(cache, published["media_root"], results, tag)
                    result = run_child("zip", results, var_dir, published["media_root"], published["keep"], tag=tag)
                    theirs.append(result)
                    print(f"  {ZIP + ' -q -@':<16} {result['seconds']:>7.2f} s   "
                          f"({result['files']} files, {result['bytes']:,} bytes "
                          f"-> {result['size'] / 2**20:,.1f} MB; unzip -tqq {'OK' if result['unzip'] == 0 else 'FAILED'})  "
                          f"peak RSS {mib(result['peak_kib']):.1f} MB  [{note}]")
            ratios.append(ours[-1]["repack_seconds"] / theirs[-1]["seconds"])
            round_ratios.append(ours[-1]["seconds"] / theirs[-1]["seconds"])
            print(f"  ratio repack / zip {ratios[-1]:.2f}x   (save to processed / zip {round_ratios[-1]:.2f}x; "
                  f"{'ours' if steps[0] == 'ours' else 'zip'} ran first)")

        repack = statistics.median(result["repack_seconds"] for result in ours)
        whole = statistics.median(result["seconds"] for result in ours)
        zipped = statistics.median(result["seconds"] for result in theirs)
        peak = max(mib(result["peak_kib"]) for result in ours)
        baseline = max(mib(result["baseline_kib"]) for result in ours)
        print()
        print(f"medians of {rounds} rounds: repack {repack:.2f} s, save to processed {whole:.2f} s, zip -0 {zipped:.2f} s")
        print(f"  repack / zip: {repack / zipped:.2f}x (medians); {statistics.median(ratios):.2f}x (median of the rounds' "
              f"ratios: {', '.join(f'{ratio:.2f}' for ratio in ratios)})")
        print(f"  save to processed / zip: {whole / zipped:.2f}x (medians)")
        print(f"  our peak RSS {peak:.1f} MB at most (baseline {baseline:.1f} MB before the save: +{peak - baseline:.1f} MB); "
              f"zip's {max(mib(result['peak_kib']) for result in theirs):.1f} MB")
        print()
        ratio = statistics.median(ratios)
        print(f"Target (printed, not asserted): repack at most {TARGET_RATIO:.1f}x the time zip -0 takes: "
              f"{ratio:.2f}x ({'met' if ratio <= TARGET_RATIO else 'NOT met'})")

        if profile == "always" or (profile == "auto" and ratio > TARGET_RATIO):
            published = run_child("publish", results, var_dir, total, tag="-profile")
            (package,) = published["packages"]
            note = prepare(cache, str(Path(package["path"]).parent), results, "-profile")
            report = run_child("profile", results, var_dir, published["item"], top, tag="-profile")
            print()
            print(f"cProfile of one more repack, withdraw_from_build on the main thread ({report['seconds']:.2f} s "
                  f"under the profiler) [{note}]")
            for key in ("tottime", "cumulative"):
                print(f"--- the top {top} functions by {key} ---")
                print(report[key])
    finally:
        if not keep:
            shutil.rmtree(var_dir, ignore_errors=True)
        else:
            print(f"kept {var_dir}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=500, help="number of files (default 500)")
    parser.add_argument("--total-gb", type=float, default=1.0, help="their total size in GiB (default 1)")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds (default 3)")
    parser.add_argument("--cache", choices=["cold", "warm"], default="cold",
                        help="drop the page cache before each timed step (cold, default), or read what it reads (warm)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--profile", choices=["auto", "always", "never"], default="auto",
                        help="cProfile one more repack: when the target is missed (auto), always or never")
    parser.add_argument("--top", type=int, default=20, help="functions shown by the profile (default 20)")
    add_child_arguments(parser, CHILDREN)
    options = parser.parse_args()
    if run_as_child(options, CHILDREN):
        return
    if options.files < 2 * dumps.FILES_PER_ITEM or options.total_gb <= 0 or options.rounds < 1:
        parser.error(f"--files must be at least {2 * dumps.FILES_PER_ITEM}, --rounds positive and --total-gb above 0")
    run(options.files, options.total_gb, options.rounds, options.cache, options.profile, options.top, options.keep)


if __name__ == "__main__":
    main()
