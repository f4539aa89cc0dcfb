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

With tasks run in process (the embedded default), these tasks run in a thread of the process,
:data:`runner`, never in the saving request: a slow subscriber holds up no one.
"""

import atexit
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


class Runner:
    """A thread that runs tasks handed to it when tasks run in process, each when it is due
    (a retry's countdown), one at a time, off the requests that queued them."""

    def __init__(self):
        self._reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)
        # A short-lived process (a shell, a command) finishes what is due before it exits.
        atexit.register(self.idle, timeout=10.0)

    def _reset(self):
        self._lock = threading.Condition()
        self._heap = []
        self._order = itertools.count()
        self._thread = None
        self._busy = False

    def submit(self, task, kwargs, countdown=0):
        with self._lock:
            heapq.heappush(self._heap, (time.monotonic() + (countdown or 0), next(self._order), task, kwargs))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="resourcesync-push", daemon=True)
                self._thread.start()
            self._lock.notify_all()

    def idle(self, timeout=10.0, horizon=0.0):
        """Wait until no task due within ``horizon`` seconds is waiting or running; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._busy or (self._heap and self._heap[0][0] <= time.monotonic() + horizon):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(min(remaining, 0.05))
            return True

    def cancel(self):
        """Forget what is waiting (tasks not yet started)."""
        with self._lock:
            self._heap.clear()
            self._lock.notify_all()

    def _run(self):
        while True:
            with self._lock:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._lock.wait(None if not self._heap else self._heap[0][0] - time.monotonic())
                _due, _order, task, kwargs = heapq.heappop(self._heap)
                self._busy = True
            try:
                task.app.set_current()  # Celery's current app is per thread: the one that queued it
                task(**kwargs)
            except Exception:  # the thread outlives any failure; the rows say what is left to do
                logger.exception("%s failed", task.name)
            finally:
                connections.close_all()
                with self._lock:
                    self._busy = False
                    self._lock.notify_all()


runner = Runner()
