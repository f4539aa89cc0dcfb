"""Benchmark: building a Resource Dump of ~2 GB of bitstreams, against Info-ZIP ``zip -0``.

Run from the repository root::

    .venv/bin/python benchmarks/dumps.py                          # 3000 files, 2.2 GiB, 3 rounds
    .venv/bin/python benchmarks/dumps.py --files 1000 --total-gb 0.5 --repeat 3 --profile never  # quicker
    .venv/bin/python benchmarks/dumps.py --files 3000 --total-gb 2.2 --profile always

The script:

1. creates a fresh temporary directory and points ``EXAMPLE_VAR_DIR`` at it (the demo project's
   SQLite database, media files and ResourceSync storage live there), runs ``migrate``, creates
   one Collection, Items (``FILES_PER_ITEM`` files each) and N ``ItemFile`` rows whose FileField
   names files written straight under ``MEDIA_ROOT``. File sizes are drawn deterministically
   (log-uniform weights, seeded) and scaled so that they sum to exactly ``--total-gb`` GiB; they
   range from a few KiB to a few MiB. The bytes come from a seeded ``random.Random().randbytes``,
   so they are deterministic and incompressible. The ``bitstreams`` ResourceSet gets the
   capabilities ``["resourcelist", "resourcedump"]``, and ``tracking.reconcile()`` runs once so
   that the Resource rows (with md5, sha-256, length) exist. None of this is timed as a contender;
   the seeding and reconcile times are printed for information;
2. runs ``--repeat`` rounds (default 3) of three timed steps: ``build_resourcedump(resource_set,
   refresh=False)`` with the default ``DUMP_PACKAGE_BYTES`` (1 GiB, so 3 packages for 2.2 GiB);
   Info-ZIP ``zip -0 -r -q out.zip items`` (run in ``MEDIA_ROOT``) on the same files, under
   ``/usr/bin/time`` for its peak RSS (``getrusage(RUSAGE_CHILDREN)`` if that is missing); and a
   build with 256 MiB packages, to show that peak RSS does not depend on the package size.
   ``zip`` runs in the middle of every round; our two builds take turns before and after it
   (default, zip, 256 MiB; then 256 MiB, zip, default; ...);
3. pairs the runs: each round's build against the ``zip`` run of the same round. The ratio of
   throughputs (and of CPU seconds) is taken per pair, and the script prints the min, median and
   max of the ratios; the target is judged on their median.

Every timed step reports its wall seconds and its CPU seconds: user + system time of the process
doing the work (all its threads, and the programs it started and waited for: ``zip`` and
``/usr/bin/time``), from ``getrusage`` before and after the step, in the step's child process.

Before each timed step the OS page cache is dropped (``sync; echo 3 > /proc/sys/vm/drop_caches``,
which needs root) so every contender reads the bitstreams from disk alike; the script prints
whether that worked. ``--cache warm`` instead reads every file once before each step, so every
contender reads from the page cache alike. A "read only" line (reading every file in 1 MiB
chunks, nothing else) and a hashing-speed line give the I/O and CPU context of the figures.

Throughput is bitstream bytes (the sum of the file sizes) per wall second, for both contenders;
CPU seconds beside it show how much of the machine each used for that.
The contenders do not do the same work: ``zip`` computes one CRC-32 per file; our build also
computes md5 and sha-256 of every bitstream (to check it against the recorded hashes and put it in
the manifest) and of every package as a whole (for the Resource Dump's ``rs:md hash``), writes
manifests and publishes the build in the database.

Every measured step runs in its own child process (this script re-run with the hidden ``--child``
option), so the peak RSS (``ru_maxrss``) belongs to that step alone; each child also reports its
RSS just before the timed step (baseline: interpreter and Django). Checks (``unzip -tqq`` on every
package, member and manifest counts against N, each published manifest byte for byte against the
one packed in its package) run after the measurements, in the same child.

Nothing is asserted: the script prints figures, ratios and the targets (our throughput at least
1.2x that of ``zip -0``; peak RSS under 150 MB whatever the package size). With ``--profile auto``
(the default) it runs one more build under cProfile when the throughput target is missed, and
prints the top functions. MB = MiB = 2**20 bytes, GB = GiB = 2**30 bytes.
"""

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _steps
from _steps import add_child_arguments, cpu_since, cpu_times, current_rss_kib, mib, peak_rss_kib, run_as_child

ROOT = Path(__file__).resolve().parent.parent
SLUG = "bitstreams"  # the demo project's set of files of public items (made by its migrations)
CAPABILITIES = ["resourcelist", "resourcedump"]
FILES_PER_ITEM = 4
SEED = 20240601
MIN_WEIGHT, MAX_WEIGHT = 1.0, 1000.0  # file sizes span about three orders of magnitude
WRITE_CHUNK = 4 * 1024 * 1024
READ_CHUNK = 1024 * 1024

DEFAULT_PACKAGE = None  # the app's default DUMP_PACKAGE_BYTES (1 GiB)
SMALL_PACKAGE = 256 * 1024 * 1024

TARGET_RATIO = 1.2
TARGET_PEAK_MB = 150.0

OURS = "django-resourcesync"
ZIP = "zip -0"


# --------------------------------------------------------------------------------------------
# Measuring


def mb_per_s(nbytes, seconds):
    return nbytes / 2**20 / seconds if seconds else float("inf")


def drop_caches():
    """Write dirty pages back and drop the page cache; returns (worked, note)."""
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return True, "page cache dropped"
    except OSError as exc:
        return False, f"could not drop the page cache ({exc.strerror}); reads may come from memory"


def file_sizes(n, total):
    """N deterministic sizes from a few KiB to a few MiB that sum to exactly ``total`` bytes."""
    rng = random.Random(SEED)
    weights = [MIN_WEIGHT * (MAX_WEIGHT / MIN_WEIGHT) ** rng.random() for _ in range(n)]
    scale = total / sum(weights)
    sizes = [max(1, int(weight * scale)) for weight in weights]
    sizes[-1] += total - sum(sizes)
    return sizes


# --------------------------------------------------------------------------------------------
# Children: each runs one step in a fresh interpreter and writes a JSON result file.


setup_django = _steps.setup_django_sqlite


def child_seed(var_dir, n, total):
    """Migrate, then create the collection, items, files and ItemFile rows (not timed as a build)."""
    setup_django(var_dir)
    from django.conf import settings
    from django.core.management import call_command
    from django.db import transaction

    from django_resourcesync.models import ResourceSet
    from example_project.repository.models import Collection, Item, ItemFile

    call_command("migrate", verbosity=0, interactive=False)
    started = time.perf_counter()
    sizes = file_sizes(n, total)
    media_root = Path(settings.MEDIA_ROOT)
    rng = random.Random(SEED + 1)
    with transaction.atomic():
        collection = Collection.objects.create(name="Benchmark", slug="benchmark")
        items = Item.objects.bulk_create(
            Item(collection=collection, title=f"Benchmark item {k}", creator="Benchmark", is_public=True)
            for k in range((n + FILES_PER_ITEM - 1) // FILES_PER_ITEM)
        )
        rows = []
        for i, size in enumerate(sizes):
            item = items[i // FILES_PER_ITEM]
            name = f"file-{i:05d}.bin"
            relative = f"items/{item.pk}/{name}"
            path = media_root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as fh:
                left = size
                while left:
                    step = min(left, WRITE_CHUNK)
                    fh.write(rng.randbytes(step))
                    left -= step
            rows.append(ItemFile(item=item, name=name, media_type="application/octet-stream", file=relative))
        ItemFile.objects.bulk_create(rows, batch_size=1000)
        resource_set = ResourceSet.objects.get(slug=SLUG)
        resource_set.capabilities = CAPABILITIES
        resource_set.save(update_fields=["capabilities"])
    written = sum(path.stat().st_size for path in media_root.rglob("*") if path.is_file())
    return {
        "seconds": time.perf_counter() - started,
        "files": ItemFile.objects.count(),
        "items": len(items),
        "bytes": written,
        "min": min(sizes),
        "median": int(statistics.median(sizes)),
        "max": max(sizes),
        "media_root": str(media_root),
    }


def child_reconcile(var_dir):
    """Record the set's resources (reading and hashing every file): not part of any timing."""
    setup_django(var_dir)
    from django_resourcesync import tracking
    from django_resourcesync.models import Resource, ResourceSet

    resource_set = ResourceSet.objects.get(slug=SLUG)
    started = time.perf_counter()
    tracking.reconcile(resource_set)
    seconds = time.perf_counter() - started
    rows = Resource.objects.filter(resource_set=resource_set)
    return {
        "seconds": seconds,
        "resources": rows.count(),
        "hashed": rows.exclude(sha256="").exclude(md5="").count(),
        "bytes": sum(length or 0 for length in rows.values_list("length", flat=True)),
    }


def child_read(media_root):
    """Read every bitstream once in 1 MiB chunks (I/O context; also warms the page cache)."""
    paths = sorted(path for path in Path(media_root).rglob("*") if path.is_file())
    buffer = bytearray(READ_CHUNK)
    view = memoryview(buffer)
    total = 0
    started = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as fh:
            while True:
                got = fh.readinto(view)
                if not got:
                    break
                total += got
    return {"seconds": time.perf_counter() - started, "bytes": total, "files": len(paths)}


def child_hashing(megabytes):
    """Speed of the digests on this CPU, over 1 MiB buffers (single thread), in MB per CPU second
    of the thread: what other processes take of a loaded machine does not lower it."""
    import hashlib
    import zlib

    data = random.Random(SEED).randbytes(READ_CHUNK)
    speeds = {}
    for name, digest in (
        ("md5", lambda: hashlib.md5(data).digest()),
        ("sha256", lambda: hashlib.sha256(data).digest()),
        ("crc32", lambda: zlib.crc32(data)),
    ):
        started = time.thread_time()
        for _ in range(megabytes):
            digest()
        speeds[name] = megabytes / (time.thread_time() - started)
    return speeds


def _set_package_bytes(package_bytes):
    from django.conf import settings

    from django_resourcesync.conf import app_settings

    if package_bytes is not None:
        settings.RESOURCESYNC = {**settings.RESOURCESYNC, "DUMP_PACKAGE_BYTES": package_bytes}
        app_settings.reload()
    return app_settings.DUMP_PACKAGE_BYTES


def child_build(var_dir, package_bytes):
    """Time build_resourcedump(refresh=False), then check what it published."""
    import re
    import zipfile

    setup_django(var_dir)
    from django_resourcesync import storage
    from django_resourcesync.builders.resourcedump import NAME, build_resourcedump
    from django_resourcesync.models import Document, Resource, ResourceSet
    from django_resourcesync.packaging import MANIFEST, ZIP_MEDIA_TYPE

    resource_set = ResourceSet.objects.get(slug=SLUG)
    effective = _set_package_bytes(package_bytes)
    bitstream_bytes = sum(
        length or 0 for length in Resource.objects.filter(resource_set=resource_set).values_list("length", flat=True)
    )
    baseline = current_rss_kib()
    cpu = cpu_times()
    started = time.perf_counter()
    build = build_resourcedump(resource_set, refresh=False)
    seconds = time.perf_counter() - started
    cpu = cpu_since(cpu)
    peak = peak_rss_kib()

    # Checks (after the measurements).
    backend = storage.get_storage()
    documents = Document.objects.filter(build=build)
    packages = list(documents.filter(media_type=ZIP_MEDIA_TYPE).order_by("name"))
    manifests = list(documents.filter(name__endswith="-manifest.xml").order_by("name"))
    dump = documents.get(name=NAME)
    with backend.open(dump.storage_name, "rb") as fh:
        dump_urls = fh.read().count(b"<url>")
    url = re.compile(rb"<url>")
    checks = []
    unzip_ok = True
    members = manifest_urls = 0
    unzip_started = time.perf_counter()
    for package, manifest in zip(packages, manifests):
        path = backend.path(package.storage_name)
        on_disk = os.path.getsize(path)
        test = subprocess.run(["unzip", "-tqq", path], capture_output=True, text=True)
        unzip_ok = unzip_ok and test.returncode == 0
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            inner = archive.read(MANIFEST)
        with backend.open(manifest.storage_name, "rb") as fh:
            beside = fh.read()
        package_members = len([name for name in names if name != MANIFEST])
        package_urls = len(url.findall(inner))
        members += package_members
        manifest_urls += package_urls
        checks.append({
            "name": package.name, "size": package.size, "on_disk": on_disk, "entries": package.entries,
            "members": package_members, "manifest_urls": package_urls, "manifest_same": inner == beside,
            "unzip": test.returncode, "unzip_output": (test.stdout + test.stderr).strip()[:300],
        })
    # One package (the smallest) is also CRC-checked by Python's zipfile, as a second opinion.
    smallest = min(packages, key=lambda package: package.size)
    with zipfile.ZipFile(backend.path(smallest.storage_name)) as archive:
        testzip = archive.testzip()
    return {
        "seconds": seconds,
        "cpu": cpu,
        "baseline_kib": baseline,
        "peak_kib": peak,
        "package_bytes": effective,
        "bitstream_bytes": bitstream_bytes,
        "build": build.pk,
        "status": build.status,
        "entries": build.entries,
        "report": build.report,
        "packages": checks,
        "package_total": sum(package.size for package in packages),
        "members": members,
        "manifest_urls": manifest_urls,
        "manifest_entries": sum(manifest.entries for manifest in manifests),
        "dump_urls": dump_urls,
        "unzip_ok": unzip_ok,
        "check_seconds": time.perf_counter() - unzip_started,
        "testzip_package": smallest.name,
        "testzip_bad_member": testzip,
    }


def child_zip(var_dir, media_root):
    """Time ``zip -0 -r -q out.zip items`` in MEDIA_ROOT, with its peak RSS."""
    import zipfile

    out_dir = Path(var_dir) / "zip"
    out_dir.mkdir(exist_ok=True)
    out = out_dir / "out.zip"
    out.unlink(missing_ok=True)
    time_file = out_dir / "time.txt"
    zip_command = ["zip", "-0", "-r", "-q", str(out), "items"]
    gnu_time = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)
    command = [gnu_time, "-f", "%M %e", "-o", str(time_file), *zip_command] if gnu_time else zip_command
    cpu = cpu_times()
    started = time.perf_counter()
    subprocess.run(command, cwd=media_root, check=True)
    seconds = time.perf_counter() - started
    cpu = cpu_since(cpu)  # zip's own (and /usr/bin/time's), as this process only waits
    children_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if gnu_time:
        peak, how = int(time_file.read_text().split()[0]), "/usr/bin/time %M"
    else:
        peak, how = children_peak, "getrusage(RUSAGE_CHILDREN)"
    with zipfile.ZipFile(out) as archive:
        files = [info for info in archive.infolist() if not info.is_dir()]
    test = subprocess.run(["unzip", "-tqq", str(out)], capture_output=True)
    version = subprocess.run(["zip", "-v"], capture_output=True, text=True).stdout.splitlines()
    return {
        "seconds": seconds,
        "cpu": cpu,
        "peak_kib": peak,
        "peak_how": how,
        "files": len(files),
        "bytes": sum(info.file_size for info in files),
        "size": out.stat().st_size,
        "unzip": test.returncode,
        "version": next((line.strip() for line in version if line.startswith("This is Zip")), "?"),
    }


def child_prune(var_dir):
    """Delete the set's retired dump builds and their files (between timed steps, not timed), so
    that no timed build spends time pruning an older one when it publishes."""
    setup_django(var_dir)
    from django_resourcesync import capabilities
    from django_resourcesync.models import Build, Document

    retired = Build.objects.filter(resource_set__slug=SLUG, capability=capabilities.RESOURCEDUMP, status=Build.Status.RETIRED)
    return {"deleted": retired.delete()[1].get(Document._meta.label, 0)}


def child_profile(var_dir, top):
    """Run one more build (default package size) under cProfile; return the top functions."""
    setup_django(var_dir)
    from django_resourcesync.builders.resourcedump import build_resourcedump
    from django_resourcesync.models import ResourceSet

    resource_set = ResourceSet.objects.get(slug=SLUG)
    return _steps.profiled(build_resourcedump, resource_set, refresh=False, top=top, keys=("tottime", "cumulative"))


CHILDREN = {
    "seed": child_seed, "reconcile": child_reconcile, "read": child_read, "hashing": child_hashing,
    "build": child_build, "zip": child_zip, "prune": child_prune, "profile": child_profile,
}


def run_child(role, result_dir, *args, tag=""):
    return _steps.run_child(__file__, role, result_dir, *args, tag=tag)


# --------------------------------------------------------------------------------------------
# Reporting


def prepare(cache, var_dir, media_root, result_dir, tag):
    """Put storage and the page cache in the same state before a timed step; returns a note."""
    run_child("prune", result_dir, var_dir, tag=tag)
    if cache == "warm":
        read = run_child("read", result_dir, media_root, tag=tag)
        return f"page cache warmed (read {read['bytes'] / 2**30:.2f} GiB at {mb_per_s(read['bytes'], read['seconds']):,.0f} MB/s)"
    worked, note = drop_caches()
    return note


def cpu_text(result):
    cpu = result["cpu"]
    return f"{cpu['user'] + cpu['sys']:>7.2f} s CPU ({cpu['user']:.2f} user + {cpu['sys']:.2f} sys)"


def build_lines(label, result, bitstreams):
    return [
        f"  {label:<38} {mb_per_s(bitstreams, result['seconds']):>8,.1f} MB/s  {result['seconds']:>7.2f} s wall"
        f"  {cpu_text(result)}",
        f"  {'':<38} peak RSS {mib(result['peak_kib']):.1f} MB, baseline RSS {mib(result['baseline_kib']):.1f} MB; "
        f"{len(result['packages'])} packages, {result['package_total'] / 2**20:,.1f} MB in all: "
        + ", ".join(f"{p['size'] / 2**20:,.1f} MB/{p['entries']} files" for p in result["packages"]),
    ]


def zip_lines(label, result):
    return [
        f"  {label:<38} {mb_per_s(result['bytes'], result['seconds']):>8,.1f} MB/s  {result['seconds']:>7.2f} s wall"
        f"  {cpu_text(result)}",
        f"  {'':<38} peak RSS {mib(result['peak_kib']):.1f} MB ({result['peak_how']}); "
        f"1 archive, {result['size'] / 2**20:,.1f} MB, {result['files']:,} files "
        f"({result['bytes']:,} bytes); unzip -tqq: {'OK' if result['unzip'] == 0 else 'FAILED'}",
    ]


def check_line(label, result, n):
    packages = result["packages"]
    ok = (
        result["status"] == "published" and result["entries"] == n and result["members"] == n
        and result["manifest_urls"] == n and result["manifest_entries"] == n and result["unzip_ok"]
        and result["testzip_bad_member"] is None and result["dump_urls"] == len(packages)
        and all(p["size"] == p["on_disk"] and p["manifest_same"] and p["members"] == p["entries"] for p in packages)
    )
    line = (
        f"  check {label}: build #{result['build']} {result['status']}, {result['entries']:,} entries; "
        f"unzip -tqq on {len(packages)} packages: {'all OK' if result['unzip_ok'] else 'FAILED'}; "
        f"zipfile.testzip({result['testzip_package'].rsplit('/', 1)[-1]}): "
        f"{'OK' if result['testzip_bad_member'] is None else 'bad member ' + result['testzip_bad_member']}; "
        f"members {result['members']:,}, manifest <url> {result['manifest_urls']:,} (N = {n:,}); "
        f"published manifests byte-identical to the packed ones: "
        f"{sum(p['manifest_same'] for p in packages)} of {len(packages)}; "
        f"resourcedump.xml lists {result['dump_urls']} packages; report {result['report']} "
        f"({result['check_seconds']:.1f} s) -> {'OK' if ok else 'MISMATCH'}"
    )
    failures = [f"    {p['name']}: {p['unzip_output']}" for p in packages if p["unzip"] != 0]
    return [line, *failures]


def spread(values):
    """``min / median / max`` of values, as text."""
    return f"min {min(values):.2f}x, median {statistics.median(values):.2f}x, max {max(values):.2f}x"


def run(n, total_gib, keep, profile, top, cache, repeat):
    total = int(total_gib * 2**30)
    var_dir = tempfile.mkdtemp(prefix="dumps-bench-")
    results = Path(var_dir) / "results"
    results.mkdir()
    print(f"Resource Dump build benchmark: {OURS} vs Info-ZIP zip -0  (Python {sys.version.split()[0]})")
    print(f"{n:,} files, {total / 2**30:.2f} GiB ({total:,} bytes); each step in its own child process; "
          f"MB = 2**20 bytes; data in {var_dir}")
    try:
        seed = run_child("seed", results, var_dir, n, total)
        media_root = seed["media_root"]
        print(f"seeded {seed['files']:,} files in {seed['items']:,} items, {seed['bytes']:,} bytes "
              f"(sizes {seed['min'] / 1024:,.1f} KB .. median {seed['median'] / 1024:,.1f} KB .. "
              f"max {seed['max'] / 2**20:,.2f} MB) in {seed['seconds']:.1f} s (not timed)")
        reconciled = run_child("reconcile", results, var_dir)
        print(f"reconcile: {reconciled['resources']:,} Resource rows, {reconciled['hashed']:,} with md5 and sha-256, "
              f"{reconciled['bytes']:,} bytes, in {reconciled['seconds']:.1f} s (not timed)")
        hashing = run_child("hashing", results, 512)
        both = 2 / hashing["sha256"] + 1 / hashing["crc32"]
        print(f"hashing on this CPU, one thread, 1 MB buffers, per CPU second: md5 {hashing['md5']:,.0f} MB/s, "
              f"sha-256 {hashing['sha256']:,.0f} MB/s, crc32 {hashing['crc32']:,.0f} MB/s; "
              f"our build digests every byte with sha-256 twice (member, on its own thread, and package) and crc32 once "
              f"(md5 only for bytes that changed since they were recorded): ~{1 / both:,.0f} MB/s for that alone on one core")
        if cache == "warm":
            print("page cache before timed steps: warmed by reading every file once [--cache warm]")
        else:
            worked, note = drop_caches()
            print(f"page cache before timed steps: "
                  f"{'dropped (sync; echo 3 > /proc/sys/vm/drop_caches) before each' if worked else note}"
                  f" [--cache cold]")
            read = run_child("read", results, media_root, tag="-cold")
            print(f"read only (cold cache, 1 MB chunks, no hashing): {mb_per_s(read['bytes'], read['seconds']):,.1f} MB/s "
                  f"({read['seconds']:.2f} s for {read['bytes'] / 2**30:.2f} GiB)")
        print("retired dump builds are deleted (untimed) before each timed step, so no timed build prunes an older one")

        contenders = {"default": ("build", DEFAULT_PACKAGE), "256m": ("build", SMALL_PACKAGE), "zip": ("zip", None)}
        runs = {tag: [] for tag in contenders}
        labels = {}
        checks = []
        for number in range(repeat):
            # zip -0 runs in the middle of every round, and each of our builds runs just before it
            # in one round and just after it in the next: each ratio is taken within a round.
            order = ["default", "zip", "256m"] if number % 2 == 0 else ["256m", "zip", "default"]
            print()
            print(f"round {number + 1}/{repeat}: " + ", ".join(order))
            for tag in order:
                role, package_bytes = contenders[tag]
                note = prepare(cache, var_dir, media_root, results, f"-{tag}-{number}")
                if role == "build":
                    result = run_child("build", results, var_dir, package_bytes, tag=f"-{tag}-{number}")
                    label = labels[tag] = f"{OURS} ({result['package_bytes'] / 2**20:,.0f} MB packages)"
                    lines = build_lines(label, result, result["bitstream_bytes"])
                    checks.append((label, result))
                else:
                    result = run_child("zip", results, var_dir, media_root, tag=f"-{tag}-{number}")
                    version = " ".join(result["version"].replace("This is ", "").split()[:2])
                    label = labels[tag] = f"{ZIP} -r -q (Info-ZIP {version})"
                    lines = zip_lines(label, result)
                runs[tag].append(result)
                for line in lines:
                    print(line)
                print(f"  {'':<38} [{note}]")

        print()
        for label, result in checks:
            for line in check_line(label, result, n):
                print(line)

        def speed(result):
            return mb_per_s(result.get("bitstream_bytes", result.get("bytes")), result["seconds"])

        def cpu(result):
            return result["cpu"]["user"] + result["cpu"]["sys"]

        default_size = labels["default"].split("(")[1][:-1]
        paired = {tag: list(zip(runs[tag], runs["zip"])) for tag in ("default", "256m")}
        ratios = {tag: [speed(ours) / speed(theirs) for ours, theirs in pairs] for tag, pairs in paired.items()}
        cpu_ratios = {tag: [cpu(ours) / cpu(theirs) for ours, theirs in pairs] for tag, pairs in paired.items()}
        print()
        print(f"paired rounds: in each round, our throughput / that of the zip -0 run beside it "
              f"(and our CPU seconds / zip's), {repeat} pair{'s' if repeat > 1 else ''} each")
        for number in range(repeat):
            print(f"  round {number + 1}: {default_size} {ratios['default'][number]:.2f}x "
                  f"(CPU {cpu_ratios['default'][number]:.2f}x), "
                  f"256 MB packages {ratios['256m'][number]:.2f}x (CPU {cpu_ratios['256m'][number]:.2f}x)")
        print(f"  throughput ratio, {default_size}: {spread(ratios['default'])}")
        print(f"  throughput ratio, 256 MB packages: {spread(ratios['256m'])}")
        print(f"  CPU seconds ratio, {default_size}: {spread(cpu_ratios['default'])}")
        print(f"  CPU seconds ratio, 256 MB packages: {spread(cpu_ratios['256m'])}")
        print(f"median of {repeat} run{'s' if repeat > 1 else ''} (wall s, CPU s = user + sys of the step, MB/s on wall):")
        for tag, tag_runs in runs.items():
            walls = [result["seconds"] for result in tag_runs]
            cpus = [cpu(result) for result in tag_runs]
            print(f"  {labels[tag]:<38} {statistics.median(speed(result) for result in tag_runs):>8,.1f} MB/s  "
                  f"{statistics.median(walls):>7.2f} s wall  {statistics.median(cpus):>7.2f} s CPU  "
                  f"(all wall: {', '.join(f'{wall:.2f}' for wall in walls)}; "
                  f"all CPU: {', '.join(f'{seconds:.2f}' for seconds in cpus)})")
        ratio = statistics.median(ratios["default"])
        print("  (zip computes one CRC-32 per file; we also compute md5 and sha-256 of every bitstream and of every package)")
        peaks = {tag: max(mib(result["peak_kib"]) for result in runs[tag]) for tag in runs}
        print(f"peak RSS (highest of {'all runs' if repeat > 1 else 'the run'}): "
              f"{default_size} -> {peaks['default']:.1f} MB, 256 MB packages -> {peaks['256m']:.1f} MB "
              f"(difference {abs(peaks['default'] - peaks['256m']):.1f} MB); zip -0: {peaks['zip']:.1f} MB")
        print()
        print(f"Targets for {OURS} (printed, not asserted): throughput >= {TARGET_RATIO:.1f}x zip -0, "
              f"peak RSS < {TARGET_PEAK_MB:.0f} MB whatever the package size")
        print(f"  throughput: {ratio:.2f}x, the median of the paired ratios  ({'met' if ratio >= TARGET_RATIO else 'NOT met'})")
        worst = max(peaks["default"], peaks["256m"])
        print(f"  peak RSS: {worst:.1f} MB at most  ({'met' if worst < TARGET_PEAK_MB else 'NOT met'})")

        if profile == "always" or (profile == "auto" and ratio < TARGET_RATIO):
            note = prepare(cache, var_dir, media_root, results, "-profile")
            report = run_child("profile", results, var_dir, top)
            print()
            print(f"cProfile of one more build (default packages; {report['seconds']:.2f} s under the profiler) [{note}]")
            print(f"--- top {top} by internal time (tottime) ---")
            print(report["tottime"])
            print(f"--- top {top} by cumulative time ---")
            print(report["cumulative"])
    finally:
        if keep:
            print(f"kept {var_dir}")
        else:
            shutil.rmtree(var_dir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=3000, help="number of files (default 3000)")
    parser.add_argument("--total-gb", type=float, default=2.2, help="their total size in GiB (default 2.2)")
    parser.add_argument("--cache", choices=["cold", "warm"], default="cold",
                        help="drop the page cache before each timed step (cold, default) or read every file first (warm)")
    parser.add_argument("--profile", choices=["auto", "always", "never"], default="auto",
                        help="cProfile one more build: when the throughput target is missed (auto), always or never")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds of the three timed steps, zip -0 between our two builds; ratios are taken "
                             "within each round (default 3)")
    parser.add_argument("--top", type=int, default=15, help="functions shown by the profile (default 15)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    add_child_arguments(parser, CHILDREN)
    options = parser.parse_args()
    if run_as_child(options, CHILDREN):
        return
    if options.files < 1 or options.total_gb <= 0 or options.repeat < 1:
        parser.error("--files and --repeat must be positive and --total-gb above 0")
    run(options.files, options.total_gb, options.keep, options.profile, options.top, options.cache, options.repeat)


if __name__ == "__main__":
    main()
