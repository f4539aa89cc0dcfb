"""Benchmark: prior versions. The storage the version store uses for many changes of large files,
some of them going back to bytes seen before, and the time to serve the TimeMap of a resource
with many versions.

Run from the repository root::

    .venv/bin/python benchmarks/mementos.py                                   # 10,000 changes of 1 MB
    .venv/bin/python benchmarks/mementos.py --changes 2000 --files 50 --timemap-versions 1000

Setup (not timed): a fresh temporary ``EXAMPLE_VAR_DIR`` (SQLite database, files, documents),
``migrate``, the ``bitstreams`` set publishing prior versions (the other demo sets disabled),
``--files`` items with a file each (``seed_repository``), and the set published once.

**Storage.** ``--changes`` changes, in rounds: each round writes every one of the ``--files``
files again (``--megabytes`` each), then processes the round's changes as a worker does
(``tracking.changed`` and ``process_pending``: each change is hashed and its bytes kept by the
store). A rewrite gives new random bytes, or, for ``--reverts`` of them (30 %), the bytes of an
earlier version of another file chosen at random (never the file's current bytes: each rewrite
is a change). The previous file is deleted after each round (the site keeps its current files
only). Reported: the bytes of all the changes, the bytes the store holds (each distinct sha-256
once), their ratio, and the ratio to the distinct bytes expected.

**TimeMap.** One small file changed ``--timemap-versions`` times (each change processed), then
its TimeMap served ``--requests`` times through Django's test client (in process, no network):
median and p95 against the target (50 ms), and against the Capability List of the same set
served the same way (a small document rendered from the database).

Nothing is asserted: the script prints figures and ratios. MB = 2**20 bytes.
"""

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MB = 2**20
TARGET_TIMEMAP = 0.050


def progress(message):
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def setup(var_dir, files):
    os.environ["EXAMPLE_VAR_DIR"] = var_dir
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    os.environ.pop("DATABASE_URL", None)
    os.environ.pop("CELERY_BROKER_URL", None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    from django_resourcesync.models import ResourceSet
    from django_resourcesync.rebuild import rebuild_set
    from django_resourcesync.tracking import outbox

    outbox.send = lambda task, source_names: None  # processed below, as a worker would
    call_command("migrate", verbosity=0)
    ResourceSet.objects.exclude(slug="bitstreams").update(enabled=False)
    ResourceSet.objects.filter(slug="bitstreams").update(prior_versions=True)
    call_command("seed_repository", items=files, verbosity=0)
    resource_set = ResourceSet.objects.get(slug="bitstreams")
    rebuild_set(resource_set)
    return resource_set


def rewrite(upload, data, name):
    from django.core.files.base import ContentFile

    from django_resourcesync import tracking

    old = upload.file.name
    with tracking.paused():
        upload.file.save(name, ContentFile(data))
    return old


def storage(resource_set, changes, files, megabytes, reverts, seed):
    from django.db.models import Sum

    from django_resourcesync import tracking
    from django_resourcesync.models import ChangeEvent, Version
    from example_project.repository.models import ItemFile

    rng = random.Random(seed)
    uploads = list(ItemFile.objects.filter(item__is_public=True).order_by("pk")[:files])
    size = int(megabytes * MB)
    seen = []  # bytes written before (the versions a revert goes back to)
    current = {}
    written = distinct = 0
    rounds = -(-changes // len(uploads))
    started = time.monotonic()
    for number in range(rounds):
        old_names = []
        for upload in uploads[: changes - number * len(uploads)]:
            candidates = [data for data in seen if data is not current.get(upload.pk)]
            if candidates and rng.random() < reverts:
                data = rng.choice(candidates)
            else:
                data = os.urandom(size)
                seen.append(data)
                distinct += size
                if len(seen) > 200:  # memory: revert among the 200 newest versions
                    seen.pop(0)
            current[upload.pk] = data
            written += size
            old_names.append((upload, rewrite(upload, data, f"r{number}.bin")))
        tracking.changed(model=ItemFile, pks=[upload.pk for upload, _old in old_names])
        tracking.process_pending()
        for upload, old in old_names:
            upload.file.storage.delete(old)
        if number % 10 == 0:
            progress(f"round {number + 1} of {rounds}: {written / MB:,.0f} MB written")
    seconds = time.monotonic() - started
    events = ChangeEvent.objects.filter(resource_set=resource_set, change="updated").count()
    held = Version.objects.aggregate(total=Sum("length"))["total"] or 0
    return {"changes": events, "written": written, "held": held, "distinct": distinct, "seconds": seconds}


def timemap(resource_set, versions, requests):
    from django.test import Client

    from django_resourcesync import tracking
    from django_resourcesync.mementos import timemap_uri
    from example_project.repository.models import ItemFile

    upload = ItemFile.objects.filter(item__is_public=True).order_by("-pk").first()
    for number in range(versions):
        old = rewrite(upload, f"version {number}\n".encode() * 20, f"t{number}.txt")
        tracking.changed(model=ItemFile, pks=[upload.pk])
        tracking.process_pending()
        upload.file.storage.delete(old)
    client = Client()
    path = timemap_uri(resource_set, upload.pk).split("://", 1)[1].split("/", 1)[1]
    path = "/" + path
    body = client.get(path).content
    listed = body.count(b'rel="memento"') + body.count(b"first memento") + body.count(b"last memento")

    def timed(url):
        found = []
        for _ in range(requests):
            started = time.perf_counter()
            response = client.get(url)
            found.append(time.perf_counter() - started)
            assert response.status_code == 200
        return found

    return listed, timed(path), timed(f"/resourcesync/{resource_set.slug}/capabilitylist.xml")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--megabytes", type=float, default=1.0)
    parser.add_argument("--reverts", type=float, default=0.30)
    parser.add_argument("--timemap-versions", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    options = parser.parse_args()
    var_dir = tempfile.mkdtemp(prefix="mementos-bench-")
    try:
        progress(f"setting up: {options.files} files")
        resource_set = setup(var_dir, options.files)
        progress(f"storage: {options.changes} changes of {options.megabytes} MB, {options.reverts:.0%} back to earlier bytes")
        found = storage(resource_set, options.changes, options.files, options.megabytes, options.reverts, options.seed)
        print(
            f"storage: {found['changes']:,} changes, {found['written'] / MB:,.0f} MB written in {found['seconds']:.0f} s; "
            f"the store holds {found['held'] / MB:,.0f} MB = {found['held'] / found['written']:.2f} of the bytes changed "
            f"({found['held'] / found['distinct']:.2f} of the distinct bytes written; 1.00 = each distinct version once)"
        )
        progress(f"TimeMap: {options.timemap_versions} versions of one file")
        listed, served, baseline = timemap(resource_set, options.timemap_versions, options.requests)
        median, p95 = statistics.median(served), sorted(served)[int(0.95 * (len(served) - 1))]
        print(
            f"timemap: {listed} mementos listed; served in {median * 1000:.1f} ms median, {p95 * 1000:.1f} ms p95 "
            f"over {len(served)} requests; target {TARGET_TIMEMAP * 1000:.0f} ms: "
            f"{'met' if p95 <= TARGET_TIMEMAP else 'NOT met'} (p95 / target {p95 / TARGET_TIMEMAP:.2f}); "
            f"the Capability List: {statistics.median(baseline) * 1000:.1f} ms median "
            f"(ratio {median / statistics.median(baseline):.1f})"
        )
    finally:
        shutil.rmtree(var_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
