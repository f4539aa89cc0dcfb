"""Jobs shared among the workers: a long pass over a set cut into parts any worker may take.

The process that runs the job (a ``resourcesync.rebuild_set`` task on a worker, say) records
its parts as :class:`~django_resourcesync.models.SharedPart` rows, sends one
``resourcesync.share_job`` task per part but its own, and then takes parts itself until none is
left. Each worker that receives a task takes parts the same way, so two free workers do the job
in about half the time, and a job whose helpers never come (every other worker busy, the broker
down) is done by its own process alone: it never waits on work nobody took.

A part is claimed by an atomic update (any database); its holder renews ``heartbeat`` while it
works. A part whose holder has been silent for ``PART_TIMEOUT`` seconds (its worker killed) is
claimed again by the next process that looks, and the job's own process keeps looking until
every part is done; a part started ``PART_ATTEMPTS`` times without finishing fails the job, as
does a part that raises. Parts must therefore be safe to run twice: a reconcile of a key range
is (it writes what differs from the record, under the set's lock).

A kind of part is a function ``work(resource_set, options, beat)`` registered with
:func:`kind`, returning a dict of counts (summed over the parts); ``beat()`` says the holder is
alive (call it every batch).
"""

import logging
import os
import socket
import time
import uuid
from collections import Counter
from datetime import timedelta

from celery import current_app
from django.db.models import F, Q
from django.utils import timezone

from .conf import app_settings
from .models import ResourceSet, SharedPart

logger = logging.getLogger(__name__)

#: The task that takes parts of a job (:mod:`.tasks` defines it).
SHARE_JOB = "resourcesync.share_job"

_KINDS = {}


class JobFailed(RuntimeError):
    """A part of a shared job raised, or was started too often without finishing."""


def kind(name):
    """Register ``work(resource_set, options, beat) -> dict`` as the parts of jobs ``name``."""

    def register(work):
        _KINDS[name] = work
        return work

    return register


def _holder():
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def run(resource_set, name, options, *, parallel, progress=None, wait=0.2, meanwhile=None):
    """Do the job ``name`` whose parts are ``options`` (one dict each) over ``resource_set``;
    returns the parts' results summed. With ``parallel``, the parts are offered to the workers
    as well; otherwise they are done here, one after the other, without a row recorded.
    ``meanwhile`` is as for :func:`join` (never called without ``parallel``)."""
    work = _KINDS[name]
    if not parallel or len(options) < 2:
        total = Counter()
        for part in options:
            total.update(work(resource_set, part, lambda: None))
        return dict(total)
    job = offer(resource_set, name, options, helpers=len(options) - 1)
    try:
        return join(job, progress=progress, wait=wait, meanwhile=meanwhile)
    finally:
        end(job)


def offer(resource_set, name, options, *, helpers):
    """Record the parts ``options`` of a job ``name`` over ``resource_set`` and send ``helpers``
    ``resourcesync.share_job`` tasks for the workers to take them; returns the job's id. The
    caller sees it through: :func:`join` (or :func:`ready` part by part), then :func:`end`."""
    job = uuid.uuid4().hex
    SharedPart.objects.bulk_create(
        [SharedPart(job=job, kind=name, resource_set=resource_set, number=number, options=part)
         for number, part in enumerate(options, 1)]
    )
    try:
        for _ in range(helpers):
            current_app.tasks[SHARE_JOB].delay(job)
    except Exception:  # the broker is down: the job is done by its own process alone
        logger.warning("Job %s of set %s: its parts could not be offered to the workers; done here",
                       name, resource_set.slug, exc_info=True)
    return job


def ready(job, numbers, *, wait=0.05):
    """Have the parts ``numbers`` of ``job`` done: those nobody holds (or whose holder went
    silent) here, then wait for the others, doing meanwhile any other part that is free, one at
    a time (it needs doing anyway: the time is not lost); returns the numbers of those that
    failed (the caller does without them). Its claims commit at once: call it outside a
    transaction, or a worker claiming the same part would wait for that transaction's end."""
    holder = _holder()
    numbers = sorted(numbers)
    while True:
        take_parts(job, holder, numbers=numbers)
        parts = list(SharedPart.objects.filter(job=job, number__in=numbers).values_list("number", "done", "error"))
        if all(done for _number, done, _error in parts):
            return [number for number, _done, error in parts if error]
        if not take_parts(job, holder, most=1):
            time.sleep(wait)


def end(job):
    """Forget the parts of ``job`` (a part still held is left to finish; its result goes nowhere)."""
    SharedPart.objects.filter(job=job).delete()


def join(job, *, progress=None, wait=0.2, meanwhile=None):
    """Take parts of ``job`` until none is free, then wait for those others hold (taking back
    any whose holder went silent) until every part is done; returns the results summed (``{}``
    if the job is over meanwhile). Raises :class:`JobFailed` if a part failed.

    ``meanwhile``, a callable, is called once, the first time every part left is held by
    others: the job's own work that needs no part (the caller does it after the job where it
    was not called: the parts were all done here, or none was left for others). It is looked
    again often at first, then less (at most every ``wait`` seconds): the last part another
    worker holds usually ends soon, and every moment this process sleeps past its end is
    added to the job."""
    holder = _holder()
    waiting_since = None
    while True:
        take_parts(job, holder)
        parts = list(SharedPart.objects.filter(job=job).values("kind", "resource_set__slug", "done", "error", "result"))
        if progress and parts:
            progress(sum(1 for part in parts if part["done"]), len(parts))
        failed = [part for part in parts if part["error"]]
        if failed:
            raise JobFailed(f"{failed[0]['kind']} of set {failed[0]['resource_set__slug']}: {failed[0]['error']}")
        if all(part["done"] for part in parts):
            total = Counter()
            for part in parts:
                total.update(part["result"])
            return dict(total)
        # Parts other workers hold; one whose worker died is taken back above.
        if meanwhile is not None:
            meanwhile()
            meanwhile = None
            continue  # the others may be done by now
        now = time.monotonic()
        waiting_since = waiting_since or now
        time.sleep(min(wait, 0.01 + (now - waiting_since) / 20))


def running(resource_set, name):
    """The job ``name`` of ``resource_set`` that another process is running, if any (its parts
    not all done)."""
    unfinished = SharedPart.objects.filter(resource_set=resource_set, kind=name, done__isnull=True)
    return unfinished.values_list("job", flat=True).first()


def take_parts(job, holder=None, *, numbers=None, most=None):
    """Do parts of ``job`` (of those ``numbers``, if given; ``most`` of them at most) while any
    is free (unclaimed, or its holder silent for ``PART_TIMEOUT``); returns how many were done
    here. The ``resourcesync.share_job`` task."""
    holder = holder or _holder()
    done = 0
    while (most is None or done < most) and (part := _claim(job, holder, numbers)) is not None:
        if part.attempts > app_settings.PART_ATTEMPTS:
            _settle(part, holder, error=f"part {part.number} was started {part.attempts - 1} times without finishing")
            return done
        resource_set = ResourceSet.objects.get(pk=part.resource_set_id)

        def beat(part=part):
            SharedPart.objects.filter(pk=part.pk, holder=holder).update(heartbeat=timezone.now())

        try:
            result = _KINDS[part.kind](resource_set, part.options, beat)
        except Exception as exc:
            logger.exception("Part %s of %s failed", part.number, part.kind)
            _settle(part, holder, error=f"part {part.number}: {type(exc).__name__}: {exc}"[:2000])
            return done
        _settle(part, holder, result=result)
        done += 1
    return done


def _claim(job, holder, numbers=None):
    """A free part of ``job`` (of ``numbers``, if given), claimed for ``holder`` (its
    ``attempts`` counted), or ``None``."""
    now = timezone.now()
    silent = now - timedelta(seconds=app_settings.PART_TIMEOUT)
    free = SharedPart.objects.filter(job=job, done__isnull=True).filter(Q(holder="") | Q(heartbeat__lt=silent))
    if numbers is not None:
        free = free.filter(number__in=numbers)
    for pk, was, heartbeat in free.order_by("number").values_list("pk", "holder", "heartbeat")[:8]:
        # Claimed only if nobody claimed it since it was read.
        claimed = SharedPart.objects.filter(pk=pk, holder=was, done__isnull=True)
        claimed = claimed.filter(heartbeat=heartbeat) if heartbeat is not None else claimed.filter(heartbeat__isnull=True)
        if claimed.update(holder=holder, heartbeat=now, attempts=F("attempts") + 1):
            if was:
                logger.warning("Part %s of job %s: its holder %s went silent; taken over", pk, job, was)
            return SharedPart.objects.get(pk=pk)
    return None


def forget_abandoned(before):
    """Forget the parts of jobs nobody has worked on since ``before`` (the process that ran
    the job died: its parts are no use to anyone); returns how many."""
    alive = SharedPart.objects.filter(Q(heartbeat__gte=before) | Q(created__gte=before)).values("job")
    return SharedPart.objects.exclude(job__in=alive).delete()[0]


def _settle(part, holder, *, result=None, error=""):
    """Record ``part`` done (with its result or error), unless another holder took it over."""
    SharedPart.objects.filter(pk=part.pk, holder=holder, done__isnull=True).update(
        done=timezone.now(), result=result or {}, error=error
    )
