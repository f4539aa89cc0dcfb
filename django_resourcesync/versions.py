"""The version store: the bytes each change left, kept by their sha-256.

When change tracking processes a change of a resource whose set offers a Change Dump or publishes
prior versions (:func:`keeps`), it reads the
resource's bytes once: it hashes them for the change event and, on the way, writes them into the
documents' storage under ``<STORAGE_PREFIX>/versions/<sha-256>`` (split in two folder levels). Bytes
are content-addressed: a thousand changes that leave the same bytes share one copy, and a file
written again with the bytes it had costs nothing. A copy, never a link to the site's file: a file
written over in place (by a script, behind the app's back) must not change the bytes kept of the
changes before. Change Dump packages are packed from here, so each change's bitstream is the state that change
left, whatever the resource became since.

Bytes are kept while a change event refers to them (events go with their Change List, after
``CHANGELIST_RETENTION``), then :func:`collect` removes them. ``KEEP_VERSIONS`` turns the store off.
The store itself is not served: packages are packed from it, and the mementos of a set that
publishes prior versions (:mod:`django_resourcesync.mementos`) are served from it while their
resource is in the set; what leaves a set is withdrawn from both, and its bytes forgotten.
"""

import contextlib
import datetime
import hashlib
import logging
import os
import posixpath
import tempfile

from django.core.files import File
from django.core.files.storage import FileSystemStorage
from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Sum
from django.utils import timezone

from . import bulk, storage, streaming
from .conf import app_settings
from .entries import Representation, normalise_media_type
from .exceptions import UnpublishableResource
from .models import ChangeEvent, Resource, Version

logger = logging.getLogger(__name__)

FOLDER = "versions"


class StoreUnavailable(RuntimeError):
    """The version store could not be written (a full disk, a storage outage): the change is
    not processed now, and nothing is lost (it is tried again)."""


def name_of(sha256):
    return storage.storage_name(FOLDER, sha256[:2], sha256[2:4], sha256)


def keeps(resource_set):
    """Whether changes of the set keep their bytes: the store is on, the set offers a Change
    Dump or publishes prior versions, and its source gives bytes."""
    from .capabilities import CHANGEDUMP  # the capability table imports the builders

    wanted = resource_set.has_capability(CHANGEDUMP) or resource_set.prior_versions
    return bool(app_settings.KEEP_VERSIONS) and wanted and resource_set.get_source().gives_bytes


def held(resource_set):
    """What the store holds for the set's changes: ``{"versions", "bytes", "changes"}`` (a
    version shared with another set counts for both), or ``None`` if the set keeps none."""
    if not keeps(resource_set):
        return None
    digests = ChangeEvent.objects.filter(resource_set=resource_set).exclude(sha256="").values("sha256")
    kept = Version.objects.filter(sha256__in=digests).aggregate(versions=Count("pk"), bytes=Sum("length"))
    changes = ChangeEvent.objects.filter(resource_set=resource_set, sha256__in=Version.objects.values("sha256")).count()
    return {"versions": kept["versions"], "bytes": kept["bytes"] or 0, "changes": changes}


def publishes(resource_set):
    """Whether the set publishes prior versions (mementos, TimeMaps, TimeGates)."""
    return resource_set.prior_versions and keeps(resource_set)


def keep(chunks, media_type=None, *, unless=None):
    """Read ``chunks`` once, hashing them and writing them into the store (unless their sha-256
    is ``unless``: bytes that did not change); returns their
    :class:`~django_resourcesync.entries.Representation`. Raises ``UnpublishableResource`` if
    they cannot be read, :class:`StoreUnavailable` if they cannot be kept. Call :func:`record`
    in the transaction of the change events that refer to them."""
    store = storage.get_storage()
    md5, sha256, length = hashlib.md5(), hashlib.sha256(), 0
    with _spool(store) as (spool, place):
        while True:
            try:
                chunk = next(chunks, None)
            except OSError as exc:
                raise UnpublishableResource(f"cannot read the bytes: {exc}") from exc
            if chunk is None:
                break
            md5.update(chunk)
            sha256.update(chunk)
            length += len(chunk)
            try:
                spool.write(chunk)
            except OSError as exc:
                raise StoreUnavailable(f"cannot write into the version store: {exc}") from exc
        digest = sha256.hexdigest()
        try:
            if digest != unless:
                # Marked as used, in the caller's transaction, before they are placed: a
                # collection that has not taken them yet leaves them alone (see collect()).
                claimed = Version.objects.filter(sha256=digest).update(last_used=timezone.now())
                place(name_of(digest), claimed)
        except Exception as exc:
            raise StoreUnavailable(f"cannot write into the version store: {exc}") from exc
    return Representation(md5.hexdigest(), digest, length, normalise_media_type(media_type))


@contextlib.contextmanager
def _spool(store):
    """``(file, place)``: a file to write the bytes into, and ``place(name)`` to store them
    under ``name`` once written. On the local filesystem the file is made beside the store
    and renamed into place (atomic, no second copy); elsewhere it is uploaded."""
    if isinstance(store, FileSystemStorage):
        folder = store.path(storage.storage_name(FOLDER, "tmp"))
        try:
            os.makedirs(folder, exist_ok=True)
            spool = tempfile.NamedTemporaryFile(dir=folder, delete=False)
        except OSError as exc:
            raise StoreUnavailable(f"cannot write into the version store: {exc}") from exc

        def place(name, claimed):
            # Placed whether they are there or not (a rename costs nothing): a version whose
            # file was lost is whole again.
            spool.flush()
            target = store.path(name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.chmod(spool.name, 0o644)
            os.replace(spool.name, target)  # the same bytes, if they were there already

        try:
            yield spool, place
        finally:
            spool.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(spool.name)
        return

    with tempfile.TemporaryFile() as spool:

        def place(name, claimed):
            if store.exists(name):
                if claimed:
                    return  # kept, and now safe from collection until this transaction ends
                store.delete(name)  # left by a batch that failed, or by a collection: ours replaces it
            spool.seek(0)
            saved = store.save(name, File(spool, name=posixpath.basename(name)))
            if saved != name:  # another process stored them meanwhile: theirs is the copy
                store.delete(saved)

        yield spool, place


def record(kept, now=None):
    """Note in the database that the bytes ``{sha256: length}`` are kept and were just used.
    Call it in the transaction that writes the change events referring to them."""
    if not kept:
        return
    now = now or timezone.now()
    Version.objects.bulk_create(
        [Version(sha256=digest, storage_name=name_of(digest), length=length, created=now, last_used=now)
         for digest, length in sorted(kept.items())],
        update_conflicts=True, unique_fields=["sha256"], update_fields=["last_used"],
    )


def stored(digests, now=None):
    """Which of ``digests`` the store holds; marks them used now (so :func:`collect` leaves
    them alone while the events that refer to them are being written)."""
    digests = set(filter(None, digests))
    if not digests:
        return set()
    found = Version.objects.filter(sha256__in=sorted(digests))
    found.update(last_used=now or timezone.now())
    return set(found.values_list("sha256", flat=True))


def open_bytes(sha256):
    """``(chunks, length)`` of the kept bytes ``sha256``, or ``None`` if the store has none
    (or lost them). ``chunks`` reads the stored file when the first chunk is wanted, a chunk
    at a time, from S3 too (:func:`.streaming.read_span`): a memento of any size is served,
    and packed, in flat memory."""
    version = Version.objects.filter(sha256=sha256).values_list("storage_name", "length").first()
    if version is None:
        return None
    name, length = version
    store = storage.get_storage()
    # Any error but a missing file (the storage is down) fails the package being cut, which is
    # cut again, or the request.
    if not store.exists(name):
        logger.error("The version store has lost %s (%s)", sha256, name)
        return None
    return streaming.read_span(store, name, 0, length - 1), length


def collect(*, grace=None, now=None, batch_size=1000):
    """Remove the kept bytes no change event refers to any more, unused for ``grace`` seconds
    (``SWEEP_GRACE_SECONDS``): a change being processed marks the bytes it refers to as used.
    Returns how many were removed."""
    now = now or timezone.now()
    grace = app_settings.SWEEP_GRACE_SECONDS if grace is None else grace
    cutoff = now - datetime.timedelta(seconds=grace)
    removed = 0
    while True:
        with transaction.atomic():
            # Locked, skipping those a processing run is marking as used right now.
            unused = list(
                Version.objects.select_for_update(skip_locked=True)
                .filter(last_used__lt=cutoff)
                .filter(~Exists(ChangeEvent.objects.filter(sha256=OuterRef("sha256"))))
                .order_by("pk")
                .values_list("pk", "storage_name")[:batch_size]
            )
            if not unused:
                return removed
            # The files go first, while the rows are locked: once this commits no deletion is
            # left to come, so bytes kept again meanwhile (whoever waited for these rows) stay.
            storage.delete_quietly([name for _pk, name in unused])
            Version.objects.filter(pk__in=[pk for pk, _name in unused]).delete()
        removed += len(unused)


def forget_withdrawn(resource_set, keys, in_use=()):
    """Remove the kept bytes of the changes of resources that have just left the set (made
    private, deleted), unless they are also the bytes of a change of a resource still listed
    (another object, or this one in another set) or of a change being written now (``in_use``):
    their mementos are no longer served, and the files must not outlive what may be shown (a
    public bucket, say). Called under the set's lock, in the transaction of their deletion."""
    events = bulk.filter_in(ChangeEvent.objects.filter(resource_set=resource_set).exclude(sha256=""), "object_pk", keys)
    digests = set(events.values_list("sha256", flat=True))
    if not digests:
        return 0
    leaving = {str(key) for key in keys}
    listed = Resource.objects.filter(resource_set=OuterRef("resource_set"), object_pk=OuterRef("object_pk"))
    referring = (
        ChangeEvent.objects.filter(sha256__in=sorted(digests)).filter(Exists(listed))
        .values_list("sha256", "resource_set_id", "object_pk")
    )
    shared = {digest for digest, set_id, key in referring.iterator() if set_id != resource_set.pk or key not in leaving}
    shared |= set(in_use)
    gone = list(
        Version.objects.select_for_update(skip_locked=True)
        .filter(sha256__in=sorted(digests - shared))
        .values_list("pk", "storage_name")
    )
    storage.delete_quietly([name for _pk, name in gone])
    Version.objects.filter(pk__in=[pk for pk, _name in gone]).delete()
    return len(gone)
