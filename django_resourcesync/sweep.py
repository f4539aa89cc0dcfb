"""The storage sweep: no file stays in storage that no record refers to.

Every file the app writes is recorded (a build's documents, a closed Change List, a Change Dump
package) or belongs to a build that is still running. A process killed half-way through a write,
a full disk or a storage error can leave a file behind that nothing records; so can a deletion
whose files could not be removed. :func:`sweep` walks the app's folder of the storage and deletes
every file that no record refers to, that no running build may still record, and that is older
than ``SWEEP_GRACE_SECONDS`` (a file being written now, whose record is about to be written, is
younger than that). It also fails the builds left running by a process that is gone, forgets
withdrawals no build needs any more, and collects the kept bytes of changes no event refers to
any more (:func:`django_resourcesync.versions.collect`), forgets old notifications and
subscriptions whose lease is over (:func:`django_resourcesync.push.announce.prune`), and the
parts of shared jobs whose process died (:func:`django_resourcesync.sharing.forget_abandoned`).

``resourcesync_rebuild`` sweeps after it has built; the ``resourcesync.sweep_storage`` task does
it on a schedule (see docs/schedules.rst).
"""

import datetime
import logging
import posixpath
from dataclasses import dataclass

from django.utils import timezone

from . import sharing, storage, versions
from .builders.context import BuildContext
from .builders.locks import build_lock as lock_of
from .builders.withdrawal import HOLDING
from .conf import app_settings
from .exceptions import BuildAbandoned
from .models import Build, BuildLock, ChangeDumpPackage, ChangeList, Document, Version, Withdrawal
from .push import announce

logger = logging.getLogger(__name__)


@dataclass
class SweepCounts:
    files: int = 0
    deleted: int = 0
    failed_builds: int = 0
    withdrawals: int = 0
    versions: int = 0
    notifications: int = 0

    def __str__(self):
        return (
            f"{self.deleted} of {self.files} stored file(s) deleted, {self.failed_builds} abandoned build(s) failed, "
            f"{self.versions} unused version(s) collected, {self.notifications} old notification(s) forgotten"
        )


def referenced():
    """The storage names every record refers to (what is withdrawn is not among them)."""
    names = set(Document.objects.filter(withdrawn__isnull=True).values_list("storage_name", flat=True))
    names.update(ChangeList.objects.exclude(storage_name="").values_list("storage_name", flat=True))
    for package, manifest in ChangeDumpPackage.objects.filter(withdrawn__isnull=True).values_list(
        "storage_name", "manifest_storage_name"
    ):
        names.update((package, manifest))
    names.update(Version.objects.values_list("storage_name", flat=True))
    return names


def stored_files(prefix):
    """Every file name under ``prefix`` in the documents' storage, walked folder by folder."""
    store = storage.get_storage()
    folders = [prefix]
    while folders:
        folder = folders.pop()
        try:
            subfolders, files = store.listdir(folder)
        except FileNotFoundError:
            continue
        folders.extend(posixpath.join(folder, name) for name in subfolders)
        for name in files:
            yield posixpath.join(folder, name)


def fail_abandoned_builds():
    """Fail the running builds whose lock is gone or whose holder died; returns how many."""
    failed = 0
    for build in Build.objects.filter(status=Build.Status.RUNNING).select_related("resource_set"):
        held = BuildLock.objects.filter(resource_set=build.resource_set, capability=build.capability).first()
        if held is not None and not lock_of.is_dead(held):
            continue
        BuildContext(build=build).fail(BuildAbandoned("its process stopped, and no lock was held for it any more"))
        failed += 1
    return failed


def sweep(*, grace=None, now=None):
    """Delete the files in the app's storage folder that no record refers to; returns counts."""
    now = now or timezone.now()
    grace = app_settings.SWEEP_GRACE_SECONDS if grace is None else grace
    counts = SweepCounts()
    counts.failed_builds = fail_abandoned_builds()
    counts.versions = versions.collect(grace=grace, now=now)
    running = Build.objects.filter(status=Build.Status.RUNNING).values_list("resource_set__slug", "pk")
    protected = tuple(storage.storage_name(slug, pk) + "/" for slug, pk in running)
    known = referenced()
    store = storage.get_storage()
    cutoff = now - datetime.timedelta(seconds=grace)
    for name in stored_files(app_settings.STORAGE_PREFIX):
        counts.files += 1
        if name in known or name.startswith(protected):
            continue
        try:
            if grace and store.get_modified_time(name) > cutoff:
                continue
        except (OSError, NotImplementedError):
            continue  # gone meanwhile, or a storage that cannot tell: left for now
        logger.info("Removing %s from storage: no record refers to it", name)
        storage.delete_quietly([name])
        counts.deleted += 1
    counts.withdrawals = prune_withdrawals(cutoff)
    sharing.forget_abandoned(now - datetime.timedelta(seconds=max(grace, 10 * app_settings.PART_TIMEOUT)))
    counts.notifications = announce.prune(now)
    return counts


def prune_withdrawals(before):
    """Forget withdrawals older than ``before`` that no running build can still need."""
    running = (
        Build.objects.filter(status=Build.Status.RUNNING, capability__in=HOLDING)
        .order_by("started")
        .values_list("started", flat=True)
        .first()
    )
    cutoff = min(before, running) if running else before
    return Withdrawal.objects.filter(at__lt=cutoff).delete()[0]
