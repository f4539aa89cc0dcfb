"""The build lock: one build of a set's capability at a time, across every process and machine."""

import datetime
import logging
import os
import socket
import threading
import time
import uuid

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.utils import timezone

from ..conf import app_settings
from ..exceptions import BuildAbandoned, BuildInProgress
from ..models import Build, BuildLock
from .context import BuildContext

logger = logging.getLogger(__name__)


#: While a process holds a build lock, a thread of it renews the lock this often...
HEARTBEAT_SECONDS = 3
#: ...for this long: a lock whose holder stops renewing it (killed, or cut off from the database)
#: is taken over this long after its last renewal, from any machine; on the holder's own
#: machine, at once if its process is gone.
HEARTBEAT_TTL_SECONDS = 15


def _machine():
    """This machine as lock holders name it: its host name and, where the system tells, its
    process namespace (containers that share a host name do not see each other's processes)."""
    name = socket.gethostname()
    try:
        name += f"/pid-ns-{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        pass
    return name[:255]


HOST = _machine()


def _process_gone(pid):
    """Whether no process ``pid`` runs here: none exists, or only its zombie (killed, not yet
    reaped by its parent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists, but is another user's
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):  # no /proc here: alive, as far as anyone can tell
        return False


class _Heartbeat(threading.Thread):
    """Renews a held lock until stopped, on a database connection of its own."""

    def __init__(self, lock):
        super().__init__(name="resourcesync-build-lock", daemon=True)
        self.lock, self.stopped = lock, threading.Event()

    def run(self):
        try:
            while not self.stopped.wait(HEARTBEAT_SECONDS):
                try:
                    self.lock._mine().update(expires=self.lock._expiry(HEARTBEAT_TTL_SECONDS))
                except Exception:  # the database is away for now; the next beat tries again
                    logger.warning("Could not renew the build lock of %s", self.lock.resource_set.slug, exc_info=True)
        finally:
            connections.close_all()

    def stop(self):
        self.stopped.set()
        self.join()


class build_lock:
    """``with build_lock(resource_set, capability):`` one build of it at a time, everywhere.

    Raises :class:`BuildInProgress` while another holder has it. The process that holds a lock
    renews it on a thread (a heartbeat), so a lock whose holder died is taken over within
    seconds: at once on the holder's own machine, where its process is seen to be gone, and
    ``HEARTBEAT_TTL_SECONDS`` after the last renewal from anywhere else. Taking a lock over
    fails the builds its holder left running, with the reason.

    A build whose parts go to Celery tasks outlives the ``with`` block: :meth:`keep` leaves the
    lock held on exit, for ``BUILD_LOCK_TIMEOUT`` seconds, and the tasks take it up with
    ``build_lock(..., holder=...)``, renew it while they work and :meth:`release` it when the
    build is published or has failed.
    """

    def __init__(self, resource_set, capability, holder=None):
        self.resource_set, self.capability = resource_set, capability
        self.holder = holder or uuid.uuid4().hex
        self.kept = False
        self._heartbeat = None

    @staticmethod
    def _expiry(seconds=None):
        return timezone.now() + datetime.timedelta(seconds=seconds or app_settings.BUILD_LOCK_TIMEOUT)

    def __enter__(self):
        mine = {"holder": self.holder, "expires": self._expiry(HEARTBEAT_TTL_SECONDS), "host": HOST, "pid": os.getpid()}
        locks = BuildLock.objects.filter(resource_set=self.resource_set, capability=self.capability)
        held = locks.first()
        if held is None:
            try:
                with transaction.atomic():
                    BuildLock.objects.create(resource_set=self.resource_set, capability=self.capability, **mine)
            except IntegrityError:
                raise BuildInProgress(f"a {self.capability} build of {self.resource_set.slug} is already running") from None
            # Nobody held the lock: a build still marked running lost its process after it let
            # the lock go (its failure could not be recorded, the database being away).
            self._fail_abandoned("its process stopped before it could record how the build ended")
        else:
            dead = self.is_dead(held)
            # Taken over only from the holder found dead (another may be taking it over too).
            # Compare and swap: a holder that renewed it meanwhile (a new expiry) keeps it.
            if not dead or not locks.filter(holder=held.holder, expires=held.expires).update(**mine):
                raise BuildInProgress(f"a {self.capability} build of {self.resource_set.slug} is already running")
            where = f" (process {held.pid} on {held.host})" if held.pid else ""
            logger.warning(
                "Took over the %s build lock of %s from a holder that died%s", self.capability, self.resource_set.slug, where
            )
            self._fail_abandoned(f"the process that ran it{where} died or lost the database before it was published")
        self._heartbeat = _Heartbeat(self)
        self._heartbeat.start()
        return self

    @staticmethod
    def is_dead(held):
        """Whether the holder of the lock row ``held`` is gone: its time ran out, its process on
        this machine is, or, kept for a build's tasks (no process), that build is over (its last
        task died between publishing it and letting the lock go)."""
        if held.expires < timezone.now():
            return True
        if held.pid is None:
            return not Build.objects.filter(
                resource_set_id=held.resource_set_id, capability=held.capability, status=Build.Status.RUNNING
            ).exists()
        return held.host == HOST and _process_gone(held.pid)

    def _fail_abandoned(self, reason):
        """Fail the builds of the set and capability left running: this lock's holder ran them."""
        abandoned = Build.objects.filter(resource_set=self.resource_set, capability=self.capability, status=Build.Status.RUNNING)
        for build in abandoned:
            BuildContext(build=build).fail(BuildAbandoned(reason))

    def _mine(self):
        return BuildLock.objects.filter(resource_set=self.resource_set, capability=self.capability, holder=self.holder)

    def renew(self):
        """Extend the lock; false if it is not this holder's any more (it expired and was taken).
        A task of a build in parts whose planner still holds the lock (its process id is on it)
        leaves the planner's heartbeat to keep it: were the planner to die, the lock must lapse
        within the heartbeat's time, not ``BUILD_LOCK_TIMEOUT``."""
        if self._heartbeat is not None:
            return bool(self._mine().update(expires=self._expiry(HEARTBEAT_TTL_SECONDS)))
        mine = self._mine()
        return bool(mine.filter(pid__isnull=True).update(expires=self._expiry())) or mine.exists()

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
        """Leave the lock held when the ``with`` block ends: tasks go on with the build, and
        renew it (for ``BUILD_LOCK_TIMEOUT`` seconds at a time) while they do."""
        self.kept = True
        self._stop_heartbeat()
        self._mine().update(expires=self._expiry(), pid=None)

    def release(self):
        self._stop_heartbeat()
        self._mine().delete()

    def _stop_heartbeat(self):
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None

    def __exit__(self, *exc_info):
        self._stop_heartbeat()
        if not self.kept:
            try:
                self.release()
            except DatabaseError:
                # The connection was lost with the build: once more on a fresh one. Should that
                # fail too, the lock is taken over when its heartbeat's time runs out.
                connections[BuildLock.objects.db].close()
                try:
                    self.release()
                except DatabaseError:
                    logger.exception("Could not release the build lock of %s", self.resource_set.slug)
        return False


