"""Reconciliation: compare a whole set with the site's data, the safety net every path converges on."""

import json
import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict
from operator import itemgetter

from django.db import DataError, connections, models, transaction
from django.db.models import Case, Exists, OuterRef, Q, Subquery, When
from django.db.models.functions import Cast

from .. import bulk, fingerprints, sharing, threads
from ..conf import app_settings
from ..models import LeftOut, Resource, ResourceSet
from .changelog import start_log
from .locks import is_tracked, locked
from .writer import ChangeCounts, SetWriter, _stored, described_ahead, fingerprints_of_rows, matching_fingerprints

logger = logging.getLogger(__name__)


def _batches(queryset, batch_size, fetch=list):
    """Yield lists of objects (or of ``values_list`` rows starting with the key) in primary-key
    order, by keyset pagination; ``fetch`` reads a page (see :func:`_fetched_at_once`)."""
    last = None
    while True:
        page = queryset.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        batch = fetch(page[:batch_size])
        if not batch:
            return
        yield batch
        last = batch[-1][0] if isinstance(batch[-1], tuple) else batch[-1].pk


def reconcile(resource_set, *, batch_size=None, progress=None, in_database=True, parallel=False):
    """Compare the set's source with its record and write what differs, with change events.

    Where the source allows it, fingerprints are made and compared in the database and only
    the objects whose fingerprint differs leave it (``in_database=False`` reads every
    fingerprint out and compares them here, the way taken where the database cannot: kept for
    measurements and comparisons).

    With ``parallel`` (a Celery worker runs this), that comparison is cut into ranges of the
    objects' keys, ``MAX_ENTRIES_PER_DOCUMENT`` objects each, which every free worker takes
    part in (see :mod:`django_resourcesync.sharing`); the search for records whose object is
    gone, one query, follows here where the counts do not show that none is (:func:`_none_gone`).

    The first reconcile of a set records its resources silently and opens its first Change List:
    Destinations start from a Resource List, not from a flood of ``created`` events.
    """
    batch_size = batch_size or app_settings.BATCH_SIZE
    source = resource_set.get_source()
    queryset = source.queryset(resource_set.lookups)
    record_events = is_tracked(resource_set)
    rebased = _forget_fingerprints_if_rebased(resource_set)
    counts = ChangeCounts()
    compared = None  # how many objects the comparison in the database found in the set
    if in_database and _compared_in_database(resource_set, source, queryset):
        ranges = _key_ranges(queryset, app_settings.MAX_ENTRIES_PER_DOCUMENT) if parallel else []
        if len(ranges) > 1 and not _lists_ahead(source, queryset.db):
            options = {"record_events": record_events, "batch_size": batch_size}
            parts = [{**bounds, **options} for bounds in ranges]
            total = queryset.count() if progress else 0
            counted = []
            shared = sharing.run(
                resource_set, RECONCILE, parts, parallel=True,
                progress=progress and (lambda done, planned: progress("reconcile", total * done // planned, total)),
                # The set is counted once (for _none_gone), while the last ranges are with other
                # workers: the ranges do not count their objects (each count joins all of its
                # objects, where the comparison joins only those that differ: 40% of a range
                # with nothing changed), and a count after them would be the job's serial part.
                meanwhile=lambda: counted.append(queryset.count()),
            )
            differing = shared.pop(DIFFERING, 0)
            counts.add(ChangeCounts(**shared))
            compared = counted[0] if counted else queryset.count()
            counts.unchanged += max(0, compared - differing)
        else:
            compared = _reconcile_in_database(resource_set, source, queryset, batch_size, record_events, counts, progress)
    else:
        _reconcile_in_python(resource_set, source, queryset, batch_size, record_events, counts, progress)
    if not _none_gone(resource_set, queryset, compared):
        _remove_gone(resource_set, queryset, batch_size, record_events, counts)
    _forget_gone_left_out(resource_set, queryset)
    if not record_events:
        start_log(resource_set)
    if rebased or not resource_set.base_url:
        ResourceSet.objects.filter(pk=resource_set.pk).update(base_url=app_settings.BASE_URL)
        resource_set.base_url = app_settings.BASE_URL
    return counts


def _compared_in_database(resource_set, source, queryset):
    """Whether the set's objects are compared with their record in the database: fingerprints
    that cover the entries, made by the database (see ``ResourceSource.fingerprints_in_database``),
    integer keys, and the record in the same database as the objects."""
    return (
        bool(source.fingerprint_fields) and source.fingerprint_covers_entry
        and isinstance(queryset.model._meta.pk, models.IntegerField)  # auto fields too
        and queryset.db == Resource.objects.filter(resource_set=resource_set).db
        and source.fingerprints_in_database(queryset.db)
    )


RECONCILE = "reconcile"

#: What a range of a reconcile in parts gives besides its counts: how many of its objects
#: differed from their record in the database (the others are unchanged).
DIFFERING = "differing"


@sharing.kind(RECONCILE)
def _reconcile_range(resource_set, options, beat):
    """A part of a reconcile in parts: the objects whose keys are in ``(after, last]`` (either
    end open when ``None``), compared in the database. Safe to run twice: a second run finds
    the record written by the first."""
    source = resource_set.get_source()
    queryset = source.queryset(resource_set.lookups)
    counts = ChangeCounts()
    batch_size = options["batch_size"] or app_settings.BATCH_SIZE
    queryset = _in_range(queryset, options)
    # One range: the workers share the ranges, so it is not cut into ranges for threads again.
    differing = _reconcile_in_database(resource_set, source, queryset, batch_size, options["record_events"], counts,
                                       lambda *_args: beat(), on_threads=False, describe_first=True, counted=False)
    return {**asdict(counts), DIFFERING: differing}


def _none_gone(resource_set, queryset, objects):
    """Whether no record of the set can have lost its object, known by counting: after a
    comparison in the database, each of the set's ``objects`` has a record of its own (the key's
    text is unique in the set) unless it is left out, so with nothing left out, as many records
    as objects leave none without its object. Counting the records is an index scan; the search
    for gone records (an anti-join of the records with the set's query) costs far more.

    The count holds whatever changed meanwhile through the signals (an object and its record
    come and go together); only an object deleted without a signal while another is created
    with one could balance it, and the next reconcile finds that record (as it does where a
    reconcile in parts counted the objects while others compared its last ranges, and an object
    came or went without a signal meanwhile). ``objects`` is
    ``None`` where no comparison in the database counted them; a query that may give an object
    twice (a join along a to-many relation) counts rows, not objects, and is not trusted."""
    if objects is None or not _one_row_per_object(queryset):
        return False
    if LeftOut.objects.filter(resource_set=resource_set).exists():
        return False
    return Resource.objects.filter(resource_set=resource_set).count() == objects


def _one_row_per_object(queryset):
    """Whether ``queryset`` gives each object once: no union, and no join along a to-many
    relation (a reverse foreign key, a many-to-many) unless its rows are made distinct."""
    query = queryset.query
    if query.combinator or query.distinct_fields:
        return False
    if query.distinct:
        return True
    for join in query.alias_map.values():
        field = getattr(join, "join_field", None)
        if field is not None and (field.one_to_many or field.many_to_many):
            return False
    return True


def _remove_gone(resource_set, queryset, batch_size, record_events, counts):
    """Write the deletion of the records whose object left ``queryset``: deleted, made
    private, filtered out."""
    for keys in _gone_keys(resource_set, queryset, batch_size):
        _apply_batch(resource_set, dict.fromkeys(keys), record_events, counts)


def _key_ranges(queryset, size):
    """The keys of the objects' model cut into ranges of ``size`` keys, ``[{"after", "last"}]``:
    the first open below, the last open above (objects created meanwhile fall in a range too).
    Each end is found by skipping ``size`` keys in the model's key index from the one before:
    the keys of every row of the table, not only of the set's objects, whose filter (a join,
    say) would make each skip a walk through the set's query; a set of few of the table's
    objects gets more ranges, each quickly done."""
    model = queryset.model
    keys = model._base_manager.db_manager(queryset.db).order_by("pk").values_list("pk", flat=True)
    ends = []
    while found := list((keys.filter(pk__gt=ends[-1]) if ends else keys)[size - 1 : size]):
        ends.append(found[0])
    bounds = [None, *ends, None]
    return [{"after": bounds[index], "last": bounds[index + 1]} for index in range(len(bounds) - 1)]


def _lists_ahead(source, using):
    """Whether the sizes completing the source's fingerprints come from a listing read once for
    the whole set (S3): a reconcile in parts would read it once a part."""
    _expression, files = source.fingerprint_expression(using)
    return bool(files) and any(listing.lists_ahead for listing in source.file_sizes())


def _reconcile_in_database(resource_set, source, queryset, batch_size, record_events, counts, progress, on_threads=True,
                           describe_first=False, counted=True):
    """The fingerprint of each object is made by the database and joined with its record there:
    only the keys of the objects whose fingerprint differs (or that have no record) leave it,
    and only those objects are built and compared; returns how many objects there were (the
    others counted unchanged), or without ``counted`` how many differed (the objects are not
    counted, and ``progress`` is given ``None`` for their number). With
    ``on_threads``, they may be read range by range on threads (see :func:`_stale_batches`). With
    ``describe_first`` (a range of a reconcile in parts, which other workers' ranges wait on),
    each batch is described before the set's lock is taken (:func:`.writer.described_ahead`). Where
    file sizes complete the fingerprint, each row leaves with its digest, its files' names and
    its recorded fingerprint, and the sizes come from the storage's listing
    (:mod:`django_resourcesync.listing`), not a request per file."""
    expression, files = source.fingerprint_expression(queryset.db)
    # The record of the object: its key cast to text on the object's side, so that the lookup
    # uses the record's (set, key) index.
    record = Resource.objects.filter(resource_set=resource_set, object_pk=Cast(OuterRef("pk"), models.CharField()))
    annotated = queryset.order_by().annotate(**fingerprints.annotations(expression))
    # Counted beside the reading where it has threads: the count is a pass over the objects.
    with _counted(queryset, meanwhile=on_threads and _reading_threads(queryset) > 1, wanted=counted) as total:
        stale_seen = 0
        if not files:
            rows = annotated.filter(~Exists(record.filter(fingerprints.recorded_is(expression))))

            def found(batch, ahead=False):
                stale = {str(pk): _stored(digest) for pk, digest in batch}
                objects = _objects_of(source, queryset, stale, prefetch=ahead)
                # (Not on a reading thread: Python's lock on the interpreter makes two threads
                # describing no quicker than one, and the writer's waits on the database longer.)
                if not describe_first:
                    return stale, objects, {}
                return stale, objects, described_ahead(resource_set, objects, stale, record_events=record_events)

            rows = rows.values_list("pk", "_rs_fingerprint")
            for stale, objects, described in _stale_batches(queryset, rows, batch_size, found, on_threads=on_threads):
                stale_seen += len(stale)
                _apply_batch(resource_set, objects, record_events, counts, stale, described)
                if progress:
                    progress("reconcile", stale_seen, total())
        else:
            sizes = source.file_sizes()
            if any(listing.lists_ahead for listing in sizes):
                # A remote listing is read once, for every name in use (in key order of the
                # storage, not of the objects: pages of the objects' order would cross the keys).
                names = list(queryset.order_by().values_list(*files))
                for index, listing in enumerate(sizes):
                    listing.prepare(row[index] for row in names)
                del names
            rows = annotated.annotate(_rs_recorded=Subquery(record.values("fingerprint")[:1]))
            rows = rows.values_list("pk", "_rs_fingerprint", "_rs_recorded", *files)
            for stale, seen in _stale_with_sizes(source, rows, sizes, batch_size):
                stale_seen += len(stale)
                if stale:
                    _describe_again(resource_set, queryset, stale, record_events, counts, describe_first)
                if progress:
                    progress("reconcile", seen, total())
        if not counted:
            return stale_seen
        counts.unchanged += max(0, total() - stale_seen)
        if progress:
            progress("reconcile", total(), total())
    return total()


@contextmanager
def _counted(queryset, *, meanwhile, wanted=True):
    """A callable that gives how many objects ``queryset`` has. With ``meanwhile``, they are
    counted on a thread (and a connection) of their own while the caller reads and writes, and
    the callable waits for the count; else they are counted now. Not ``wanted``: ``None``."""
    if not wanted:
        yield lambda: None
        return
    if not meanwhile:
        total = queryset.count()
        yield lambda: total
        return

    def count():
        try:
            return queryset.count()
        finally:
            connections.close_all()  # this thread's

    with ThreadPoolExecutor(1, thread_name_prefix="resourcesync-count") as pool:
        yield pool.submit(count).result


def _reading_threads(queryset):
    """How many threads read the differing rows of a reconcile in one process beside the thread
    that writes them, 0 where that thread reads them itself (see
    :func:`~django_resourcesync.threads.beside_a_writer`)."""
    return threads.beside_a_writer(queryset.db)


#: What a reading thread puts last (see _stale_batches).
_READ = object()


def _stale_batches(queryset, rows, batch_size, found, on_threads=True):
    """Yield ``found(batch, ahead)`` of lists of ``rows`` (``values_list`` rows starting with the
    key: the objects whose fingerprint differs from their record's), at most ``batch_size`` a
    list: a tuple of dicts by key (those of batches found meanwhile are merged).

    Where the database allows it (:func:`_reading_threads`), threads read them range of keys by
    range (as a reconcile in parts cuts them), each on a connection of its own, and call
    ``found(batch, ahead=True)`` there (it reads the objects), while the caller writes what
    they found: the database's search, most of a reconcile with little changed, goes on beside
    the describing of what it found (on PostgreSQL on as many connections as there are threads;
    on SQLite on one, each page of rows fetched at once: :func:`_fetched_at_once`). Else they
    are read here, one batch at a time (and always without ``on_threads``).
    """
    count = _reading_threads(queryset) if on_threads else 0
    ranges = _key_ranges(queryset, app_settings.MAX_ENTRIES_PER_DOCUMENT) if count else []
    if len(ranges) < 2:
        for batch in _batches(rows, batch_size):
            yield found(batch)
        return
    fetch = _fetched_at_once if _fetches_at_once(queryset.db) else list
    waiting = queue.Queue(maxsize=2 * count)  # what was found waits here: a few batches at most
    stop = threading.Event()
    pending = iter(ranges)
    taking = threading.Lock()

    def put(item):
        while not stop.is_set():
            try:
                waiting.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def read():
        try:
            while not stop.is_set():
                with taking:
                    bounds = next(pending, None)
                if bounds is None:
                    return
                for batch in _batches(_in_range(rows, bounds), batch_size, fetch):
                    put(found(batch, ahead=True))
        except BaseException:
            stop.set()  # the others stop too; the error is raised below
            raise
        finally:
            try:
                connections.close_all()  # this thread's
            finally:
                waiting.put(_READ)  # always: taken by the loop below, or by its draining once it stops

    with ThreadPoolExecutor(count, thread_name_prefix="resourcesync-reconcile") as pool:
        readers = [pool.submit(read) for _ in range(count)]
        reading = count
        try:
            while reading:
                batch = waiting.get()
                # Batches found meanwhile are written together, up to batch_size rows.
                while batch is not _READ and len(batch[0]) < batch_size:
                    try:
                        more = waiting.get_nowait()
                    except queue.Empty:
                        break
                    if more is _READ:
                        reading -= 1
                        continue
                    batch = tuple({**mine, **theirs} for mine, theirs in zip(batch, more))
                if batch is _READ:
                    reading -= 1
                elif not stop.is_set():
                    yield batch
        finally:
            stop.set()
            while any(not reader.done() for reader in readers):  # a reader waiting to put stops
                try:
                    waiting.get(timeout=0.1)
                except queue.Empty:
                    pass
    for reader in readers:
        reader.result()  # a reader's error


def _fetches_at_once(using):
    """Whether pages of rows are fetched at once (:func:`_fetched_at_once`) from database
    ``using``: SQLite with its JSON functions."""
    connection = connections[using]
    return connection.vendor == "sqlite" and connection.features.supports_json_field


def _fetched_at_once(page):
    """The rows of ``page`` (a ``values_list`` query of integers and text, the key first) in key
    order, fetched as one value: SQLite makes them one JSON array. A reading thread then waits for
    the interpreter once a page, not once a row: SQLite's search between two rows runs in the
    library, which lets the interpreter go, and each row handed back has to take it again from
    the thread that writes, which holds it most of the time."""
    width = len(page._fields)
    columns = ", ".join(f"_rs_{index}" for index in range(width))
    sql, params = page.query.sql_with_params()
    with connections[page.db].cursor() as cursor:
        cursor.execute(
            f"WITH _rs_page ({columns}) AS ({sql}) SELECT json_group_array(json_array({columns})) FROM _rs_page",
            params,
        )
        rows = [tuple(row) for row in json.loads(cursor.fetchone()[0])]
    rows.sort(key=itemgetter(0))  # an aggregate's order is not its input's
    return rows


def _in_range(rows, bounds):
    """``rows`` of the objects whose keys are in ``(after, last]`` (either end open when ``None``)."""
    if bounds["after"] is not None:
        rows = rows.filter(pk__gt=bounds["after"])
    if bounds["last"] is not None:
        rows = rows.filter(pk__lte=bounds["last"])
    return rows


def _stale_with_sizes(source, rows, sizes, batch_size):
    """Yield ``({key: fingerprint}, rows seen so far)`` of the objects of ``rows`` (``pk``,
    digest, recorded fingerprint, file names) whose fingerprint, completed with their files'
    sizes, is not the recorded one, a batch at a time. The rows are read in one pass, in key
    order (a query per page would have the database join and sort the set again for each),
    which stops, and resumes after the last key read, whenever a batch is full: the batch is
    written while no read is open."""
    last, seen = None, 0
    while True:
        page = rows.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        stale, full = {}, False
        if len(sizes) == 1:  # one file (the usual case), inline: this loop is most of the time
            size = sizes[0].size
            for pk, digest, recorded, name in page.iterator(chunk_size=2000):
                seen += 1
                last = pk
                if not name:
                    fingerprint = f"{digest}:"
                else:
                    try:
                        fingerprint = f"{digest}:{size(name)}"
                    except (OSError, ValueError, NotImplementedError):
                        fingerprint = ""
                if fingerprint != recorded or not fingerprint:
                    stale[str(pk)] = _stored(fingerprint)
                    if len(stale) >= batch_size:
                        full = True
                        break
        else:
            for pk, digest, recorded, *names in page.iterator(chunk_size=2000):
                seen += 1
                last = pk
                fingerprint = _stored(source.fingerprint_with_sizes(digest, names, sizes))
                if not fingerprint or fingerprint != recorded:
                    stale[str(pk)] = fingerprint
                    if len(stale) >= batch_size:
                        full = True
                        break
        yield stale, seen
        if not full:
            return


def _describe_again(resource_set, queryset, fingerprints, record_events, counts, describe_first=False):
    """Build the objects ``fingerprints`` names and compare them with their record (described
    before the set's lock is taken, with ``describe_first``)."""
    objects = _objects_of(resource_set.get_source(), queryset, fingerprints)
    described = described_ahead(resource_set, objects, fingerprints, record_events=record_events) if describe_first else None
    _apply_batch(resource_set, objects, record_events, counts, fingerprints, described)


def _objects_of(source, queryset, fingerprints, prefetch=False):
    """``{key: object}`` of the keys of ``fingerprints`` (read before the objects, as ever),
    ``None`` for one gone since. With ``prefetch`` (read ahead, on another thread than the
    one that describes them) their files are asked of the operating system now."""
    found = {str(obj.pk): obj for obj in bulk.filter_in(queryset, "pk", list(fingerprints))}
    if prefetch:
        source.prefetch(list(found.values()))
    return {key: found.get(key) for key in fingerprints}


def _reconcile_in_python(resource_set, source, queryset, batch_size, record_events, counts, progress):
    """The fingerprints (or the objects) read out a batch at a time and compared here."""
    total = queryset.count() if progress else None
    seen = 0
    # With fingerprints read in the database that cover the entries, only the objects whose
    # fingerprint changed are built and compared; the others are unchanged.
    vouching = bool(source.fingerprint_fields) and source.fingerprint_covers_entry
    rows = queryset.values_list("pk", *source.fingerprint_fields) if vouching else queryset
    for batch in _batches(rows, batch_size):
        if vouching:
            if source.fingerprints_in_database(queryset.db):  # the same fingerprints as every other path
                pks = [row[0] for row in batch]
                fingerprints = fingerprints_of_rows(source, bulk.filter_in(queryset, "pk", pks).values_list("pk"))
            else:
                fingerprints = fingerprints_of_rows(source, batch)
            unchanged = matching_fingerprints(resource_set, fingerprints)
            counts.unchanged += len(unchanged)
            stale = {str(row[0]): row[0] for row in batch if str(row[0]) not in unchanged}
            found = {str(obj.pk): obj for obj in bulk.filter_in(queryset, "pk", stale.values())} if stale else {}
            objects = {key: found.get(key) for key in stale}  # None: gone since it was read
        else:
            objects, fingerprints = {str(obj.pk): obj for obj in batch}, None
        if objects:
            _apply_batch(resource_set, objects, record_events, counts, fingerprints)
        seen += len(batch)
        if progress:
            progress("reconcile", seen, total)


def _forget_gone_left_out(resource_set, queryset):
    """Left-out objects that are no longer among the set's items are no longer reported (they
    have no record, so the search for gone records does not find them)."""
    keys = list(LeftOut.objects.filter(resource_set=resource_set).values_list("object_pk", flat=True))
    for start in range(0, len(keys), app_settings.BATCH_SIZE):
        batch = keys[start : start + app_settings.BATCH_SIZE]
        try:
            present = {str(pk) for pk in bulk.filter_in(queryset, "pk", batch).values_list("pk", flat=True)}
        except (ValueError, TypeError):  # keys the model's key field cannot take
            present = set()
        gone = [key for key in batch if key not in present]
        if gone:
            bulk.filter_in(LeftOut.objects.filter(resource_set=resource_set), "object_pk", gone).delete()


def _forget_fingerprints_if_rebased(resource_set):
    """Whether ``BASE_URL`` changed since the set's record was written; if so every record's
    fingerprint is forgotten, so that this reconcile describes every object again (each moves
    to its new URI: deleted at the old one, created at the new one) and no document mixes the
    URIs of two hosts."""
    if not resource_set.base_url or resource_set.base_url == app_settings.BASE_URL:
        return False
    logger.warning("Set %s: the base URL changed from %s to %s; every entry is rendered again",
                   resource_set.slug, resource_set.base_url, app_settings.BASE_URL)
    Resource.objects.filter(resource_set=resource_set).update(fingerprint="")
    return True


def _gone_keys(resource_set, queryset, batch_size):
    """Yield lists of the keys of the set's records whose object is not in ``queryset``. With
    integer keys, one anti-join in the database finds them; other keys are looked up a batch of
    records at a time (their text form in the database may not be ``str(pk)``)."""
    records = Resource.objects.filter(resource_set=resource_set)
    if isinstance(queryset.model._meta.pk, models.IntegerField) and queryset.db == records.db:  # auto fields too
        # NOT EXISTS, which databases run as an anti-join whatever the sizes (NOT IN may not);
        # the record's key is cast, not the object's, so the lookup can use the primary key's
        # index. A key that is not an integer as str() writes it (left by an earlier source of
        # the set, say) is never cast: it has no object, and is gone.
        as_integer = Cast("object_pk", models.BigIntegerField())
        if connections[records.db].vendor == "postgresql":
            gone = _gone_integer_keys_postgresql(records, queryset, as_integer)
            if gone is not None:
                for start in range(0, len(gone), batch_size):
                    yield gone[start : start + batch_size]
                return
        if connections[records.db].vendor == "sqlite":
            # SQLite's CAST never fails: a key is an integer if it reads back the same (its
            # REGEXP would be a Python function called per record).
            integer = Q(object_pk=Cast(as_integer, models.CharField()))
        else:
            integer = Q(object_pk__regex=r"^(0|-?[1-9][0-9]{0,17})$")
        key = Case(When(integer, then=as_integer), default=None, output_field=models.BigIntegerField())
        present = queryset.order_by().filter(pk=OuterRef("key"))
        gone = list(records.annotate(key=key).filter(~Exists(present)).values_list("object_pk", flat=True))
        for start in range(0, len(gone), batch_size):
            yield gone[start : start + batch_size]
        return
    for batch in _batches(records.values_list("pk", "object_pk"), batch_size):
        keys = [key for _pk, key in batch]
        present = {str(pk) for pk in queryset.filter(pk__in=keys).values_list("pk", flat=True)}
        gone = [key for key in keys if key not in present]
        if gone:
            yield gone


def _gone_integer_keys_postgresql(records, queryset, as_integer):
    """The gone keys found by casting every record's key straight to an integer (the hash
    anti-join then costs about 60% of one that first tests each key against a pattern), the
    object's key written back as text required to be the record's (so ``"007"`` or ``" 7"``
    have no object); ``None`` where a key is no integer at all, which PostgreSQL refuses to
    cast: the caller then tests each key first."""
    present = (
        queryset.order_by()
        .annotate(_rs_key_text=Cast("pk", models.TextField()))
        .filter(pk=OuterRef("_rs_key"), _rs_key_text=OuterRef("object_pk"))
    )
    gone = records.annotate(_rs_key=as_integer).filter(~Exists(present)).values_list("object_pk", flat=True)
    try:
        with transaction.atomic(using=records.db):
            return list(gone)
    except DataError:  # a key that is no integer, or too large for one
        return None


def _apply_batch(resource_set, objects, record_events, counts, fingerprints=None, described=None):
    with locked(resource_set):
        writer = SetWriter(resource_set, record_events=record_events)
        if fingerprints is not None:
            objects, fingerprints = _as_now(writer, objects, fingerprints)
        writer.apply(objects, fingerprints, described=described)
    counts.add(writer.counts)


def _as_now(writer, objects, fingerprints):
    """``objects`` and their ``fingerprints``, read before the set's lock was taken, as they are
    now: the fingerprints read again under the lock, and the objects whose fingerprint changed
    meanwhile read again after them (``None``: gone). A change saved and written into the set
    since they were read must not be written over by the state before it."""
    present = [key for key, obj in objects.items() if obj is not None]
    now = writer.read_fingerprints(present)
    moved = [key for key in present if now.get(key) != fingerprints.get(key)]
    if not moved:
        return objects, fingerprints
    again = writer.read_objects(moved)
    objects = {**objects, **{key: again.get(key) for key in moved}}
    return objects, {**fingerprints, **{key: now[key] for key in moved if key in now}}
