"""Pending changes on their way to the database and the workers, at the least cost to a save.

A save of a tracked object leaves a :class:`~.models.PendingChange` row (the outbox) and, once
committed, asks a worker to process it (the ``resourcesync.process_changes`` task). Both steps are
cheap to write and expensive to do one save at a time: a transaction of its own for the row, and
a round trip to the broker for the task. So:

- **inside a transaction** (``ATOMIC_REQUESTS``, the admin, ``transaction.atomic()``), the rows
  are inserted at once, in the saving transaction: they commit, or roll back, with the save. The
  commit then hands the task to the :class:`Dispatcher`;
- **in autocommit**, the save has already committed when the signal arrives, so the rows cannot
  share its transaction anyway: they go to the :class:`Dispatcher` too, which writes them just
  after, together with those of other saves, in one transaction (on SQLite only when
  transactions are ``IMMEDIATE``; else the saving thread writes them);
- the :class:`Dispatcher` is a thread of the process that sends one task for everything it
  gathered since the last one. A task only has to start after the changes it is for committed:
  it processes every pending row it finds, whoever queued it.

When tasks run in process (``CELERY_TASK_ALWAYS_EAGER``, the demo's default) or the
``BACKGROUND_DISPATCH`` setting is off, there is no thread: rows are inserted in the save's
transaction and the task runs (or is sent) by ``transaction.on_commit``.

Each save's row also carries the state it left (see
:meth:`~django_resourcesync.sources.ResourceSource.saved_state`) and, once committed, which sets
listed its object then (``"sets"``), should a later save overtake it before it is processed: the
thread finds that out for the rows it writes and for the transactions it is told of, off the
request; without the thread, the commit's callback does.

The process flushes what the thread still holds when it exits, and after each Celery task. A
process killed in the milliseconds between a save's commit and the thread's write loses that
pending change; the periodic reconcile finds the difference and records it.

A process killed after the commit, or one that ends before its thread has processed what it
committed, leaves pending changes that no one is about to process: with workers, beat's
``resourcesync.process_changes`` entry runs them. In the embedded mode, a process that serves
requests does (:meth:`Dispatcher.serve`): its thread processes every pending change it finds
soon after the process's first request, and again every ``EMBEDDED_CATCH_UP_SECONDS``. Nothing
of it runs at start-up, nor in commands, which serve no request.
"""

import atexit
import json
import logging
import os
import secrets
import threading
import time

from celery import current_app
from django.core.signals import request_started
from django.db import connections, router, transaction
from django.utils import timezone

from .. import bulk, running, sqlite
from ..conf import app_settings
from ..models import PendingChange

logger = logging.getLogger(__name__)

#: How long the thread waits after the first change it is told of, to gather those that follow.
GATHER_SECONDS = 0.05
#: Attempts at writing rows (or sending the task) before giving up on them; reconcile catches up.
ATTEMPTS = 5


FIELDS = ("source", "object_pk", "related", "state", "recorded", "sets", "noted", "transaction")


def stamped(rows, now=None):
    """``(source, object_pk, related, state, recorded, sets, noted)`` of ``(source, object_pk,
    related)`` or ``(source, object_pk, related, state)`` rows: the change is made now; which
    sets list the object is noted after the commit (:func:`with_memberships`)."""
    now = now or timezone.now()
    return [(*row, None, now, None, None) if len(row) == 3 else (*row, now, None, None) for row in rows]


def insert(rows, using, token=None):
    """Insert stamped rows (see :func:`stamped`) as pending changes of the transaction
    ``token``, in ``using``'s current transaction: one statement, none of the ORM's per-object
    work."""
    bulk.insert(PendingChange, FIELDS, [(*row, token) for row in rows], using)


#: Seconds a process trusts what it read of a source's sets (a change in this process is seen at once).
SETS_TTL = 10.0
_sets = {}  # source name -> (read at, [(lookups, [set keys])])


def forget_sets(**kwargs):
    _sets.clear()


def memberships(source_name, keys):
    """``{key: [set keys]}``: which enabled sets of the source list each of its objects
    ``keys`` now. A save's state says so (see :func:`with_memberships`): should a later save
    overtake it before it is processed, it is published only by the sets it was in. One query
    per distinct filter of the source's sets."""
    from ..models import ResourceSet
    from ..sources import registry

    source = registry.get(source_name)
    now = time.monotonic()
    known = _sets.get(source_name)
    if known is None or now - known[0] > SETS_TTL:
        by_filter = {}
        enabled = ResourceSet.objects.filter(source=source_name, enabled=True).order_by("pk")
        for pk, lookups in enabled.values_list("pk", "lookups"):
            by_filter.setdefault(json.dumps(lookups or {}, sort_keys=True), (lookups, []))[1].append(pk)
        known = _sets[source_name] = (now, list(by_filter.values()))
    found = {str(key): [] for key in keys}
    for lookups, set_keys in known[1]:
        for pk in bulk.filter_in(source.queryset(lookups), "pk", list(found)).values_list("pk", flat=True):
            found[str(pk)].extend(set_keys)
    return found


def with_memberships(rows):
    """Stamped rows, each save's with the sets its object is in now. Should that fail, they
    say nothing of it, and the saves are published only if no later save overtakes them
    before they are processed."""
    wanted = {}
    for row in rows:
        if row[3] is not None:
            wanted.setdefault(row[0], set()).add(row[1])
    try:
        found = {name: memberships(name, keys) for name, keys in wanted.items()}
    except Exception:
        logger.warning("Could not tell which sets list the objects saved", exc_info=True)
        return rows
    noted = timezone.now()
    return [(*row[:5], found[row[0]][row[1]], noted) if row[3] is not None else row for row in rows]


def stamp_transactions(using, saved):
    """Note which sets list the objects of the saves of committed transactions, ``{token:
    {source: keys}}``, on their rows (written by the saving transactions themselves): one
    UPDATE per source and set of sets."""
    by_source = {}  # source -> {key: {tokens}}
    for token, sources in saved.items():
        for name, keys in sources.items():
            for key in keys:
                by_source.setdefault(name, {}).setdefault(key, set()).add(token)
    for name, keys in by_source.items():
        found = memberships(name, keys)
        noted = timezone.now()
        groups = {}  # sets -> ({tokens}, [keys])
        for key, tokens in keys.items():
            group = groups.setdefault(tuple(found[key]), (set(), []))
            group[0].update(tokens)
            group[1].append(key)
        for sets, (tokens, group_keys) in groups.items():
            rows = PendingChange.objects.using(using).filter(transaction__in=sorted(tokens), source=name, related="")
            bulk.filter_in(rows.filter(state__isnull=False), "object_pk", group_keys).update(sets=list(sets), noted=noted)


def takes_concurrent_writers(connection):
    """Whether a thread may write beside the site's own transactions. SQLite lets one
    connection write at a time, and a transaction that began reading fails with "database is
    locked" instead of waiting for a writer, unless transactions take the lock when they begin
    (``"OPTIONS": {"transaction_mode": "IMMEDIATE"}``, which the app sets where the site chose
    nothing: see :mod:`..sqlite`): without that, the saving thread writes its rows itself."""
    if connection.vendor != "sqlite":
        return True
    return sqlite.takes_the_lock_at_begin(connection)


#: The task that processes pending changes, found by its stable name (:mod:`..tasks` defines it).
PROCESS_CHANGES = "resourcesync.process_changes"


def processing_task():
    """The ``resourcesync.process_changes`` task of the Celery app current in this thread (the
    app is a per-thread setting in Celery: the dispatcher thread sends with the saver's)."""
    return current_app.tasks[PROCESS_CHANGES]


def in_background(task):
    """Whether the dispatcher thread queues ``task`` (or, in the embedded mode, runs it): not
    when Celery runs tasks in the calling process (eager), as an eager task marks the whole
    process, every thread, as being inside a task."""
    return app_settings.BACKGROUND_DISPATCH and not running.eager()


def send(task, source_names):
    """Queue the processing of these sources' pending changes (or run it here: eager tasks, and
    the embedded mode, where this is the dispatcher's thread unless ``BACKGROUND_DISPATCH`` is off)."""
    running.send(task, sorted(source_names))


class Dispatcher:
    """A thread that writes pending changes handed over after their save committed, and queues
    their processing: one transaction and one task for all that arrived meanwhile."""

    def __init__(self):
        self._reset()
        if hasattr(os, "register_at_fork"):
            # A forked child (a prefork worker, a forking server) starts with no thread and
            # nothing to send: what the parent held is the parent's to write.
            os.register_at_fork(after_in_child=self._reset)
        atexit.register(self.flush)

    def _reset(self):
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._hurry = threading.Event()  # a flush waits: no gathering
        self._rows = {}  # using -> stamped rows
        self._stamps = {}  # using -> {token: {source: keys}} of committed saves whose sets are to be noted
        self._sources = {}  # task -> source names
        self._busy = False
        self._writing = {}  # source -> when its oldest save was made, of the rows being written now
        self._thread = None
        self._catch_up = None  # the processing task, once the process serves requests (see serve())
        self._look_at = None  # when (monotonic) the thread looks for pending changes next, if ever
        self._also = []  # what else each look starts (see also_on_look())

    def also_on_look(self, start):
        """Have each look of the embedded mode (see :meth:`serve`) call ``start()`` too, after it
        has processed the pending changes: the push's safety net registers here, so that what a
        process left of its own work (deliveries due, verifications waiting) is taken up as well.
        ``start`` must only hand the work on (to another thread), not do it."""
        with self._lock:
            if start not in self._also:
                self._also.append(start)

    def submit(self, task, *, rows=None, using=None, sources=(), saved=None):
        """Hand over rows to insert (in database ``using``), the saves of committed
        transactions whose sets are to be noted (:func:`stamp_transactions`), and sources
        whose processing ``task`` is to queue."""
        with self._lock:
            wanted = self._sources.setdefault(task, set())
            if rows:
                self._rows.setdefault(using, []).extend(rows)
                wanted.update(row[0] for row in rows)
            if saved:
                self._stamps.setdefault(using, {}).update(saved)
            wanted.update(sources)
            self._start()
        self._wake.set()

    def _start(self):
        """Start the thread if it is not running (the lock held)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="resourcesync-dispatch", daemon=True)
            self._thread.start()

    @property
    def serving(self):
        """Whether the process serves requests (:meth:`serve` was called)."""
        return self._catch_up is not None

    def serve(self, task):
        """The process serves requests: in the embedded mode, have the thread process every
        pending change it finds (``task``: the processing task) now, and every
        ``EMBEDDED_CATCH_UP_SECONDS`` after: those a process that was killed or ended left, or
        that another process committed and is not processing. The mode is asked at each look: a
        site whose broker comes back sends nothing then, as its workers and beat take over."""
        with self._lock:
            if self._catch_up is not None:
                return
            self._catch_up = task
            self._look_at = time.monotonic()
            self._start()
        self._wake.set()

    def held_since(self, source_name):
        """When the oldest save of the source ``source_name`` was made whose pending change this
        process holds, not yet written (``None`` if none): a change of the source recorded since
        must be processed after it."""
        with self._lock:
            times = [row[4] for rows in self._rows.values() for row in rows if row[0] == source_name]
            if source_name in self._writing:
                times.append(self._writing[source_name])
        return min(times, default=None)

    def pending(self):
        with self._lock:
            return bool(self._rows or self._stamps or self._sources or self._busy)

    def flush(self, timeout=10.0):
        """Wait until everything handed over is written and queued; False on timeout, when the
        pending changes the thread has not taken yet are written here (the thread is busy, with
        a long processing in the embedded mode, say: a process that exits must not lose them;
        they are processed by the next run). On the thread itself (a task it ran in the
        embedded mode has ended): nothing to wait for, as the thread goes on to what arrived
        meanwhile once the task returns."""
        if threading.current_thread() is self._thread:
            return True
        deadline = time.monotonic() + timeout
        held = None
        with self._lock:
            while self._rows or self._stamps or self._sources or self._busy:
                if self._thread is None or not self._thread.is_alive():
                    break  # nothing left to do it (the interpreter is going down): do it here
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    held, self._rows = self._rows, {}
                    break
                self._wake.set()
                self._hurry.set()
                self._done.wait(remaining)
            else:
                return True
        if held is not None:
            for using, rows in held.items():
                if self._attempt(f"write {len(rows)} pending changes", self._write, using, with_memberships(rows)):
                    logger.warning("%d pending changes written at exit; their processing waits for the next run", len(rows))
            return False
        self._round()
        return not self.pending()

    def _run(self):
        while True:
            if self._wake.wait(self._until_look()):
                # Gather what the next saves bring, unless a flush waits for the round (a
                # Celery task that saved waits for it before the worker takes the next one).
                self._hurry.wait(GATHER_SECONDS)
                self._hurry.clear()
                self._wake.clear()
            try:
                self._round()
                self._look()
                if not self._wake.is_set():
                    # Idle: let the thread's database connections go (a busy thread keeps
                    # them, as connecting costs more than a round).
                    connections.close_all()
            except Exception:  # the thread must outlive any failure; what it held is logged
                logger.exception("Change dispatch failed; the next reconcile finds what it held")

    def _until_look(self):
        """Seconds until the next look for pending changes (``None``: no look to come)."""
        with self._lock:
            return None if self._look_at is None else max(0.0, self._look_at - time.monotonic())

    def _look(self):
        """When it is time, process every pending change found, in the embedded mode (see
        :meth:`serve`); a flush waits for it as for a round."""
        with self._lock:
            if self._look_at is None or self._look_at > time.monotonic():
                return
            self._busy = True
        try:
            if running.mode().name == running.EMBEDDED:
                running.send(self._catch_up)
                for start in list(self._also):
                    start()
        except Exception:  # the next look tries again
            logger.exception("Processing the pending changes found failed")
        finally:
            every = running.catch_up_seconds()
            with self._lock:
                self._look_at = time.monotonic() + every if every else None
                self._busy = False
                self._done.notify_all()

    def _round(self):
        with self._lock:
            rows, stamps, sources = self._rows, self._stamps, self._sources
            self._rows, self._stamps, self._sources = {}, {}, {}
            self._busy = bool(rows or stamps or sources)
            self._writing = {}
            for row in (row for held in rows.values() for row in held):
                self._writing[row[0]] = min(row[4], self._writing.get(row[0], row[4]))
        try:
            if rows or stamps or sources:
                self._deliver(rows, stamps, sources)
        finally:
            with self._lock:
                self._busy = False
                self._writing = {}
                self._done.notify_all()

    def _deliver(self, rows, stamps, sources):
        names = sorted(set().union(*sources.values())) if sources else []
        for using, using_rows in rows.items():
            using_rows = with_memberships(using_rows)
            if not self._attempt(f"write {len(using_rows)} pending changes", self._write, using, using_rows):
                logger.error(
                    "%d pending changes of %s could not be written; the next reconcile finds them", len(using_rows), names
                )
        with self._lock:
            self._writing = {}  # written (or given up): the changes recorded since may be processed
        for using, saved in stamps.items():
            # Before their processing is queued: a worker that is up finds them noted.
            if not self._attempt("note which sets list the objects saved", stamp_transactions, using, saved):
                logger.warning("Saves of %d transaction(s) do not say which sets listed their objects", len(saved))
        for task, task_sources in sources.items():
            if task_sources and not self._attempt("queue change processing", send, task, task_sources):
                logger.error("Change processing for %s could not be queued; it waits for the next run", sorted(task_sources))

    @staticmethod
    def _write(using, rows):
        connection = connections[using]
        if connection.connection is not None and not connection.is_usable():
            connection.close()  # dropped by the server since the last round
        with transaction.atomic(using=using):
            insert(rows, using)  # each its own change: its save committed on its own

    @staticmethod
    def _attempt(what, func, *args):
        for attempt in range(1, ATTEMPTS + 1):
            try:
                func(*args)
                return True
            except Exception:
                logger.warning("Could not %s (attempt %d of %d)", what, attempt, ATTEMPTS, exc_info=True)
                if attempt < ATTEMPTS:
                    time.sleep(0.2 * 2**attempt)
        return False


dispatcher = Dispatcher()


def serving(sender=None, **kwargs):
    """``request_started``: the process serves requests (see :meth:`Dispatcher.serve`); one
    attribute read per request once it is known."""
    if not dispatcher.serving:
        dispatcher.serve(processing_task())


def connect():
    request_started.connect(serving, dispatch_uid="resourcesync_catch_up_when_serving")


class _OnCommit:
    """The on-commit callback of one transaction: queues processing for the sources it touched.
    Its ``token`` marks the transaction's pending changes: those of one object are one change."""

    def __init__(self, using):
        self.sources = set()
        self.saved = {}  # source -> keys of the objects saved (not deleted, not related)
        self.done = False
        self.token = secrets.randbits(62)
        self.using = using

    def add(self, rows):
        for row in rows:
            self.sources.add(row[0])
            if row[3] is not None:
                self.saved.setdefault(row[0], set()).add(row[1])

    def __call__(self):
        self.done = True
        task = processing_task()
        background = in_background(task)
        if background and takes_concurrent_writers(connections[self.using]):
            # The thread notes which sets list the objects saved (off the request), then
            # queues their processing.
            dispatcher.submit(task, sources=self.sources, using=self.using, saved={self.token: self.saved})
            return
        if background:
            # SQLite, whose transactions do not wait for a writer: the thread writes nothing,
            # and these saves are published only if no later save overtakes them.
            dispatcher.submit(task, sources=self.sources)
            return
        try:
            # No thread (tasks run in process, or BACKGROUND_DISPATCH is off): done here.
            stamp_transactions(self.using, {self.token: self.saved})
        except Exception:
            logger.warning("Could not note which sets list the objects saved", exc_info=True)
        try:
            send(task, self.sources)
        except Exception:  # a broker outage must not fail the committed save; beat catches up
            logger.exception("Could not queue change processing for %s; it waits for the next run", sorted(self.sources))


def record(rows, using=None, *, saved=False):
    """Record ``(source, object_pk, related[, state])`` rows as pending changes made now, and
    have them processed after the commit (see the module's description for how). ``state``:
    what a save left of the object (:meth:`~django_resourcesync.sources.ResourceSource.saved_state`),
    ``None`` for a row that asks for the object to be looked at again. ``saved``: the rows are
    those of a save or delete that has already committed (a signal in autocommit), which the
    dispatcher may write a little later; other callers (the bulk API) find their rows written
    on return."""
    if not rows:
        return
    rows = stamped(rows)
    using = using or router.db_for_write(PendingChange)
    connection = connections[using]
    if saved and not connection.in_atomic_block and takes_concurrent_writers(connection):
        task = processing_task()
        if in_background(task):
            dispatcher.submit(task, rows=rows, using=using)
            return
    if not connection.in_atomic_block:
        callback = _OnCommit(using)
        with transaction.atomic(using=using):  # one commit for them all
            insert(rows, using, callback.token)
    else:
        # One callback per transaction: the one already registered, if any.
        callback = next(
            (func for _sids, func, _robust in connection.run_on_commit if isinstance(func, _OnCommit) and not func.done), None
        )
        registered = callback is not None
        callback = callback or _OnCommit(using)
        insert(rows, using, callback.token)
        if registered:
            callback.add(rows)
            return
    callback.add(rows)
    transaction.on_commit(callback, using=using)
