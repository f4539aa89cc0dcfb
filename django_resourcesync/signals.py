"""Receivers the app connects in ``AppConfig.ready()``."""

from django.db import transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver

from . import storage
from .models import Document


@receiver(post_delete, sender=Document, dispatch_uid="resourcesync_document_file")
def delete_document_file(sender, instance, **kwargs):
    """A document's file leaves storage when its row is deleted (a pruned build, a deleted set),
    once the deletion commits: a rolled-back deletion keeps it."""
    name = instance.storage_name
    transaction.on_commit(lambda: storage.delete_quietly([name]), using=kwargs.get("using"))
