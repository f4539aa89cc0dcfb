"""Processing pending changes: turn the outbox's rows into change events, set by set."""

import logging

from django.apps import apps
from django.db import transaction

from .. import bulk
from ..conf import app_settings
from ..models import PendingChange, ResourceSet
from ..sources import registry
from .locks import is_tracked
from .writer import ChangeCounts, SetWriter

logger = logging.getLogger(__name__)


def _unique_keys(keys):
    return dict.fromkeys(str(key) for key in keys if key is not None)


def process_pending(source_names=None, *, batch_size=None):
    """Turn pending changes into change events; returns the counts. Safe to run concurrently."""
    batch_size = batch_size or app_settings.BATCH_SIZE
    counts = ChangeCounts()
    names = source_names or list(PendingChange.objects.values_list("source", flat=True).distinct())
    for name in names:
        if name not in registry:
            logger.warning("Pending changes for the unregistered source %r are left waiting", name)
            continue
        source = registry.get(name)
        # A disabled set publishes nothing and is reconciled by its first rebuild once enabled:
        # its changes are not written meanwhile, and a broken disabled set holds up no one.
        sets = list(ResourceSet.objects.filter(source=name, enabled=True).order_by("pk"))
        broken = set()  # sets whose changes could not be written in this run
        after = 0  # rows up to this id are kept for the next run (a set failed on them)
        while True:
            with transaction.atomic():
                # Lock the sets first (in pk order, as every writer does), then take the batch:
                # a concurrent run waits here and then finds the rows already processed.
                for resource_set in sets:
                    ResourceSet.objects.select_for_update().filter(pk=resource_set.pk).first()
                pending = list(
                    PendingChange.objects.filter(source=name, id__gt=after)
                    .order_by("id")
                    .values_list("id", "object_pk", "related")[:batch_size]
                )
                if not pending:
                    break
                keys = _keys_of(source, pending)
                for resource_set in sets:
                    if resource_set.pk in broken:
                        continue
                    try:
                        with transaction.atomic():  # a savepoint: a broken set spoils only its own part
                            _apply_keys(resource_set, source, keys, batch_size, counts)
                    except Exception:
                        # The other sets go on; this one is not tried again in this run.
                        logger.exception(
                            "Set %s: pending changes could not be applied; they wait for the next run", resource_set.slug
                        )
                        broken.add(resource_set.pk)
                if broken:
                    # A row goes only once its change is written in every set: these stay, and
                    # the next run (or the set's reconcile, once it is fixed) writes them.
                    after = pending[-1][0]
                else:
                    bulk.filter_in(PendingChange.objects.all(), "pk", [row_id for row_id, _key, _related in pending]).delete()
        counts.failed_sets += len(broken)
    return counts


def _keys_of(source, pending):
    """The keys of the source's objects that pending changes name, those of related objects
    resolved to the source's objects they affect (as they are now)."""
    keys, related = {}, {}
    for _id, key, related_label in pending:
        if related_label:
            related.setdefault(related_label, []).append(key)
        else:
            keys[key] = None
    for label, pks in related.items():
        try:
            model = apps.get_model(label)
        except LookupError:
            logger.warning("Pending changes of the unknown model %r are dropped", label)
            continue
        keys.update(dict.fromkeys(_unique_keys(source.affected_by(model, pks))))
    return list(keys)


def _apply_keys(resource_set, source, keys, batch_size, counts):
    writer = SetWriter(resource_set, record_events=is_tracked(resource_set))
    for start in range(0, len(keys), batch_size):
        batch = keys[start : start + batch_size]
        fingerprints = writer.read_fingerprints(batch) if source.fingerprint_fields else None  # first
        present = {str(obj.pk): obj for obj in bulk.filter_in(source.queryset(resource_set.lookups), "pk", batch)}
        writer.apply({key: present.get(key) for key in batch}, fingerprints)
    counts.add(writer.counts)
