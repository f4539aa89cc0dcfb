"""Receivers the app connects in ``AppConfig.ready()``.

Change tracking listens to ``post_save`` and ``post_delete`` of every model a registered source
tracks (its items' model and its ``related_models``). A handler does one cheap thing inside the
saving transaction: it inserts the affected objects as pending changes; the comparison, hashing
and change events happen after the commit, off the request (see :mod:`.tracking`).
"""

from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from . import storage, tracking
from .models import ChangeDumpPackage, ChangeList, Document
from .sources import registry


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


def object_changed(sender, instance, raw=False, using=None, **kwargs):
    """A tracked object was saved or deleted: record the objects of each source it affects."""
    if not tracking.is_enabled() or getattr(instance, "_resourcesync_skip", False):
        return
    keys_by_source = {}
    for source in registry.sources_tracking(sender):
        own = sender._meta.concrete_model is source.item_model._meta.concrete_model
        if raw and not own:
            continue  # fixture loading: related objects may not be there yet; reconcile covers it
        keys_by_source[source.name] = [instance.pk] if own else source.affected(instance)
    tracking.record_many(keys_by_source, using=using)


def connect_tracked_models():
    """Listen to the models of every registered source (idempotent)."""
    models = {model for source in registry.sources() for model in source.tracked_models()}
    for model in models:
        uid = f"resourcesync_track_{model._meta.label_lower}"
        post_save.connect(object_changed, sender=model, dispatch_uid=uid + "_save")
        post_delete.connect(object_changed, sender=model, dispatch_uid=uid + "_delete")
