"""Receivers of change tracking, connected in ``AppConfig.ready()``.

Change tracking listens to ``post_save`` and ``post_delete`` of every model a registered source
tracks (its items' model and its ``related_models``). A handler does one cheap thing inside the
saving transaction: it records the object as a pending change (see :mod:`.outbox`); the
comparison, hashing and change events happen after the commit, off the request.
"""

from celery.signals import task_postrun
from django.db.models.signals import post_delete, post_save

from ..models import ResourceSet
from ..sources import registry
from . import is_enabled, outbox


def object_changed(sender, instance, raw=False, using=None, signal=None, **kwargs):
    """A tracked object was saved or deleted: record it as a pending change of each source it
    concerns. A related object is recorded as such (the source's objects it affects are looked
    up after the commit), except when it is deleted: then they are looked up now. A save of one of
    the source's own objects is a change of it, with the state it left (see
    :meth:`~django_resourcesync.sources.ResourceSource.saved_state`)."""
    if not is_enabled() or getattr(instance, "_resourcesync_skip", False):
        return
    rows = []
    for source in registry.sources_tracking(sender):
        related = source.related_label(sender)
        if not related:
            # A save is a change, and what its state needs later goes with it; a deletion only
            # asks for the object to be looked at (it is gone, whatever it was).
            state = None if signal is post_delete else source.state_of_save(instance)
            rows.append((source.name, str(instance.pk), "", state))
        elif raw:
            continue  # fixture loading: related objects may not be there yet; reconcile covers it
        elif signal is post_delete:
            rows.extend((source.name, str(key), "") for key in source.affected(instance))
        else:
            rows.append((source.name, str(instance.pk), related))
    outbox.record(rows, using=using, saved=True)


def connect_tracked_models():
    """Listen to the models of every registered source (idempotent). A source that cannot say
    which models it publishes is left out (system check ``resourcesync.E029``), never a failed
    start-up."""
    models = {model for source in registry.sources() for model in registry.models_of(source)}
    for model in models:
        uid = f"resourcesync_track_{model._meta.label_lower}"
        post_save.connect(object_changed, sender=model, dispatch_uid=uid + "_save")
        post_delete.connect(object_changed, sender=model, dispatch_uid=uid + "_delete")


def flush_after_task(**kwargs):
    """A Celery task that saved tracked objects hands their pending changes over before the
    worker takes the next task (or exits)."""
    outbox.dispatcher.flush()


def connect_sets():
    """A process forgets what it read of the sets as soon as it changes one (see outbox.memberships)."""
    post_save.connect(outbox.forget_sets, sender=ResourceSet, dispatch_uid="resourcesync_forget_sets_save")
    post_delete.connect(outbox.forget_sets, sender=ResourceSet, dispatch_uid="resourcesync_forget_sets_delete")


def connect_celery():
    task_postrun.connect(flush_after_task, dispatch_uid="resourcesync_flush_pending_changes", weak=False)
