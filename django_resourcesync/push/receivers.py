"""What makes the channels look for something to announce: the commit of a change to what they
tell of (see :func:`django_resourcesync.push.soon`)."""

from celery.signals import worker_ready
from django.db.models.signals import post_delete, post_save

from ..models import Build, ChangeDumpPackage, ChangeList, ResourceSet
from . import DELIVER, queue, soon


def _set_changed(sender, instance, using, **kwargs):
    soon(None, using=using)  # the Source Description may change: every framework channel


def _set_document_changed(sender, instance, using, **kwargs):
    if sender is Build and instance.status != Build.Status.PUBLISHED:
        return
    soon(instance.resource_set_id, using=using)


def _worker_ready(**kwargs):
    """A worker that starts (again) delivers what is due: what a worker that died was
    delivering goes out once its claim runs out."""
    queue(DELIVER)


def connect():
    worker_ready.connect(_worker_ready, dispatch_uid="resourcesync_push_worker_ready", weak=False)
    for signal in (post_save, post_delete):
        signal.connect(_set_changed, sender=ResourceSet, dispatch_uid=f"resourcesync_push_set_{signal is post_save}")
        for model in (Build, ChangeList, ChangeDumpPackage):
            signal.connect(_set_document_changed, sender=model,
                           dispatch_uid=f"resourcesync_push_{model.__name__}_{signal is post_save}")
