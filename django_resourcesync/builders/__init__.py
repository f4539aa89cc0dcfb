"""Builders render capability documents into storage and publish them atomically.

A build writes every file of a new version under names no reader knows yet (the build's id is
part of each name), records them as :class:`~django_resourcesync.models.Document` rows, and then
switches readers over in one database transaction: the new build becomes ``published`` and the one
before it ``retired``. A reader therefore sees either the old index and old parts or the new index
and new parts, never a mixture, and a failed build leaves the published version untouched. Retired
builds stay in storage for ``KEEP_BUILDS`` generations, so a Destination that fetched an index just
before a switch-over can still fetch its parts.
"""

import datetime
import logging
import posixpath
import shutil
import tempfile
import time
import traceback
import uuid

from django.db import IntegrityError, transaction
from django.utils import timezone

from .. import storage
from ..conf import app_settings
from ..models import Build, BuildLock, Document

logger = logging.getLogger(__name__)


class BuildContext:
    """A running build: collects the files written, publishes them or cleans them up.

    ``BuildContext(build=build)`` takes up a build started elsewhere (a part rendered by a task).
    """

    def __init__(self, resource_set=None, capability=None, at=None, *, build=None):
        if build is None:
            build = Build.objects.create(resource_set=resource_set, capability=capability, at=at)
        self.build = build
        self.resource_set = build.resource_set
        self.capability = build.capability
        self.documents = []

    def take_snapshot_time(self):
        """Set the build's ``at`` to now, taken under the set's lock: a change being written
        waits until it has committed, and every change written later has a later datetime. So
        the documents plus the changes after ``at`` are the current state."""
        from ..tracking import locked

        with locked(self.resource_set):
            self.build.at = timezone.now()
        self.build.save(update_fields=["at"])

    def bring_up_to_date(self, *, refresh=True, pending=True, progress=None, batch_size=None):
        """Process the source's pending changes (unless ``pending`` is false) and reconcile the
        set (unless ``refresh`` is false), then take the snapshot time."""
        from .. import tracking

        if refresh and pending:
            tracking.process_pending([self.resource_set.source], batch_size=batch_size)
        if refresh:
            tracking.reconcile(self.resource_set, progress=progress, batch_size=batch_size)
        self.take_snapshot_time()

    def storage_name(self, name):
        return storage.storage_name(self.resource_set.slug, self.build.pk, posixpath.basename(name))

    def write(self, name, writer, *, md, links=(), at=None, completed=None, keep=None, replace=False):
        """Finish a :class:`~django_resourcesync.xml.writer.DocumentWriter` into storage as
        ``name``. ``keep``, a binary file, also receives the document (a manifest that goes into
        a package too). ``replace`` first deletes a file left under that name (by an attempt at
        a part that was killed before it recorded it), so the name stays the same."""
        with tempfile.TemporaryFile() as tmp:
            writer.finish(tmp, md=md, links=links)
            if keep is not None:
                tmp.seek(0)
                shutil.copyfileobj(tmp, keep)
            if replace:
                storage.get_storage().delete(self.storage_name(name))
            stored = storage.save(self.storage_name(name), tmp)
        return self.record(name, stored, entries=writer.count, size=writer.size, sha256=writer.sha256,
                           is_index=writer.root == "sitemapindex", at=at, completed=completed)

    def record(self, name, stored, *, entries, size, sha256, media_type="application/xml", is_index=False, at=None, completed=None):
        """Note a file written into storage as part of this build."""
        document = Document(
            build=self.build,
            resource_set=self.resource_set,
            name=name,
            storage_name=stored,
            media_type=media_type,
            is_index=is_index,
            entries=entries,
            size=size,
            sha256=sha256,
            at=at,
            completed=completed,
        )
        self.documents.append(document)
        return document

    def discard_record(self):
        """Forget the build row, keeping the files (for packages that are not replaceable builds)."""
        self.build.delete()

    def discard(self):
        """Remove the files written, those recorded by parts too."""
        storage.delete_quietly([document.storage_name for document in self.documents])
        self.documents = []
        # Their files leave storage once this commits (see signals.py).
        Document.objects.filter(build=self.build).delete()

    def save_documents(self):
        """Record the files written so far in the database (a part's, while the build runs)."""
        Document.objects.bulk_create(self.documents)
        self.documents = []

    def publish(self, *, entries, completed, report=None):
        """Switch readers over to this build, in one transaction; prune old builds after it."""
        build = self.build
        with transaction.atomic():
            if Build.objects.select_for_update().get(pk=build.pk).status != Build.Status.RUNNING:
                raise BuildAbandoned(f"{build} is no longer running; not published")
            self.save_documents()
            previous = Build.objects.select_for_update().filter(
                resource_set=self.resource_set, capability=self.capability, status=Build.Status.PUBLISHED
            )
            previous.update(status=Build.Status.RETIRED)
            build.status = Build.Status.PUBLISHED
            build.entries = entries
            build.documents = Document.objects.filter(build=build).count()
            build.completed = completed
            build.report = report or {}
            build.finished = timezone.now()
            build.save()
            stale = Build.objects.filter(
                resource_set=self.resource_set, capability=self.capability, status=Build.Status.RETIRED
            ).order_by("-pk")[app_settings.KEEP_BUILDS :]
            # Their files leave storage once this commits (see signals.py).
            Build.objects.filter(pk__in=list(stale.values_list("pk", flat=True))).delete()
        return build

    def fail(self, exc):
        """Mark the build failed and remove its files. A build that is no longer running (a
        duplicate of a part failing after another copy finished the build) is left as it is."""
        with transaction.atomic():
            if not Build.objects.select_for_update().filter(pk=self.build.pk, status=Build.Status.RUNNING).exists():
                logger.warning("Build %s is no longer running; not marked failed: %s", self.build, exc)
                return
            self.discard()
            self.build.status = Build.Status.FAILED
            self.build.error = "".join(traceback.format_exception(exc))[-10_000:]
            self.build.finished = timezone.now()
            self.build.save(update_fields=["status", "error", "finished"])
        logger.error("Build %s failed: %s", self.build, exc)


class BuildInProgress(RuntimeError):
    """Another process holds the lock for this set and capability."""


class BuildAbandoned(RuntimeError):
    """The build was failed meanwhile (a part failed, or its lock expired and went to another)."""


class build_lock:
    """``with build_lock(resource_set, capability):`` one build of it at a time, everywhere.

    Raises :class:`BuildInProgress` when another holder's lock has not expired. The lock lasts
    ``BUILD_LOCK_TIMEOUT`` seconds; :meth:`renew` extends it during a long build.

    A build whose parts go to Celery tasks outlives the ``with`` block: :meth:`keep` leaves the
    lock held on exit, and the tasks take it up with ``build_lock(..., holder=...)``, renew it
    and :meth:`release` it when the build is published or has failed. Taking the lock fails the
    parallel builds of the set and capability still marked running: their holder is gone.
    """

    def __init__(self, resource_set, capability, holder=None):
        self.resource_set, self.capability = resource_set, capability
        self.holder = holder or uuid.uuid4().hex
        self.kept = False

    def _expiry(self):
        return timezone.now() + datetime.timedelta(seconds=app_settings.BUILD_LOCK_TIMEOUT)

    def __enter__(self):
        locks = BuildLock.objects.filter(resource_set=self.resource_set, capability=self.capability)
        # Take over an expired lock, or create one; a live lock of someone else's stands.
        taken = locks.filter(expires__lt=timezone.now()).update(holder=self.holder, expires=self._expiry())
        if not taken:
            try:
                with transaction.atomic():
                    BuildLock.objects.create(
                        resource_set=self.resource_set, capability=self.capability, holder=self.holder, expires=self._expiry()
                    )
            except IntegrityError:
                raise BuildInProgress(f"a {self.capability} build of {self.resource_set.slug} is already running") from None
        self._fail_abandoned()
        return self

    def _fail_abandoned(self):
        abandoned = Build.objects.filter(
            resource_set=self.resource_set, capability=self.capability, status=Build.Status.RUNNING, parts__isnull=False
        ).distinct()
        for build in abandoned:
            BuildContext(build=build).fail(BuildAbandoned("its build lock expired before it was published"))

    def _mine(self):
        return BuildLock.objects.filter(resource_set=self.resource_set, capability=self.capability, holder=self.holder)

    def renew(self):
        """Extend the lock; false if it is not this holder's any more (it expired and was taken)."""
        return bool(self._mine().update(expires=self._expiry()))

    def renewing(self, progress=None):
        """A progress callback that also keeps the lock alive while a build runs."""
        last = [time.monotonic()]

        def report(*args, **kwargs):
            if time.monotonic() - last[0] > 30:
                self.renew()
                last[0] = time.monotonic()
            if progress:
                progress(*args, **kwargs)

        return report

    def keep(self):
        """Leave the lock held when the ``with`` block ends: tasks go on with the build."""
        self.kept = True

    def release(self):
        self._mine().delete()

    def __exit__(self, *exc_info):
        if not self.kept:
            self.release()
        return False


def current_build(resource_set, capability):
    return (
        Build.objects.filter(resource_set=resource_set, capability=capability, status=Build.Status.PUBLISHED)
        .order_by("-pk")
        .first()
    )
