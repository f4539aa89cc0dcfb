"""Benchmark: seeding the example repository, against the ORM's ``bulk_create()`` of the same rows.

Run from the repository root::

    .venv/bin/python benchmarks/seed.py                         # SQLite, 20,000 items, 2 rounds
    .venv/bin/python benchmarks/seed.py --items 100000 --rounds 1
    .venv/bin/python benchmarks/seed.py --database-url postgres://postgres:postgres@127.0.0.1:5432/bench_seed

Each step runs in a fresh interpreter on a freshly migrated database (a temporary
``EXAMPLE_VAR_DIR``; with ``--database-url`` that PostgreSQL database, dropped and created again
for each step: give a throwaway name):

- **add_items**: ``seed_repository``'s ``add_items(N, file_size=..., track=False)``, what the
  command does before it tells change tracking: items and files inserted as rows of values
  (``bulk.insert``), each file's bytes written into the media folder (``write_files``: a batch's
  files on a few threads);
- **bulk_create**: the same items and files, with the same bytes written the same way, inserted
  through the ORM's ``bulk_create()`` (model instances, the keys returned), the way the command
  inserted them before;
- **files alone**: the same folders and files written the same way, and no database: the floor
  that the disk sets (on a virtual disk whose speed varies from minute to minute, it is what the
  other two are read against).

Before each step the disk's pending writes are flushed (``sync``: the files of the step before
are written out and deleted first). Ten items are added first, not timed (the collections
created, the connection opened). Printed: items a second of each, per round and as the median,
the ratio of the first two and how close the first comes to the floor; the target beside it (at
least 2,000 items a second, the files included). Nothing is asserted.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

from _steps import add_child_arguments, recreate_database, run_as_child, run_child, setup_django_example

TARGET = 2000


def child_seed(var_dir, database_url, way, items, file_size):
    setup_django_example(var_dir, database_url)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from example_project.repository.management.commands import seed_repository

    seed_repository.add_items(10, file_size=file_size, track=False)
    add = {"add_items": seed_repository.add_items, "bulk_create": orm_add_items, "files alone": files_alone}[way]
    started = time.perf_counter()
    item_pks, file_pks = add(items, file_size=file_size, track=False)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "items": len(item_pks), "files": len(file_pks)}


def orm_add_items(count, *, file_size, batch_size=2000, track=False):
    """The comparison: the same rows through ``bulk_create()`` (``track`` as ``add_items`` takes it; never
    used here)."""
    from django.db import transaction

    from example_project.repository.management.commands.seed_repository import (
        COLLECTIONS,
        files_for,
        title_for,
        write_files,
    )
    from example_project.repository.models import Collection, Item, ItemFile, item_file_path

    collections = [Collection.objects.get_or_create(slug=slug, defaults={"name": name})[0] for slug, name in COLLECTIONS]
    first = Item.objects.count() + 1
    field = ItemFile._meta.get_field("file")
    item_pks, file_pks = [], []
    for start in range(first, first + count, batch_size):
        numbers = range(start, min(start + batch_size, first + count))
        with transaction.atomic():
            created = Item.objects.bulk_create(
                Item(collection=collections[n % len(collections)], title=title_for(n), creator=f"Author {n % 97}",
                     abstract=f"Abstract of item {n}.", is_public=True)
                for n in numbers
            )
            rows, files = [], []
            for n, item in zip(numbers, created):
                folder = item_file_path(ItemFile(item_id=item.pk), "")
                for name, media_type, data in files_for(n, file_size):
                    rows.append(ItemFile(item=item, name=name, media_type=media_type, size=len(data)))
                    files.append((folder + field.storage.get_valid_name(name), data))
            for row, stored in zip(rows, write_files(field.storage, files)):
                row.file.name = stored
            ItemFile.objects.bulk_create(rows)
        item_pks += [item.pk for item in created]
        file_pks += [row.pk for row in rows]
    return item_pks, file_pks


def files_alone(count, *, file_size, track=False):
    """The floor the disk sets: the same folders and files written the same way, no database."""
    from example_project.repository.management.commands.seed_repository import files_for, write_files
    from example_project.repository.models import ItemFile

    storage = ItemFile._meta.get_field("file").storage
    written, batch, end = 0, 2000, 11 + count  # add_items' batches
    for start in range(11, end, batch):
        files = [(f"items/{n}/" + storage.get_valid_name(name), data)
                 for n in range(start, min(start + batch, end)) for name, _media_type, data in files_for(n, file_size)]
        written += len(write_files(storage, files))
    return range(count), range(written)


CHILDREN = {"seed": child_seed}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=20_000, help="items to add (default 20,000)")
    parser.add_argument("--file-size", type=int, default=2048, help="bytes of each file (default 2048, the command's)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, rotating which way goes first (default 2)")
    parser.add_argument("--database-url", help="a PostgreSQL database to drop and create for each step")
    add_child_arguments(parser, CHILDREN)
    options = parser.parse_args()
    if run_as_child(options, CHILDREN):
        return
    where = "PostgreSQL" if options.database_url else "SQLite"
    print(f"Seeding benchmark: {options.items:,} items, files of {options.file_size} bytes, {where}")
    rates = {"add_items": [], "bulk_create": [], "files alone": []}
    with tempfile.TemporaryDirectory(prefix="seed-bench-") as work:
        for round_number in range(options.rounds):
            ways = ["add_items", "bulk_create", "files alone"]
            ways = ways[round_number % 3:] + ways[:round_number % 3]  # none always first
            for way in ways:
                with tempfile.TemporaryDirectory(dir=work) as var_dir:
                    if options.database_url:
                        recreate_database(options.database_url)
                    # The files of the step before written out and gone, so that no step pays
                    # for another's writeback.
                    os.sync()
                    result = run_child(__file__, "seed", var_dir, var_dir, options.database_url, way, options.items,
                                       options.file_size)
                rate = result["items"] / result["seconds"]
                rates[way].append(rate)
                print(f"  round {round_number + 1}, {way:<11} {result['seconds']:7.2f} s  {rate:8,.0f} items/s  "
                      f"({result['items']:,} items, {result['files']:,} files)")
    if options.database_url:
        recreate_database(options.database_url, create=False)
    ours, theirs = statistics.median(rates["add_items"]), statistics.median(rates["bulk_create"])
    floor = statistics.median(rates["files alone"])
    print(f"medians: add_items {ours:,.0f} items/s, bulk_create {theirs:,.0f} items/s, ratio {ours / theirs:.2f}x; "
          f"the files alone {floor:,.0f} items/s (add_items at {ours / floor:.2f}x of that floor)")
    print(f"target: at least {TARGET:,} items a second -> {'met' if ours >= TARGET else 'NOT met'}")


if __name__ == "__main__":
    sys.exit(main())
