"""Add public items with files, deterministically: item number n always gets the same content."""

import time

from django.core.files.base import ContentFile
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from django_resourcesync import tracking

from ...models import Collection, Item, ItemFile

COLLECTIONS = [("theses", "Theses"), ("articles", "Articles"), ("datasets", "Research data")]
WORDS = "river archive signal lattice harvest orbit ledger meadow quantum basalt fable cipher delta prism tundra".split()


def title_for(n):
    return f"Item {n}: {WORDS[n % len(WORDS)].capitalize()} {WORDS[(n * 7) % len(WORDS)]} and the {WORDS[(n * 11) % len(WORDS)]}"


def files_for(n, size):
    """``[(name, media_type, bytes)]`` for item number ``n``."""
    def body(label):
        line = f"{label} of item {n}.\n".encode()
        return (line * (size // len(line) + 1))[:size]

    files = [(f"item-{n}.txt", "text/plain", body("Full text"))]
    if n % 3 == 0:
        # Every third item has a file whose name needs percent-encoding in a URI.
        files.append((f"données brutes {n}.csv", "text/csv", body("Data,values")))
    return files


def add_items(count, *, file_size, batch_size=2000, track=True, progress=None):
    """Add ``count`` public items with their files; returns the number of files added.

    Item numbers continue from the number of items there are, whatever their keys, so item n
    always gets the same title and bytes. ``track`` tells change tracking what was added
    (bulk_create sends no signal); ``progress(done)`` is called after each batch.
    """
    collections = [Collection.objects.get_or_create(slug=slug, defaults={"name": name})[0] for slug, name in COLLECTIONS]
    first = Item.objects.count() + 1
    added_files = 0
    for start in range(first, first + count, batch_size):
        numbers = range(start, min(start + batch_size, first + count))
        with transaction.atomic():
            created = Item.objects.bulk_create(
                Item(
                    collection=collections[n % len(collections)],
                    title=title_for(n),
                    creator=f"Author {n % 97}",
                    abstract=f"Abstract of item {n}.",
                    is_public=True,
                )
                for n in numbers
            )
            rows = []
            for n, item in zip(numbers, created):
                for name, media_type, data in files_for(n, file_size):
                    row = ItemFile(item=item, name=name, media_type=media_type)
                    row.file.save(name, ContentFile(data), save=False)
                    rows.append(row)
            ItemFile.objects.bulk_create(rows)
            added_files += len(rows)
            if track:
                tracking.changed(created)
                tracking.changed(rows)
        if progress:
            progress(numbers[-1] - first + 1)
    return added_files


class Command(BaseCommand):
    help = "Add N public items with their files to the demo repository."

    def add_arguments(self, parser):
        parser.add_argument("--items", type=int, required=True, help="How many items to add.")
        parser.add_argument("--file-size", type=int, default=2048, help="Size of each file in bytes (default 2048).")
        parser.add_argument("--batch-size", type=int, default=2000)

    def handle(self, *args, items, file_size, batch_size, verbosity=1, **options):
        if items < 0 or file_size < 0 or batch_size < 1:
            raise CommandError("--items and --file-size must be 0 or more, --batch-size positive.")
        started = time.monotonic()

        def progress(done):
            if verbosity >= 1:
                self.stderr.write(f"\r{done}/{items} items", ending="")

        added_files = add_items(items, file_size=file_size, batch_size=batch_size, progress=progress)
        if verbosity >= 1 and items:
            self.stderr.write("")
        if verbosity >= 1:
            self.stdout.write(f"Added {items} items and {added_files} files in {time.monotonic() - started:.1f}s")
