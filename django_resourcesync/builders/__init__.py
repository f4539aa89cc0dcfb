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
import traceback
import uuid

from django.db import IntegrityError, transaction
from django.utils import timezone

from .. import storage
from ..conf import app_settings
from ..models import Build, BuildLock, Document

logger = logging.getLogger(__name__)


class BuildContext:
    """A running build: collects the files written, publishes them or cleans them up."""

    def __init__(self, resource_set, capability, at):
        self.resource_set = resource_set
        self.capability = capability
        self.build = Build.objects.create(resource_set=resource_set, capability=capability, at=at)
        self.documents = []

    def take_snapshot_time(self):
        """Set the build's ``at`` to now, taken under the set's lock: a change being written
        waits until it has committed, and every change written later has a later datetime. So
        the documents plus the changes after ``at`` are the current state."""
        from ..tracking import locked

        with locked(self.resource_set):
            self.build.at = timezone.now()
        self.build.save(update_fields=["at"])

    def storage_name(self, name):
        return storage.storage_name(self.resource_set.slug, self.build.pk, posixpath.basename(name))

    def write(self, name, writer, *, md, links=(), at=None, completed=None, keep=None):
        """Finish a :class:`~django_resourcesync.xml.writer.DocumentWriter` into storage as
        ``name``. ``keep``, a binary file, also receives the document (a manifest that goes into
        a package too)."""
        with tempfile.TemporaryFile() as tmp:
            writer.finish(tmp, md=md, links=links)
            if keep is not None:
                tmp.seek(0)
                shutil.copyfileobj(tmp, keep)
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
        storage.delete_quietly([document.storage_name for document in self.documents])
        self.documents = []

    def publish(self, *, entries, completed, report=None):
        """Switch readers over to this build, in one transaction; prune old builds after it."""
        build = self.build
        with transaction.atomic():
            Document.objects.bulk_create(self.documents)
            previous = Build.objects.select_for_update().filter(
                resource_set=self.resource_set, capability=self.capability, status=Build.Status.PUBLISHED
            )
            previous.update(status=Build.Status.RETIRED)
            build.status = Build.Status.PUBLISHED
            build.entries = entries
            build.documents = len(self.documents)
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
        self.discard()
        self.build.status = Build.Status.FAILED
        self.build.error = "".join(traceback.format_exception(exc))[-10_000:]
        self.build.finished = timezone.now()
        self.build.save(update_fields=["status", "error", "finished"])
        logger.error("Build %s failed: %s", self.build, exc)


class BuildInProgress(RuntimeError):
    """Another process holds the lock for this set and capability."""


class build_lock:
    """``with build_lock(resource_set, capability):`` one build of it at a time, everywhere.

    Raises :class:`BuildInProgress` when another holder's lock has not expired. The lock lasts
    ``BUILD_LOCK_TIMEOUT`` seconds; :meth:`renew` extends it during a long build.
    """

    def __init__(self, resource_set, capability):
        self.resource_set, self.capability = resource_set, capability
        self.holder = uuid.uuid4().hex

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
        return self

    def renew(self):
        BuildLock.objects.filter(resource_set=self.resource_set, capability=self.capability, holder=self.holder).update(
            expires=self._expiry()
        )

    def __exit__(self, *exc_info):
        BuildLock.objects.filter(resource_set=self.resource_set, capability=self.capability, holder=self.holder).delete()
        return False


def current_build(resource_set, capability):
    return (
        Build.objects.filter(resource_set=resource_set, capability=capability, status=Build.Status.PUBLISHED)
        .order_by("-pk")
        .first()
    )
