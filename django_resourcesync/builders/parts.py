"""Builds in parts, rendered by any number of Celery workers at once.

A Resource List past one document's limits, and a Resource Dump of more than one package, are
planned as parts before anything is rendered: ranges of the set's Resource rows by primary key,
recorded as :class:`~django_resourcesync.models.BuildPart` rows (a list's parts are
``MAX_ENTRIES_PER_DOCUMENT`` rows each; a dump's are packages, bounded by the rows' recorded
lengths too). A part reads only its range and writes its documents under the build's own names;
they are recorded, and the part marked done, in one transaction. Rendering a part again (its task
redelivered after its worker died) overwrites its files, and a part that is done is not rendered
again. When every part is done, the final step checks that each part's documents are recorded
and in storage and add up to its entries, writes the index (the list's index, the dump) over them
and publishes the build: the same atomic switch-over as a build in one process, so readers never
see an index whose parts are missing or stale.

The capability's module does the rendering: ``render_part(context, part, progress=, batch_size=)``
returns ``(documents, entries, report)``, ``part_documents(build, part)`` names a done part's
documents in groups that each hold its entries once (a list's document; a dump's package and its
manifest), ``finish(context, done)`` writes the index and returns ``(entries, completed,
report)``, and ``progress_details(entries)`` gives the progress bar's unit and note.

Run by a worker, :func:`dispatch` sends a ``resourcesync.build_part`` task per part, and the part
that finds every part done sends ``resourcesync.finish_build``. The database counts the parts
done, so no result backend is needed. In process (the command, eager mode) the same steps run
here (:func:`build_in_process`): on PostgreSQL ``BUILD_THREADS`` parts at once, elsewhere one
after the other.

The build lock taken for the build is held until the build is published or failed: the tasks
take it up by its holder, renew it while they run, and the final step (or the failure of a part)
releases it. A task that finds the lock taken by another holder (it expired while the parts
waited) fails its build rather than publish beside another one.
"""

import bisect
import logging
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed

from celery import current_app
from django.db import connections, transaction
from django.db.models import F
from django.utils import timezone

from .. import capabilities, storage, threads
from ..conf import app_settings
from ..exceptions import BuildAbandoned
from ..models import Build, BuildPart, Document
from .context import BuildContext
from .locks import build_lock

#: The tasks of a build in parts, sent by their stable names (:mod:`..tasks` defines them).
BUILD_PART = "resourcesync.build_part"
FINISH_BUILD = "resourcesync.finish_build"

logger = logging.getLogger(__name__)


class PartFailed(RuntimeError):
    """A part could not be rendered, or a done part's documents are not all there."""


def _kind(capability):
    """The module that renders parts of ``capability`` and writes its index (the capability
    table names it)."""
    return capabilities.get(capability).builder


def plan(build, rows, size, *, max_bytes=None):
    """Record the parts of ``build``: ``rows`` (a set's Resource queryset) in ranges of ``size``
    rows by primary key, fixed now so that a part is the same rows whenever it is rendered. Rows
    added later fall in a range only if their key does (they are in the changes since ``at``).
    With ``max_bytes``, a range also ends before its rows' recorded lengths would pass it (see
    :func:`_ends_by_length`); otherwise each end is found by skipping ``size`` keys in the (set,
    key) index from the one before.

    Yields each part as soon as it is recorded, so that a worker may render it while the next
    ones are planned; once the last is, the build says how many there are
    (``Build.parts_planned``), and not before may a part find the build complete."""
    ends = _ends_by_length(rows, size, max_bytes) if max_bytes is not None else _ends_by_count(rows, size)
    number, after = 0, 0
    for end in ends:
        number += 1
        yield BuildPart.objects.create(build=build, number=number, after_pk=after, last_pk=end)
        after = end
    with transaction.atomic():
        # Under the build's row, as parts record themselves done: if they all are already,
        # exactly this step knows it (``build.complete_when_planned``), and no part does.
        Build.objects.select_for_update().get(pk=build.pk)
        Build.objects.filter(pk=build.pk).update(parts_planned=number)
        build.parts_planned = number
        build.complete_when_planned = complete(build)


def _ends_by_count(rows, size):
    keys = rows.order_by("pk").values_list("pk", flat=True)
    end = None
    while found := list(keys.filter(pk__gt=end or 0)[size - 1 : size]):
        end = found[0]
        yield end
    last = keys.last()
    if last is not None and last != end:
        yield last


def complete(build):
    """Whether every part of ``build`` is planned and done (call it holding the build's row)."""
    planned = Build.objects.filter(pk=build.pk).values_list("parts_planned", flat=True).first()
    return planned is not None and BuildPart.objects.filter(build=build, done__isnull=False).count() == planned


def _ends_by_length(rows, size, max_bytes):
    """The last key of each range of at most ``size`` rows whose recorded lengths add up to at
    most ``max_bytes``, a row alone excepted (a larger file is a range of its own); a row of
    unknown length counts as none. The rule a dump's packer follows with the sizes it finds, so
    that recorded lengths that are right make one package a range; one that is wrong only makes
    the packer close a package early, within its range. One ordered pass over two columns."""
    count, total, last = 0, 0, None
    for pk, length in rows.order_by("pk").values_list("pk", "length").iterator(chunk_size=app_settings.BATCH_SIZE):
        length = length or 0
        if count and (count >= size or total + length > max_bytes):
            yield last
            count, total = 0, 0
        count, total, last = count + 1, total + length, pk
    if last is not None:
        yield last


def render(context, part, *, progress=None, batch_size=None):
    """Render ``part`` and record it done with its documents; returns whether it was the last.
    A part that fails removes the files it wrote (nothing recorded them)."""
    try:
        documents, entries, report = _kind(context.capability).render_part(
            context, part, progress=progress, batch_size=batch_size or app_settings.BATCH_SIZE
        )
    except BaseException:
        storage.delete_quietly([document.storage_name for document in context.documents])
        context.documents = []
        raise
    with transaction.atomic():
        # Parts are recorded one at a time, so exactly one of them sees every part done.
        if Build.objects.select_for_update().get(pk=context.build.pk).status != Build.Status.RUNNING:
            raise BuildAbandoned(f"{context.build} stopped while part {part.number} was rendered")
        context.save_documents()
        BuildPart.objects.filter(pk=part.pk).update(documents=documents, entries=entries, report=report, done=timezone.now())
        return complete(context.build)


def finish(context):
    """Check every part, write the index over them and publish the build."""
    build = context.build
    done = list(build.parts.order_by("number"))
    planned = Build.objects.filter(pk=build.pk).values_list("parts_planned", flat=True).first()
    if planned != len(done):
        raise PartFailed(f"{build} has {len(done)} parts recorded, {planned} planned")
    kind = _kind(context.capability)
    recorded = {document.name: document for document in Document.objects.filter(build=build)}
    files = storage.get_storage()
    for part in done:
        if part.done is None:
            raise PartFailed(f"part {part.number} of {build} is not done")
        groups = [[recorded.get(name) for name in group] for group in kind.part_documents(build, part)]
        documents = [document for group in groups for document in group]
        if (
            None in documents
            or any(len({document.entries for document in group}) != 1 for group in groups)
            or sum(group[0].entries for group in groups) != part.entries
        ):
            raise PartFailed(f"the documents recorded for part {part.number} of {build} do not hold its {part.entries} entries")
        missing = [document.storage_name for document in documents if not files.exists(document.storage_name)]
        if missing:
            raise PartFailed(f"part {part.number} of {build}: not in storage: {', '.join(missing)}")
    entries, completed, report = kind.finish(context, done)
    return context.publish(entries=entries, completed=completed, report=report, prepare=getattr(kind, "before_publish", None))


def holding(build, record_ids):
    """The numbers of the parts of ``build`` whose ranges take in any of ``record_ids``."""
    ranges = list(BuildPart.objects.filter(build=build).order_by("after_pk").values_list("number", "after_pk", "last_pk"))
    starts = [after for _number, after, _last in ranges]
    hit = set()
    for record_id in record_ids:
        index = bisect.bisect_left(starts, record_id) - 1  # the part with after_pk < id
        if index >= 0 and record_id <= ranges[index][2]:
            hit.add(ranges[index][0])
    return hit


def summed_reports(done, keys=()):
    """The reports of the parts ``done`` added up, with every one of ``keys`` (0 if none has it)."""
    total = Counter(dict.fromkeys(keys, 0))
    for part in done:
        total.update(part.report)
    return dict(total)


def build_in_process(context, planned, *, progress=None, total=None, batch_size=None):
    """Render every part here, then finish the build: ``BUILD_THREADS`` parts at once where
    :func:`_threads` allows it, else one after the other. A part's module reports
    ``progress(amount, entries)`` within the part (entries, or bytes for a dump), at least once
    it is rendered; ``progress`` hears the build's ``(capability, amount, total)``, the parts'
    amounts added up."""
    kind = _kind(context.capability)
    reached = {}  # part number: (amount, entries) it reported last
    guard = threading.Lock()

    def report():
        amount, entries = (sum(values) for values in zip(*reached.values())) if reached else (0, 0)
        progress(context.capability, amount, total, **kind.progress_details(entries))

    def reporter(part):
        if not progress:
            return None

        def part_report(amount, entries):
            with guard:  # from the threads that render parts
                reached[part.number] = amount, entries
                report()

        return part_report

    threads = min(_threads(context), len(planned))
    if threads > 1:
        _render_in_threads(context.build.pk, planned, threads, reporter, batch_size)
    else:
        for part in planned:
            render(context, part, progress=reporter(part), batch_size=batch_size)
    if progress:
        report()
    return finish(context)


def _threads(context):
    """How many threads render the parts of a build made in one process (see
    :func:`~django_resourcesync.threads.available`): each part on a connection of its own."""
    return threads.available(Build.objects.db)


def _render_in_threads(build_id, planned, threads, reporter, batch_size):
    """Render the parts ``planned`` on ``threads`` threads. Each reads the build again (its
    own set and source, no object shared) and closes its connection after each part. The first
    part that fails stops the parts not yet started; the ones running finish, then its error is
    raised (the caller fails the build, which removes what the parts recorded)."""

    def render_one(part):
        try:
            build = Build.objects.select_related("resource_set").get(pk=build_id)
            render(BuildContext(build=build), part, progress=reporter(part), batch_size=batch_size)
        finally:
            connections.close_all()  # this thread's

    with ThreadPoolExecutor(threads, thread_name_prefix="resourcesync-part") as pool:
        running = [pool.submit(render_one, part) for part in planned]
        try:
            for future in as_completed(running):
                future.result()
        except BaseException:
            for future in running:
                future.cancel()
            raise


def run(context, planned, *, parallel, lock, progress=None, total=None, batch_size=None):
    """Go on with a planned build: its parts sent to the workers with ``parallel`` (the build is
    returned running), otherwise rendered and published here."""
    if parallel:
        dispatch(context.build, planned, lock, batch_size=batch_size)
        return context.build
    return build_in_process(context, list(planned), progress=progress, total=total, batch_size=batch_size)


def dispatch(build, planned, lock, *, batch_size=None):
    """Send a task per part of ``build`` to the workers as ``planned`` yields them; ``lock``
    stays held until the build is over. Should the parts all be done before the planning is
    (a quick worker, a short last part), the final step is sent from here.

    The lock stays this process's (its heartbeat, its process id) until the plan is whole: a
    planner killed half-way leaves a build that no part can complete, and its lock is taken over
    at once by the next build, which fails it. Only then is the lock kept for the tasks."""
    try:
        for part in planned:
            current_app.tasks[BUILD_PART].delay(build.pk, part.number, lock.holder, batch_size)
        if getattr(build, "complete_when_planned", False):
            current_app.tasks[FINISH_BUILD].delay(build.pk, lock.holder)
    except BaseException:
        lock.release()
        raise
    lock.keep()


def _take_up(build, holder):
    """The build's lock, renewed; :class:`BuildAbandoned` if it went to another holder."""
    lock = build_lock(build.resource_set, build.capability, holder=holder)
    if not lock.renew():
        raise BuildAbandoned(f"the build lock of {build} was taken by another build")
    return lock


def _running(build_id, holder):
    """The build if it is running; else ``None``, and the lock its tasks held is let go (a task
    redelivered after its worker died between publishing the build and releasing the lock)."""
    build = Build.objects.select_related("resource_set").get(pk=build_id)
    if build.status != Build.Status.RUNNING:
        logger.info("%s is no longer running; nothing to do", build)
        build_lock(build.resource_set, build.capability, holder=holder).release()
        return None
    return build


def run_part(build_id, number, holder, *, batch_size=None):
    """The ``resourcesync.build_part`` task: render one part unless it is done. Returns whether
    every part is done now (the final step is due). A part started ``PART_ATTEMPTS`` times
    without finishing (its worker killed each time) fails."""
    build = _running(build_id, holder)
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
    return complete(build)


def may_retry(build_id, number):
    """Whether a part whose rendering raised may be tried again."""
    return BuildPart.objects.filter(build_id=build_id, number=number, attempts__lt=app_settings.PART_ATTEMPTS).exists()


def run_finish(build_id, holder):
    """The ``resourcesync.finish_build`` task: publish the build once every part is done. Under
    the build's row, so that a second copy of the task (a redelivered part sends one too) waits,
    then finds the build published and does nothing."""
    with transaction.atomic():
        Build.objects.select_for_update().filter(pk=build_id).first()
        build = _running(build_id, holder)
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
