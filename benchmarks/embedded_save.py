"""Benchmark: what a save costs the saving request in the embedded default.

Run from the repository root::

    .venv/bin/python benchmarks/embedded_save.py                 # 200 items, 8 rounds of 50 saves
    .venv/bin/python benchmarks/embedded_save.py --rounds 16 --saves 100

A fresh SQLite database in a temporary folder, with the example project's settings but for its
database options, which are dropped (a site made by ``startproject`` has none: the app's own
SQLite settings apply, see ``django_resourcesync.sqlite``). The demo repository is seeded and its
sets built. Then, in paired rounds (the order of the three configurations turns each round, so
that drift falls on each alike), blocks of ``Item.save()`` calls in autocommit, each save timed
alone, in:

- **embedded**: no broker and tasks not eager, the app's default without Celery: the save hands
  its changes to a thread, which processes them after the commit;
- **eager**: Celery's eager mode, what the demo did before the embedded mode: each commit
  processes its changes in the saving thread;
- **untracked**: the same model with change tracking's receivers disconnected.

After each block the script waits for the thread to be done (not counted in the saves) and checks
that every change was processed. It prints the median and 90th percentile of a save in each, and
the ratios of embedded to untracked and eager to embedded; and the ratio of embedded to untracked
in each round (the medians of its two blocks), their median, least and greatest.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--saves", type=int, default=50, help="saves a block")
    args = parser.parse_args()

    folder = tempfile.mkdtemp(prefix="resourcesync-embedded-save-")
    os.environ.update(EXAMPLE_VAR_DIR=folder, DJANGO_SETTINGS_MODULE="example_project.settings")
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "AWS_STORAGE_BUCKET_NAME"):
        os.environ.pop(name, None)
    sys.path.insert(0, str(ROOT))
    import django
    from django.conf import settings

    django.setup()
    settings.DATABASES["default"]["OPTIONS"] = {}

    from celery import current_app
    from django.core.management import call_command
    from django.db.models.signals import post_delete, post_save

    from django_resourcesync import running
    from django_resourcesync.models import ChangeEvent, PendingChange
    from django_resourcesync.tracking import outbox, receivers
    from example_project.repository.models import Item

    call_command("migrate", verbosity=0)
    call_command("seed_repository", items=args.items, verbosity=0)
    call_command("resourcesync_rebuild", verbosity=0)
    conf = current_app._get_current_object().conf
    items = list(Item.objects.filter(is_public=True).order_by("pk")[: args.saves])
    uid = f"resourcesync_track_{Item._meta.label_lower}"

    def configure(name):
        conf.task_always_eager, conf.broker_url = name == "eager", ""
        running.forget()
        tracked = name != "untracked"
        for signal, suffix in ((post_save, "_save"), (post_delete, "_delete")):
            if tracked:
                signal.connect(receivers.object_changed, sender=Item, dispatch_uid=uid + suffix)
            else:
                signal.disconnect(sender=Item, dispatch_uid=uid + suffix)
        if tracked:
            expected = running.EAGER if name == "eager" else running.EMBEDDED
            assert running.mode().name == expected, running.mode()

    timings = {"embedded": [], "eager": [], "untracked": []}
    rounds = []  # {configuration: median save of its block}, round by round
    names = list(timings)
    counter = 0
    for number in range(args.rounds):
        order = names[number % 3:] + names[: number % 3]
        rounds.append({})
        for name in order:
            configure(name)
            before = ChangeEvent.objects.count()
            for item in items:
                counter += 1
                item.title = f"{name} save {counter}"
                started = time.perf_counter()
                item.save()
                timings[name].append(time.perf_counter() - started)
            rounds[-1][name] = statistics.median(timings[name][-len(items):])
            assert outbox.dispatcher.flush(timeout=120)
            if name != "untracked":
                assert not PendingChange.objects.exists(), "every change processed"
                assert ChangeEvent.objects.count() > before
            else:
                call_command("resourcesync_reconcile", verbosity=0)  # what the untracked saves changed
    configure("embedded")

    def ms(values, q):
        return statistics.quantiles(values, n=10)[8] * 1000 if q == 90 else statistics.median(values) * 1000

    print(f"SQLite, {args.items} items, {args.rounds} rounds x {args.saves} saves per configuration")
    for name in names:
        print(f"  {name:<10} save: median {ms(timings[name], 50):7.2f} ms   p90 {ms(timings[name], 90):7.2f} ms")
    embedded, eager, untracked = (statistics.median(timings[name]) for name in names)
    print(f"  embedded / untracked: {embedded / untracked:.2f}x   eager / embedded: {eager / embedded:.2f}x")
    pairs = sorted(one["embedded"] / one["untracked"] for one in rounds)
    print(f"  embedded / untracked, round by round (the medians of its two blocks): median {statistics.median(pairs):.2f}x, "
          f"min {pairs[0]:.2f}x, max {pairs[-1]:.2f}x ({len(pairs)} rounds)")


if __name__ == "__main__":
    main()
