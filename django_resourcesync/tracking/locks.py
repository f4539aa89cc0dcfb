"""The set lock: one writer of a set's record and change log at a time."""

import contextlib

from django.db import router, transaction

from ..models import ResourceSet


@contextlib.contextmanager
def locked(resource_set):
    """A transaction holding the set's row lock: one writer of its record and log at a time."""
    with transaction.atomic(using=router.db_for_write(ResourceSet)):
        ResourceSet.objects.lock(resource_set.pk)
        yield


def is_tracked(resource_set):
    """Whether the set's change log has started (its first reconcile opened a Change List)."""
    return resource_set.changelists.exists()
