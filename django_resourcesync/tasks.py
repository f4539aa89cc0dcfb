"""Celery tasks. The app defines no schedule: see docs/schedules.rst for a beat snippet.

Task names are stable (``resourcesync.*``) so that schedules stored in django-celery-beat keep
working across releases.
"""

import logging

from celery import shared_task

from . import capabilities, push, sharing, sweep, tracking
from .builders import changedump, parts
from .builders.locks import build_lock
from .exceptions import BuildAbandoned
from .models import ResourceSet
from .push import announce, hub
from .rebuild import rebuild_set
from .tracking.changelog import close_due

logger = logging.getLogger(__name__)


def _summary(resource_set, builds):
    return [
        {"set": resource_set.slug, "build": b.pk, "capability": b.capability, "status": b.status, "entries": b.entries}
        for b in builds
    ]


@shared_task(name="resourcesync.rebuild_set", bind=True)
def rebuild_set_task(self, set_id, only=None, batch_size=None):
    """Rebuild one enabled set's documents; returns a summary of the builds. Run by a worker, a
    Resource List past one document and a Resource Dump of more than one package are rendered in
    parts by ``resourcesync.build_part`` tasks, and their builds are reported ``running`` until
    the last part of each sends the final step that publishes it."""
    try:
        resource_set = ResourceSet.objects.get(pk=set_id, enabled=True)
    except ResourceSet.DoesNotExist:
        logger.warning("Resource set %s does not exist or is disabled; nothing built", set_id)
        return []
    return _summary(resource_set, rebuild_set(resource_set, only=only, batch_size=batch_size, parallel=not self.request.is_eager))


# A part or final step whose worker dies (even by SIGKILL) goes back to the queue: it is
# acknowledged only once it has run, and a lost worker's task is rejected for redelivery.
PART_TASK = {"acks_late": True, "reject_on_worker_lost": True}


@shared_task(name="resourcesync.build_part", bind=True, **PART_TASK)
def build_part_task(self, build_id, number, holder, batch_size=None):
    """Render one part of a build; the part that completes the build sends its final step. A
    failing part is retried until ``PART_ATTEMPTS`` tries, then fails the build."""
    try:
        complete = parts.run_part(build_id, number, holder, batch_size=batch_size)
    except BuildAbandoned as exc:
        parts.fail(build_id, holder, exc)
        return None
    except Exception as exc:
        if not self.request.is_eager and parts.may_retry(build_id, number):
            raise self.retry(exc=exc, countdown=2**self.request.retries)
        parts.fail(build_id, holder, exc)
        raise
    if complete:
        finish_build_task.delay(build_id, holder)
    return complete


@shared_task(name="resourcesync.finish_build", **PART_TASK)
def finish_build_task(build_id, holder):
    """Check every part of a build, write its index and publish it; on failure the build is
    marked failed and the documents published before stay."""
    try:
        build = parts.run_finish(build_id, holder)
    except Exception as exc:
        parts.fail(build_id, holder, exc)
        raise
    return build and build.pk


@shared_task(name="resourcesync.rebuild_all")
def rebuild_all_task(only=None, batch_size=None):
    """Rebuild every enabled set, one after the other, then sweep the storage. A set that fails
    does not stop the others: its failure is logged, recorded on its build, and reported in the
    summary."""
    summary = []
    for resource_set in ResourceSet.objects.filter(enabled=True):
        try:
            summary += _summary(resource_set, rebuild_set(resource_set, only=only, batch_size=batch_size))
        except Exception as exc:
            logger.exception("Rebuilding resource set %s failed", resource_set.slug)
            summary.append({"set": resource_set.slug, "status": "failed", "error": str(exc)})
    try:
        sweep.sweep()
    except Exception:  # the builds are published; the next sweep tries again
        logger.exception("The storage sweep failed")
    return summary


@shared_task(name="resourcesync.sweep_storage")
def sweep_storage_task():
    """Delete stored files no record refers to (left by killed or failed builds), fail builds
    whose process is gone (beat: hourly, say)."""
    return str(sweep.sweep())


@shared_task(name="resourcesync.audit")
def audit_task(sample=20):
    """Audit each enabled set over HTTP at BASE_URL as a Destination sees it, and keep its
    report for the admin (beat: daily, say). Returns ``{slug: problems found}``."""
    from . import audit
    from .conf import app_settings

    return audit.audit_sets(sample=sample, schemas=app_settings.AUDIT_SCHEMAS)


@shared_task(name="resourcesync.process_changes", bind=True)
def process_changes_task(self, sources=None):
    """Turn pending changes (from signals and the bulk API) into change events. Queued after
    every commit that records changes; also worth a beat entry every minute as a safety net.
    Run by a worker, the objects of a large batch of changes are described by every free
    worker side by side."""
    return str(tracking.process_pending(sources, parallel=not self.request.is_eager))


@shared_task(name="resourcesync.share_job", **PART_TASK)
def share_job_task(job):
    """Take parts of a job shared among the workers (a reconcile in parts) while any is free;
    returns how many were done here. The job's own process does the rest (see :mod:`.sharing`)."""
    return sharing.take_parts(job)


@shared_task(name="resourcesync.reconcile_set", bind=True)
def reconcile_set_task(self, set_id):
    """Compare one set with the site's data and write the missing change events (run by a
    worker, in parts that the free workers share)."""
    return _reconcile(set_id, parallel=not self.request.is_eager)


def _reconcile(set_id, *, parallel):
    resource_set = ResourceSet.objects.filter(pk=set_id).first()
    if resource_set is None:
        logger.warning("Resource set %s does not exist; nothing reconciled", set_id)
        return None
    return str(tracking.refresh(resource_set, parallel=parallel))


@shared_task(name="resourcesync.reconcile_all", bind=True)
def reconcile_all_task(self):
    """Reconcile every enabled set; a set that fails is logged and reported, the others go on."""
    summary = {}
    for resource_set in ResourceSet.objects.filter(enabled=True):
        try:
            summary[resource_set.slug] = _reconcile(resource_set.pk, parallel=not self.request.is_eager)
        except Exception as exc:
            logger.exception("Reconciling resource set %s failed", resource_set.slug)
            summary[resource_set.slug] = f"failed: {exc}"
    return summary


@shared_task(name="resourcesync.close_changelists")
def close_changelists_task():
    """Close open Change Lists whose period is over and drop those past retention (beat: hourly)."""
    for resource_set in ResourceSet.objects.filter(changelists__isnull=False).distinct():
        with tracking.locked(resource_set):
            close_due(resource_set)


@shared_task(name="resourcesync.package_changes")
def package_changes_task(set_id=None):
    """Cut a Change Dump package of the changes not yet packaged, for one set or every enabled
    set that offers Change Dumps (beat: daily, say). Returns the package numbers made."""
    sets = ResourceSet.objects.filter(enabled=True)
    if set_id is not None:
        sets = sets.filter(pk=set_id)
    made = {}
    for resource_set in sets:
        if resource_set.has_capability(capabilities.CHANGEDUMP):
            tracking.process_pending([resource_set.source])
            made[resource_set.slug] = []
            with build_lock(resource_set, capabilities.CHANGEDUMP):
                while (package := changedump.package_changes(resource_set)) is not None:
                    made[resource_set.slug].append(package.number)
    return made


@shared_task(name="resourcesync.notify", **PART_TASK)
def notify_task(set_ids=None):
    """Record the notifications due on every channel and queue their delivery, each as soon as
    it is recorded. Queued by the commits that change what channels tell of (``set_ids``: the
    sets that changed, for the log); any run also makes up for one that was lost, and queues
    deliveries left due (by a process that died, a broker that was down)."""
    if not announce.anyone_listens():
        # Nobody would be told: the channels wait (the first subscription brings them up to
        # date before it is made, see hub.verify), and this costs one query.
        return []
    made = announce.announce(on_made=_queue_deliveries)
    if hub.stale_deliveries():
        push.queue(push.DELIVER)
    return [notification.pk for notification in made]


def _queue_deliveries(notification):
    ids = list(notification.deliveries.values_list("pk", flat=True))
    if ids:
        push.queue(push.DELIVER, ids=ids)


@shared_task(name="resourcesync.deliver", **PART_TASK)
def deliver_task(ids=None):
    """Deliver notifications (``ids`` of their deliveries; every due one for ``None``); those
    that fail are attempted again later, with growing pauses."""
    return hub.deliver(ids)


@shared_task(name="resourcesync.deliver_due")
def deliver_due_task():
    """The safety net of push (beat: every minute): announce what no notify run announced (a
    notify that was lost), and deliver every notification whose next attempt is due and that no
    one is attempting, and verifies the subscription requests a process left waiting. Returns
    ``(delivered, failed for good, to retry)``."""
    announce.announce()
    if hub.stale_requests():
        push.queue(push.VERIFY)
    return hub.deliver()


@shared_task(name="resourcesync.verify_subscription")
def verify_subscription_task(request_id=None, **queued_before):
    """Verify the (un)subscription requests waiting at their callbacks, ``HUB_VERIFY_THREADS``
    at a time, and apply those confirmed (``request_id``: the request that queued it, for the
    log). A task queued by an earlier version, with the request in its arguments, verifies that."""
    if queued_before:
        return hub.verify(**queued_before)
    return hub.verify_pending()
