"""Reconciliation: compare a whole set with the site's data, the safety net every path converges on."""

import logging

from django.db import models
from django.db.models import Case, Exists, OuterRef, When
from django.db.models.functions import Cast

from .. import bulk
from ..conf import app_settings
from ..models import LeftOut, Resource, ResourceSet
from .changelog import start_log
from .locks import is_tracked, locked
from .writer import ChangeCounts, SetWriter, fingerprints_of_rows, matching_fingerprints

logger = logging.getLogger(__name__)


def _batches(queryset, batch_size):
    """Yield lists of objects (or of ``values_list`` rows starting with the key) in primary-key
    order, by keyset pagination."""
    last = None
    while True:
        page = queryset.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        batch = list(page[:batch_size])
        if not batch:
            return
        yield batch
        last = batch[-1][0] if isinstance(batch[-1], tuple) else batch[-1].pk


def reconcile(resource_set, *, batch_size=None, progress=None):
    """Compare the set's source with its record and write what differs, with change events.

    The first reconcile of a set records its resources silently and opens its first Change List:
    Destinations start from a Resource List, not from a flood of ``created`` events.
    """
    batch_size = batch_size or app_settings.BATCH_SIZE
    source = resource_set.get_source()
    queryset = source.queryset(resource_set.lookups)
    record_events = is_tracked(resource_set)
    rebased = _forget_fingerprints_if_rebased(resource_set)
    counts = ChangeCounts()
    total = queryset.count() if progress else None
    seen = 0
    # With fingerprints read in the database that cover the entries, only the objects whose
    # fingerprint changed are built and compared; the others are unchanged.
    vouching = bool(source.fingerprint_fields) and source.fingerprint_covers_entry
    rows = queryset.values_list("pk", *source.fingerprint_fields) if vouching else queryset
    for batch in _batches(rows, batch_size):
        if vouching:
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
    # Rows whose object left the source: deleted, made private, filtered out.
    for keys in _gone_keys(resource_set, queryset, batch_size):
        _apply_batch(resource_set, dict.fromkeys(keys), record_events, counts)
    _forget_gone_left_out(resource_set, queryset)
    if not record_events:
        start_log(resource_set)
    if rebased or not resource_set.base_url:
        ResourceSet.objects.filter(pk=resource_set.pk).update(base_url=app_settings.BASE_URL)
        resource_set.base_url = app_settings.BASE_URL
    return counts


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
        key = Case(
            When(object_pk__regex=r"^(0|-?[1-9][0-9]{0,17})$", then=Cast("object_pk", models.BigIntegerField())),
            default=None,
            output_field=models.BigIntegerField(),
        )
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


def _apply_batch(resource_set, objects, record_events, counts, fingerprints=None):
    with locked(resource_set):
        writer = SetWriter(resource_set, record_events=record_events)
        writer.apply(objects, fingerprints)
    counts.add(writer.counts)
