"""Where the app's tasks run: on Celery workers, or in the site's own process.

The app's work after a save (processing pending changes, announcing them) and on demand (a
rebuild from the admin) is written as Celery tasks. A site need not run Celery at all: the mode
in force, :func:`mode`, is one of

- ``celery``: the site has a Celery app with a broker that answers; tasks are sent to its
  workers;
- ``eager``: the site's Celery app runs tasks in the calling process
  (``CELERY_TASK_ALWAYS_EAGER``): a task runs where it is sent, as Celery does it;
- ``embedded``: no Celery app is configured, or its broker is not set or does not answer; the
  app runs its tasks itself, in the process, the processing of changes on a thread after the
  commit, never in the saving request (see :mod:`.tracking.outbox`); a process that serves
  requests also processes, on that thread, what other processes left pending (at its first
  request, then every ``EMBEDDED_CATCH_UP_SECONDS``).

``RESOURCESYNC["TASKS"]`` chooses: ``"auto"`` (the default: as above), ``"celery"`` (always
send, whatever the broker does) or ``"embedded"``. ``manage.py check`` says which mode is in
force (``resourcesync.I001``), and the admin shows it.
"""

import functools
import logging
import re
import socket
import threading
import time
from typing import NamedTuple
from urllib.parse import urlsplit

from celery import _state as celery_state
from celery import current_app
from django.core.signals import setting_changed

from .conf import DEFAULTS, app_settings

logger = logging.getLogger(__name__)

CELERY, EAGER, EMBEDDED = "celery", "eager", "embedded"
CHOICES = ("auto", CELERY, EMBEDDED)

#: Seconds a process trusts what it found of the broker (whether it answers).
BROKER_TTL = 30.0
#: Seconds to wait for the broker's port to answer.
BROKER_TIMEOUT = 1.0
#: The brokers' default ports, for URLs that give none.
DEFAULT_PORTS = {"amqp": 5672, "amqps": 5671, "pyamqp": 5672, "redis": 6379, "rediss": 6379, "sqs": 443}


class Mode(NamedTuple):
    """The mode in force (:data:`CELERY`, :data:`EAGER` or :data:`EMBEDDED`) and why."""

    name: str
    reason: str

    @property
    def in_process(self):
        return self.name != CELERY


_lock = threading.Lock()
_broker = {}  # url -> (checked at, answers)


_eager = None  # (the app's configuration, its task_always_eager as the settings give it)


def forget(**kwargs):
    """Ask the broker again (a setting changed, or a test wants a fresh look)."""
    global _eager
    with _lock:
        _broker.clear()
        _eager = None


setting_changed.connect(forget)


def site_app():
    """The site's Celery app, or ``None`` when the site configured none (Celery's fallback app,
    which it makes when asked for one and finds none, is not the site's)."""
    app = current_app._get_current_object()
    if _is_fallback(app):
        others = [other for other in list(celery_state._apps) if not _is_fallback(other)]
        return others[0] if others else None
    return app


def _is_fallback(app):
    return app.main == "default" and not app.set_as_current and not app.fixups


def mode():
    """The :class:`Mode` in force in this process, now."""
    chosen = app_settings.TASKS
    app = site_app()
    if chosen == EMBEDDED:
        return Mode(EMBEDDED, "RESOURCESYNC['TASKS'] is \"embedded\"")
    if app is None:
        if chosen == CELERY:
            return Mode(CELERY, "RESOURCESYNC['TASKS'] is \"celery\" (no Celery app is configured)")
        return Mode(EMBEDDED, "no Celery app is configured")
    if always_eager(app):
        return Mode(EAGER, f"the Celery app {app.main!r} runs tasks in the calling process (task_always_eager)")
    url = _joined(app.conf.broker_url)
    if chosen == CELERY:
        return Mode(CELERY, f"RESOURCESYNC['TASKS'] is \"celery\" (broker {_safe(url)})")
    if not url:
        return Mode(EMBEDDED, f"the Celery app {app.main!r} has no broker_url")
    if not broker_answers(url):
        return Mode(EMBEDDED, f"the broker {_safe(url)} does not answer")
    return Mode(CELERY, f"the Celery app {app.main!r} sends tasks to the broker {_safe(url)}")


def always_eager(app):
    """``app.conf.task_always_eager``, as :func:`mode` asks it at every save. Celery looks a
    setting up through the site's settings each time it is read (in a Django project's, as
    ``CELERY_TASK_ALWAYS_EAGER``, missed attribute lookups when the project does not set it:
    most of what change capture cost the saving thread), so the answer the settings give is
    kept until they change (:func:`forget`, on ``setting_changed``). A value set on the app
    itself (``app.conf.task_always_eager = ...``) is read every time."""
    global _eager
    conf = app.conf
    prefix = getattr(conf, "prefix", None) or ""
    try:
        on_app = any(key in conf.changes for key in ("task_always_eager", f"{prefix}TASK_ALWAYS_EAGER",
                                                     f"{prefix}ALWAYS_EAGER"))
    except Exception:  # not Celery's own configuration: asked every time
        on_app = True
    known = _eager
    if not on_app and known is not None and known[0] is conf:
        return known[1]
    value = bool(conf.task_always_eager)
    if not on_app:
        _eager = (conf, value)
    return value


def eager():
    """Whether the mode in force is :data:`EAGER` (``mode().name == EAGER``), without finding out
    about the broker: what a save asks, every time."""
    if app_settings.TASKS == EMBEDDED:
        return False
    app = site_app()
    return app is not None and always_eager(app)


def _joined(url):
    """The broker URL as one string: Celery takes a list of fail-over brokers too, or the same
    joined by ``;``."""
    if isinstance(url, (list, tuple)):
        return ";".join(str(one) for one in url)
    return str(url) if url else ""


_probing = set()  # the URLs a thread is asking now


def broker_answers(url):
    """Whether something listens at one of the broker's hosts and ports (asked at most every
    :data:`BROKER_TTL` seconds, by one thread at a time: the others take the last answer, or
    "answers" before the first). A transport with no host (``memory://``) answers."""
    now = time.monotonic()
    with _lock:
        known = _broker.get(url)
        if known is not None and (now - known[0] < BROKER_TTL or url in _probing):
            return known[1]
        if url in _probing:
            return True
        _probing.add(url)
    try:
        answers = any(_listens(one) for one in _brokers(url))
    except Exception:  # whatever the lookup raises, a save must not fail on it
        logger.warning("Could not tell whether the Celery broker %s answers", _safe(url), exc_info=True)
        answers = True
    finally:
        with _lock:
            _probing.discard(url)
    with _lock:
        _broker[url] = (now, answers)
    if not answers:
        logger.warning("The Celery broker %s does not answer: the app runs its tasks in this process", _safe(url))
    return answers


def _brokers(url):
    return [one.strip() for one in url.split(";") if one.strip()]


def _listens(url):
    parts = urlsplit(url)
    try:
        host, port = parts.hostname, parts.port or DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return False
    if port and not host:
        host = "localhost"  # "amqp://", "redis://": the transport's default host
    if not host or not port:
        return True
    try:
        with socket.create_connection((host, port), timeout=BROKER_TIMEOUT):
            return True
    except OSError:
        return False


def _safe(url):
    """The broker's URLs without their passwords."""
    return _safe_joined(_joined(url))


@functools.lru_cache(maxsize=64)  # the reason of the mode, asked at every save
def _safe_joined(url):
    return ";".join(_without_password(one) for one in _brokers(url))


def _without_password(url):
    parts = urlsplit(url)
    if parts.password:
        netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        parts = parts._replace(netloc=netloc)
    if "password=" in parts.query:
        parts = parts._replace(query=re.sub(r"(password=)[^&]*", r"\1***", parts.query))
    return parts.geturl()


def send(task, *args, **kwargs):
    """Send ``task`` to the workers, or run it here in the embedded mode; returns its result
    (an ``EagerResult`` when it ran here). ``delay()`` as the mode in force means it."""
    if mode().name == EMBEDDED:
        return task.apply(args=args, kwargs=kwargs, throw=True)
    return task.delay(*args, **kwargs)


def is_interval(value):
    """Whether ``value`` is a positive number of seconds."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def catch_up_seconds():
    """``EMBEDDED_CATCH_UP_SECONDS`` (``None``: no look after the first): its default while it
    is neither ``None`` nor a positive number (the check ``resourcesync.E030`` says so)."""
    try:
        every = app_settings.EMBEDDED_CATCH_UP_SECONDS
    except Exception:  # RESOURCESYNC itself is wrong: E001 and E002 say so
        every = DEFAULTS["EMBEDDED_CATCH_UP_SECONDS"]
    return every if every is None or is_interval(every) else DEFAULTS["EMBEDDED_CATCH_UP_SECONDS"]


#: Seconds after which a pending change that is still waiting is reported as stalled.
STALLED_SECONDS = 60


class Stalled(NamedTuple):
    """Pending changes waiting for longer than :data:`STALLED_SECONDS`: how many, since when, why."""

    count: int
    since: object
    reason: str


def stalled(now=None):
    """A :class:`Stalled` when pending changes wait for longer than a minute, else ``None``:
    two cheap queries (the oldest row by its key; a count only when it is old)."""
    from datetime import timedelta

    from django.utils import timezone

    from .models import PendingChange

    now = now or timezone.now()
    oldest = PendingChange.objects.order_by("id").values_list("recorded", flat=True).first()
    if oldest is None or oldest > now - timedelta(seconds=STALLED_SECONDS):
        return None
    count = PendingChange.objects.filter(recorded__lte=now - timedelta(seconds=STALLED_SECONDS)).count()
    current = mode()
    if current.name == CELERY:
        why = (f"they are queued for Celery workers ({current.reason}) and none has processed them: is a worker "
               "running (celery -A <your project> worker)?")
    else:
        every = catch_up_seconds()
        looks = f"at its first request and every {every:g} seconds" if every else "at its first request"
        why = (f"this site processes them in its own process ({current.reason}), on a thread after each commit and, "
               f"in a process that serves requests, {looks}; that has not happened: the log of the site's process "
               "says why (logger django_resourcesync)")
    return Stalled(count, oldest, why)
