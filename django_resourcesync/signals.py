"""The app's own signal, and the receivers that keep storage in step with its records.

Files leave storage when the rows that record them are deleted, once the deletion commits. The
receivers of change tracking are in :mod:`.tracking.receivers`.
"""

from django.db import transaction
from django.db.models.signals import post_delete
from django.dispatch import Signal, receiver

from . import storage
from .models import ChangeDumpPackage, ChangeList, Document, ResourceSet, SourceState

#: Sent by change tracking, in the transaction that records it, when resources leave a set
#: (deleted, made private, filtered out), or move to other URIs: ``resource_set``, ``leaving``,
#: ``{object_pk: record id}``, ``moved``, the same of those that moved, ``uris``, ``{object_pk:
#: URI}`` they had, and ``in_use``, the sha-256 of bytes the same batch's changes use (of other
#: objects). Whatever lists those URIs or holds the bytes of what left must stop serving them
#: (see builders.withdrawal).
resources_left = Signal()


@receiver(post_delete, sender=Document, dispatch_uid="resourcesync_document_file")
def delete_document_file(sender, instance, **kwargs):
    """A document's file leaves storage when its row is deleted (a pruned build, a deleted set),
    once the deletion commits: a rolled-back deletion keeps it."""
    name = instance.storage_name
    transaction.on_commit(lambda: storage.delete_quietly([name]), using=kwargs.get("using"))


@receiver(post_delete, sender=ChangeList, dispatch_uid="resourcesync_changelist_file")
def delete_changelist_file(sender, instance, **kwargs):
    if instance.storage_name:
        name = instance.storage_name
        transaction.on_commit(lambda: storage.delete_quietly([name]), using=kwargs.get("using"))


@receiver(post_delete, sender=ChangeDumpPackage, dispatch_uid="resourcesync_changedump_files")
def delete_changedump_files(sender, instance, **kwargs):
    names = [instance.storage_name, instance.manifest_storage_name]
    transaction.on_commit(lambda: storage.delete_quietly(names), using=kwargs.get("using"))


@receiver(post_delete, sender=ResourceSet, dispatch_uid="resourcesync_set_deleted")
def set_deleted(sender, instance, **kwargs):
    """The Source Description changes when a set goes: its date must not go back with it."""
    SourceState.touch()
