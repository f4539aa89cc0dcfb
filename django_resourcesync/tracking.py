"""Keep the app's record of what each set publishes (:class:`~.models.Resource`) in step with the site.

:func:`reconcile` compares a set's source with the record and writes what differs. It reads the
site's objects in primary-key order, one batch at a time, so memory stays flat, and it hashes a
resource's bytes only when its fingerprint (by default the file's name and size, or ``lastmod``)
has changed since the last pass.
"""

import logging
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from .conf import app_settings
from .models import Resource
from .sources import Representation, UnpublishableResource
from .xml.writer import resource_entry

logger = logging.getLogger(__name__)

RENDERED_FIELDS = ("uri", "lastmod", "changefreq", "md5", "sha256", "length", "media_type", "links")
ENTRY_FIELDS = (*RENDERED_FIELDS, "fingerprint", "entry_xml")


@dataclass
class ReconcileResult:
    created: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    skipped: int = 0

    def __str__(self):
        return (
            f"{self.created} created, {self.updated} updated, {self.deleted} deleted, "
            f"{self.unchanged} unchanged, {self.skipped} skipped"
        )


def entry_values(source, obj, known=None):
    """Field values of the Resource row for ``obj``; reuses ``known``'s hashes when nothing changed."""
    fingerprint = source.fingerprint(obj)
    fingerprint = "" if fingerprint is None else str(fingerprint)[:512]
    representation = None
    if known is not None and fingerprint and known.fingerprint == fingerprint and known.sha256:
        representation = Representation(known.md5, known.sha256, known.length, known.media_type or None)
    entry = source.entry(obj, known=representation)
    values = {
        "uri": entry.uri,
        "lastmod": entry.lastmod,
        "changefreq": entry.changefreq or "",
        "md5": entry.md5,
        "sha256": entry.sha256,
        "length": entry.length,
        "media_type": entry.media_type or "",
        "links": entry.links,
        "fingerprint": fingerprint,
    }
    values["entry_xml"] = resource_entry(**{name: values[name] for name in RENDERED_FIELDS})
    return values


def _batches(queryset, batch_size):
    """Yield lists of objects in primary-key order, by keyset pagination."""
    last = None
    while True:
        page = queryset.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        batch = list(page[:batch_size])
        if not batch:
            return
        yield batch
        last = batch[-1].pk


def reconcile(resource_set, *, batch_size=None, progress=None):
    """Bring the set's Resource rows in line with its source; returns the counts."""
    batch_size = batch_size or app_settings.BATCH_SIZE
    source = resource_set.get_source()
    queryset = source.queryset(resource_set.lookups)
    result = ReconcileResult()
    total = queryset.count() if progress else None
    seen = 0
    for batch in _batches(queryset, batch_size):
        _reconcile_batch(resource_set, source, batch, result)
        seen += len(batch)
        if progress:
            progress("reconcile", seen, total)
    _delete_departed(resource_set, queryset, batch_size, result)
    return result


def _reconcile_batch(resource_set, source, batch, result):
    keys = [str(obj.pk) for obj in batch]
    known = {row.object_pk: row for row in Resource.objects.filter(resource_set=resource_set, object_pk__in=keys)}
    creates, updates = [], []
    now = timezone.now()
    for obj, key in zip(batch, keys):
        try:
            values = entry_values(source, obj, known.get(key))
        except UnpublishableResource as exc:
            logger.warning("Set %s: %r not published: %s", resource_set.slug, obj, exc)
            result.skipped += 1
            continue
        row = known.get(key)
        if row is None:
            creates.append(Resource(resource_set=resource_set, object_pk=key, recorded=now, **values))
        elif any(getattr(row, name) != value for name, value in values.items()):
            for name, value in values.items():
                setattr(row, name, value)
            row.recorded = now
            updates.append(row)
        else:
            result.unchanged += 1
    creates, updates = _without_uri_clashes(resource_set, creates, updates, result)
    with transaction.atomic():
        Resource.objects.bulk_create(creates)
        Resource.objects.bulk_update(updates, [*ENTRY_FIELDS, "recorded"])
    result.created += len(creates)
    result.updated += len(updates)


def _without_uri_clashes(resource_set, creates, updates, result):
    """Leave out rows whose URI another object of the set already publishes."""
    rows = creates + updates
    taken = dict(
        Resource.objects.filter(resource_set=resource_set, uri__in=[row.uri for row in rows]).values_list("uri", "object_pk")
    )
    kept_creates, kept_updates = [], []
    for row, kept in [(row, kept_creates) for row in creates] + [(row, kept_updates) for row in updates]:
        owner = taken.get(row.uri)
        if owner is not None and owner != row.object_pk:
            logger.warning("Set %s: object %s has the URI %s of object %s; not published", resource_set.slug, row.object_pk, row.uri, owner)
            result.skipped += 1
            continue
        taken[row.uri] = row.object_pk
        kept.append(row)
    return kept_creates, kept_updates


def _delete_departed(resource_set, queryset, batch_size, result):
    """Remove rows whose object is gone from the source (deleted, made private, filtered out)."""
    rows = Resource.objects.filter(resource_set=resource_set)
    for batch in _batches(rows.only("pk", "object_pk"), batch_size):
        keys = [row.object_pk for row in batch]
        present = {str(pk) for pk in queryset.filter(pk__in=keys).values_list("pk", flat=True)}
        gone = [row.pk for row in batch if row.object_pk not in present]
        if gone:
            Resource.objects.filter(pk__in=gone).delete()
            result.deleted += len(gone)
