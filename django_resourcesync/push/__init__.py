"""Push: Framework Notifications and Change Notifications over WebSub.

A set that offers ``framework-notification`` or ``change-notification`` has a channel (a WebSub
topic) for each, advertised in its Capability List with the hub (see
:mod:`~django_resourcesync.builders.channel`). Whenever something a channel tells of may have
changed (a change list grew, a build was published, a Change Dump package was cut, a set was
configured), the commit queues the ``resourcesync.notify`` task (:func:`soon`), which compares
what the channels announced with what is published now and records a notification for what
changed (:mod:`.announce`); each notification is then delivered to the subscribers of the
built-in hub, or to the external hub (:mod:`.hub`), by ``resourcesync.deliver`` tasks, retried
with backoff. The notifications and their deliveries are rows: a process killed between two
steps loses nothing, the next run goes on from them.

With tasks run in process (the embedded default), these tasks run in threads of the process,
:data:`runner`, never in the saving request: a slow subscriber holds up no one.
"""

import atexit
import concurrent.futures.thread  # noqa: F401 (its exit hook must be registered before drain's: see there)
import heapq
import itertools
import logging
import os
import threading
import time

from celery import current_app
from django.db import connections, router, transaction

from .. import running

logger = logging.getLogger(__name__)

NOTIFY = "resourcesync.notify"
DELIVER = "resourcesync.deliver"
VERIFY = "resourcesync.verify_subscription"


def queue(name, *, countdown=0, **kwargs):
    """Send the task ``name`` (or, when tasks run in process, hand it to :data:`runner`)."""
    task = current_app.tasks[name]
    if running.mode().in_process:
        runner.submit(task, kwargs, countdown)
        return
    try:
        task.apply_async(kwargs=kwargs, countdown=countdown or None)
    except Exception:  # a broker outage fails no save: the rows wait for resourcesync.deliver_due
        logger.exception("Could not queue %s; the next notify or deliver_due run picks it up", name)


DELIVER_DUE = "resourcesync.deliver_due"


def catch_up():
    """Queue the push's safety net (what beat runs every minute with Celery): announce what no
    notify announced, deliver what is due, verify what waits. In the embedded mode the site's
    serving processes call it on each look for pending changes (see
    :meth:`~django_resourcesync.tracking.outbox.Dispatcher.also_on_look`), so that what a
    killed or short-lived process left is delivered without waiting for the next change."""
    queue(DELIVER_DUE)


class _Announce:
    """The on-commit callback of one transaction: one notify task for the sets it touched."""

    def __init__(self):
        self.set_ids = set()
        self.every = False
        self.done = False

    def __call__(self):
        self.done = True
        queue(NOTIFY, set_ids=None if self.every else sorted(self.set_ids))


#: Seconds a process trusts what it read of which sets offer a channel (a change of a set in
#: this process is seen at once).
OFFERS_TTL = 10.0
_offers = []  # [(read at, {set id: capabilities offered})]


def forget_offers(**kwargs):
    _offers.clear()


def offering():
    """``{set id: [channels]}`` of the enabled sets that offer a notification channel."""
    from .. import capabilities
    from ..models import ResourceSet

    now = time.monotonic()
    if not _offers or now - _offers[0][0] > OFFERS_TTL:
        channels = {capability.name for capability in capabilities.TABLE if capability.channel}
        found = {}
        for pk, offered in ResourceSet.objects.filter(enabled=True).values_list("pk", "capabilities"):
            mine = sorted(channels.intersection(offered or []))
            if mine:
                found[pk] = mine
        _offers[:] = [(now, found)]
    return _offers[0][1]


def _framework_channels():
    from .. import capabilities

    return any(capabilities.FRAMEWORK_NOTIFICATION in offered for offered in offering().values())


def soon(set_id=None, *, using=None):
    """After the current transaction commits, have the channels of set ``set_id`` (of every set,
    for ``None``: a set's configuration changes the Source Description) announce what changed.
    Nothing is queued when no set offers a channel."""
    from ..models import Channel

    using = using or router.db_for_write(Channel)
    if set_id is None:
        forget_offers()
        if not offering() and not Channel.objects.using(using).exists():
            return  # no channel, and none to tell that its set went
    elif set_id not in offering() and not _framework_channels():
        return  # neither its channels nor, by the Source Description, any other's
    connection = connections[using]
    callback = next(
        (func for _sids, func, _robust in connection.run_on_commit if isinstance(func, _Announce) and not func.done), None
    ) if connection.in_atomic_block else None
    registered = callback is not None
    callback = callback or _Announce()
    if set_id is None:
        callback.every = True
    else:
        callback.set_ids.add(set_id)
    if not registered:
        transaction.on_commit(callback, using=using)


class _Lane:
    """Tasks of one kind waiting in a :class:`Runner`, and the thread that runs them."""

    def __init__(self):
        self.heap = []
        self.thread = None
        self.busy = False

    def waiting(self, horizon=0.0):
        """Whether a task is running, or due within ``horizon`` seconds."""
        return self.busy or bool(self.heap and self.heap[0][0] <= time.monotonic() + horizon)


#: The lane of each task that does not run on the main one: verifications, which each last up
#: to HUB_TIMEOUT at a callback, never wait for a notify or a delivery, nor hold them up.
LANES = {VERIFY: "resourcesync-verify"}
MAIN_LANE = "resourcesync-push"


class Runner:
    """Threads that run tasks handed to them when tasks run in process, each when it is due
    (a retry's countdown), off the requests that queued them: a thread for the verifications
    (``resourcesync.verify_subscription``, whose task verifies ``HUB_VERIFY_THREADS`` requests
    at a time), one for the rest, each running its tasks one at a time."""

    def __init__(self):
        self._reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self):
        self._lock = threading.Condition()
        self._lanes = {}
        self._order = itertools.count()

    def submit(self, task, kwargs, countdown=0):
        name = LANES.get(task.name, MAIN_LANE)
        with self._lock:
            lane = self._lanes.setdefault(name, _Lane())
            heapq.heappush(lane.heap, (time.monotonic() + (countdown or 0), next(self._order), task, kwargs))
            if lane.thread is None or not lane.thread.is_alive():
                lane.thread = threading.Thread(target=self._run, args=(lane,), name=name, daemon=True)
                lane.thread.start()
            self._lock.notify_all()

    def idle(self, timeout=10.0, horizon=0.0):
        """Wait until no task due within ``horizon`` seconds is waiting or running; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while any(lane.waiting(horizon) for lane in self._lanes.values()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(min(remaining, 0.05))
            return True

    def cancel(self):
        """Forget what is waiting (tasks not yet started)."""
        with self._lock:
            for lane in self._lanes.values():
                lane.heap.clear()
            self._lock.notify_all()

    def _run(self, lane):
        while True:
            with self._lock:
                while not lane.heap or lane.heap[0][0] > time.monotonic():
                    self._lock.wait(None if not lane.heap else lane.heap[0][0] - time.monotonic())
                _due, _order, task, kwargs = heapq.heappop(lane.heap)
                lane.busy = True
            try:
                task.app.set_current()  # Celery's current app is per thread: the one that queued it
                task(**kwargs)
            except Exception:  # the thread outlives any failure; the rows say what is left to do
                logger.exception("%s failed", task.name)
            finally:
                connections.close_all()
                with self._lock:
                    lane.busy = False
                    self._lock.notify_all()


runner = Runner()

#: Seconds beyond ``HUB_TIMEOUT`` a process that exits gives what it has to do before it goes.
EXIT_GRACE = 5.0


def drain(timeout=None):
    """Finish what this process has to do before it goes (a ``manage.py shell`` script that
    saved, a command): the pending changes its dispatcher holds
    (:mod:`~django_resourcesync.tracking.outbox`), then the tasks due now that they queue here
    (notify, deliveries, verifications), until none is left or ``timeout`` seconds
    (``HUB_TIMEOUT`` + :data:`EXIT_GRACE`) have passed; retries due later are not waited for.
    Whatever is left is rows: the changes and deliveries a later process finds. Returns whether
    nothing was left."""
    from django.apps import apps

    if not apps.ready:
        return True  # the app never ran in this process: nothing to finish
    from ..conf import app_settings
    from ..tracking import outbox

    deadline = time.monotonic() + (app_settings.HUB_TIMEOUT + EXIT_GRACE if timeout is None else timeout)
    while True:
        outbox.dispatcher.flush(timeout=max(0.0, deadline - time.monotonic()))
        idle = runner.idle(timeout=max(0.0, deadline - time.monotonic()))
        if idle and not outbox.dispatcher.pending():
            return True
        if time.monotonic() >= deadline:
            logger.warning("The process exits with work left to do; the next run takes it from the database")
            return False


def _drain_at_exit():
    try:
        drain()
    except Exception:  # the process exits anyway; what is left is rows
        logger.exception("Could not finish what this process had to do before it exits")


# Run before the interpreter shuts down, while threads may still start and thread pools still
# take work: threading's exit hooks run before the atexit ones, in the reverse order of their
# registration, so this one runs before the one that stops every ThreadPoolExecutor (registered
# by the import of concurrent.futures.thread above), which a delivery uses.
getattr(threading, "_register_atexit", atexit.register)(_drain_at_exit)
