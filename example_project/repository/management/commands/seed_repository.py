"""Add public items with files, deterministically: item number n always gets the same content."""

import os
import time
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.management.base import BaseCommand, CommandError
from django.db import router, transaction
from django.utils import timezone

from django_resourcesync import bulk, tracking

from ...models import Collection, Item, ItemFile, item_file_path

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
    """Add ``count`` public items with their files; returns the keys of the items and files added.

    Item numbers continue from the number of items there are, whatever their keys, so item n
    always gets the same title and bytes. Items and files are inserted in bulk, a batch a
    transaction, as rows of values (no model instances: ``bulk.insert``, ``COPY`` on
    PostgreSQL); the files' bytes are written by :func:`write_files`, and their sizes recorded
    on the rows (as ``ItemFile.save()`` would). ``track`` tells change tracking what was added,
    once, at the end, through the bulk API (rows inserted so send no signal); ``progress(done)``
    is called after each batch.
    """
    collections = [Collection.objects.get_or_create(slug=slug, defaults={"name": name})[0] for slug, name in COLLECTIONS]
    using = router.db_for_write(Item)
    first = Item.objects.count() + 1
    storage = ItemFile._meta.get_field("file").storage
    item_pks, file_pks = [], []
    for start in range(first, first + count, batch_size):
        numbers = range(start, min(start + batch_size, first + count))
        now = timezone.now()
        titles = [title_for(n) for n in numbers]
        with transaction.atomic(using=using):
            before = _last_key(Item.objects.using(using))
            bulk.insert(Item, ITEM_FIELDS, [
                (collections[n % len(collections)].pk, title, f"Author {n % 97}", f"Abstract of item {n}.", True, now, now)
                for n, title in zip(numbers, titles)
            ], using)
            created = _added_since(Item.objects.using(using), before, "title", titles)
            described, files = [], []
            for n, pk in zip(numbers, created):
                folder = item_file_path(_ItemStub(pk), "")
                for name, media_type, data in files_for(n, file_size):
                    described.append((pk, name, media_type, len(data)))
                    files.append((folder + storage.get_valid_name(name), data))
            rows = [(pk, name, stored, media_type, size, now, now)
                    for (pk, name, media_type, size), stored in zip(described, write_files(storage, files))]
            before = _last_key(ItemFile.objects.using(using))
            bulk.insert(ItemFile, FILE_FIELDS, rows, using)
            added = _added_since(ItemFile.objects.using(using), before, "file", [row[2] for row in rows])
        item_pks += created
        file_pks += added
        if progress:
            progress(numbers[-1] - first + 1)
    if track:
        record_changes(item_pks, file_pks)
    return item_pks, file_pks


ITEM_FIELDS = ("collection_id", "title", "creator", "abstract", "is_public", "created", "modified")
FILE_FIELDS = ("item_id", "name", "file", "media_type", "size", "created", "modified")


def _last_key(queryset):
    return queryset.order_by("-pk").values_list("pk", flat=True).first() or 0


def _added_since(queryset, before, field, values):
    """The keys of the rows just inserted whose ``field`` is each of ``values``, in that order:
    the rows after the key ``before`` (another writer's rows among them are not ours)."""
    keys = {}
    for pk, value in queryset.filter(pk__gt=before).order_by("pk").values_list("pk", field):
        keys.setdefault(value, pk)
    return [keys[value] for value in values]


def record_changes(item_pks, file_pks):
    """Tell change tracking of the items and files added, in one transaction: their processing
    (each set brought up to date) follows its commit, as that of any save."""
    with transaction.atomic():
        tracking.changed(model=Item, pks=item_pks)
        tracking.changed(model=ItemFile, pks=file_pks)


class _ItemStub:
    """What ``upload_to`` reads of a file: its item's key (the folder of an item's files)."""

    def __init__(self, item_id):
        self.item_id = item_id


FILE_WRITERS = min(8, max(2, os.cpu_count() or 1))


def write_files(storage, files):
    """Write each ``(name, bytes)`` of ``files`` with :func:`write_file`, on a few threads;
    returns the names they have, in order. Creating a file is the kernel's work (or a remote
    storage's round trip), done outside the interpreter's lock: the threads overlap it."""
    with ThreadPoolExecutor(max_workers=FILE_WRITERS) as writers:
        return list(writers.map(lambda file: write_file(storage, *file), files))


def write_file(storage, name, data):
    """Write ``data`` under ``name``; returns the name it has. In a local folder, one exclusive
    ``open``: a name already taken (left by an earlier item with the same key) goes through the
    storage, which picks a free one."""
    try:
        path = storage.path(name)
    except NotImplementedError:  # a remote storage (S3): its own save
        return storage.save(name, ContentFile(data))
    folder = os.path.dirname(path)
    try:
        os.mkdir(folder)  # an item's folder, in a folder that is there after the first
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(folder, exist_ok=True)
    try:
        with open(path, "xb") as stream:
            stream.write(data)
    except FileExistsError:
        return storage.save(name, ContentFile(data))
    return name


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

        item_pks, file_pks = add_items(items, file_size=file_size, batch_size=batch_size, track=False, progress=progress)
        seeded = time.monotonic() - started
        if verbosity >= 1 and items:
            self.stderr.write("")
        record_changes(item_pks, file_pks)
        if verbosity >= 1:
            rate = f" ({items / seeded:.0f} items a second)" if items and seeded else ""
            self.stdout.write(
                f"Added {items} items and {len(file_pks)} files in {seeded:.1f}s{rate}; "
                f"change tracking told in {time.monotonic() - started - seeded:.1f}s "
                f"(its processing {'included' if getattr(settings, 'CELERY_TASK_ALWAYS_EAGER', False) else 'queued'})"
            )
