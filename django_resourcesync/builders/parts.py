"""Builds in parts, rendered by any number of Celery workers at once.

A Resource List past one document's limits is planned as parts before anything is rendered:
ranges of the set's Resource rows by primary key, ``MAX_ENTRIES_PER_DOCUMENT`` rows each,
recorded as :class:`~django_resourcesync.models.BuildPart` rows. A part reads only its range and
writes its documents under the build's own names; they are recorded, and the part marked done,
in one transaction. Rendering a part again (its task redelivered after its worker died)
overwrites its files, and a part that is done is not rendered again. When every part is done,
the final step checks that each part's documents are recorded and in storage and add up to its
entries, writes the index over them and publishes the build: the same atomic switch-over as a
build in one process, so readers never see an index whose parts are missing or stale.

Run by a worker, :func:`dispatch` sends a ``resourcesync.build_part`` task per part, and the part
that finds every part done sends ``resourcesync.finish_build``. The database counts the parts
done, so no result backend is needed. In process (the command, eager mode) the same steps run
one after the other (:func:`build_in_process`).

The build lock taken for the build is held until the build is published or failed: the tasks
take it up by its holder, renew it while they run, and the final step (or the failure of a part)
releases it. A task that finds the lock taken by another holder (it expired while the parts
waited) fails its build rather than publish beside another one.
"""

import logging

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from .. import capabilities, storage
from ..conf import app_settings
from ..models import Build, BuildPart, Document
from . import BuildAbandoned, BuildContext, build_lock

logger = logging.getLogger(__name__)


class PartFailed(RuntimeError):
    """A part could not be rendered, or a done part's documents are not all there."""


def _kind(capability):
    """The module that renders parts of ``capability`` and writes its index."""
    from . import resourcelist

    return {capabilities.RESOURCELIST: resourcelist}[capability]


def plan(build, rows, size):
    """Record the parts of ``build``: ``rows`` (a set's Resource queryset) in ranges of ``size``
    rows by primary key, fixed now so that a part is the same rows whenever it is rendered. Rows
    added later fall in a range only if their key does (they are in the changes since ``at``).
    Each end is found by skipping ``size`` keys in the (set, key) index from the one before."""
    keys = rows.order_by("pk").values_list("pk", flat=True)
    ends = []
    while end := list(keys.filter(pk__gt=ends[-1] if ends else 0)[size - 1 : size]):
        ends += end
    last = keys.last()
    if last is not None and last not in ends[-1:]:
        ends.append(last)
    return BuildPart.objects.bulk_create(
        BuildPart(build=build, number=number, after_pk=after, last_pk=end)
        for number, (after, end) in enumerate(zip([0, *ends], ends), start=1)
    )


def render(context, part, *, progress=None, batch_size=None):
    """Render ``part`` and record it done with its documents; returns whether it was the last."""
    documents, entries = _kind(context.capability).render_part(
        context, part, progress=progress, batch_size=batch_size or app_settings.BATCH_SIZE
    )
    with transaction.atomic():
        # Parts are recorded one at a time, so exactly one of them sees every part done.
        if Build.objects.select_for_update().get(pk=context.build.pk).status != Build.Status.RUNNING:
            raise BuildAbandoned(f"{context.build} stopped while part {part.number} was rendered")
        context.save_documents()
        BuildPart.objects.filter(pk=part.pk).update(documents=documents, entries=entries, done=timezone.now())
        return not BuildPart.objects.filter(build=context.build, done__isnull=True).exists()


def finish(context):
    """Check every part, write the index over them and publish the build."""
    build = context.build
    done = list(build.parts.order_by("number"))
    kind = _kind(context.capability)
    recorded = {document.name: document for document in Document.objects.filter(build=build)}
    files = storage.get_storage()
    for part in done:
        if part.done is None:
            raise PartFailed(f"part {part.number} of {build} is not done")
        documents = [recorded.get(name) for name in kind.part_documents(build, part)]
        if None in documents or sum(document.entries for document in documents) != part.entries:
            raise PartFailed(f"the documents recorded for part {part.number} of {build} do not hold its {part.entries} entries")
        missing = [document.storage_name for document in documents if not files.exists(document.storage_name)]
        if missing:
            raise PartFailed(f"part {part.number} of {build}: not in storage: {', '.join(missing)}")
    entries, completed, report = kind.finish(context, done)
    return context.publish(entries=entries, completed=completed, report=report)


def build_in_process(context, planned, *, progress=None, total=None, batch_size=None):
    """Render every part here, one after the other, then finish the build."""
    rendered = 0
    for part in planned:
        report = (lambda count, before=rendered: progress(context.capability, before + count, total)) if progress else None
        render(context, part, progress=report, batch_size=batch_size)
        rendered += BuildPart.objects.get(pk=part.pk).entries
    if progress:
        progress(context.capability, rendered, total)
    return finish(context)


def dispatch(build, lock, *, batch_size=None):
    """Send a task per part of ``build`` to the workers; ``lock`` stays held until it is over."""
    from ..tasks import build_part_task

    lock.keep()
    try:
        for part in build.parts.order_by("number"):
            build_part_task.delay(build.pk, part.number, lock.holder, batch_size)
    except BaseException:
        lock.release()
        raise


def _take_up(build, holder):
    """The build's lock, renewed; :class:`BuildAbandoned` if it went to another holder."""
    lock = build_lock(build.resource_set, build.capability, holder=holder)
    if not lock.renew():
        raise BuildAbandoned(f"the build lock of {build} was taken by another build")
    return lock


def _running(build_id):
    build = Build.objects.select_related("resource_set").get(pk=build_id)
    if build.status != Build.Status.RUNNING:
        logger.info("%s is no longer running; nothing to do", build)
        return None
    return build


def run_part(build_id, number, holder, *, batch_size=None):
    """The ``resourcesync.build_part`` task: render one part unless it is done. Returns whether
    every part is done now (the final step is due). A part started ``PART_ATTEMPTS`` times
    without finishing (its worker killed each time) fails."""
    build = _running(build_id)
    if build is None:
        return False
    lock = _take_up(build, holder)
    part = build.parts.get(number=number)
    if part.done is None:
        if part.attempts >= app_settings.PART_ATTEMPTS:
            raise PartFailed(f"part {number} of {build} was started {part.attempts} times without finishing")
        BuildPart.objects.filter(pk=part.pk).update(attempts=F("attempts") + 1)
        return render(BuildContext(build=build), part, progress=lock.renewing(), batch_size=batch_size)
    # A copy of a task that finished (redelivered): the final step may not have been sent.
    return not build.parts.filter(done__isnull=True).exists()


def may_retry(build_id, number):
    """Whether a part whose rendering raised may be tried again."""
    return BuildPart.objects.filter(build_id=build_id, number=number, attempts__lt=app_settings.PART_ATTEMPTS).exists()


def run_finish(build_id, holder):
    """The ``resourcesync.finish_build`` task: publish the build once every part is done."""
    build = _running(build_id)
    if build is None:
        return None
    lock = _take_up(build, holder)
    published = finish(BuildContext(build=build))
    lock.release()
    return published


def fail(build_id, holder, exc):
    """Mark the build failed (nothing published; what was published before stays) and release
    its lock."""
    build = Build.objects.select_related("resource_set").get(pk=build_id)
    BuildContext(build=build).fail(exc)
    build_lock(build.resource_set, build.capability, holder=holder).release()
