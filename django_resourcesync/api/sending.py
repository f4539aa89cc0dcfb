"""Sending a set's task from a request, and saying what became of it.

With a broker, the task is queued and the answer is its id (202). With tasks run in process
(``CELERY_TASK_ALWAYS_EAGER``: the demo, the tests) the work is done in the request, so the
answer says how it went (200): ``done`` with what it made, or ``failed`` with the reason in one
line (the traceback goes to the log, never to the client), never a 500. A broker that cannot be
reached is a 503: the task was not sent, and may be sent again.
"""

import logging

from celery.result import EagerResult
from django.db.models import Max
from kombu.exceptions import OperationalError as BrokerError
from rest_framework import status
from rest_framework.response import Response

from .. import running
from ..models import Build

logger = logging.getLogger(__name__)


def one_line(exc):
    """The first line of an error's message, or its class name if it says nothing."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _builds(query):
    return [
        {"id": build.pk, "capability": build.capability, "status": build.status, "entries": build.entries}
        for build in query.order_by("pk")
    ]


def send(task, resource_set, *, done):
    """Send ``task`` for ``resource_set`` and answer with what happened; ``done(result)`` makes
    the fields of the answer from the result of a task run in process."""
    eager = running.mode().in_process
    newest = Build.objects.aggregate(newest=Max("pk"))["newest"] or 0
    try:
        result = running.send(task, resource_set.pk)
        value = result.get() if isinstance(result, EagerResult) else None  # raises the task's error
    except BrokerError as exc:
        return _unreachable(task, resource_set, exc)
    except Exception as exc:
        if not eager:  # all delay() does then is to send it
            return _unreachable(task, resource_set, exc)
        logger.exception("Task %s for resource set %s failed", task.name, resource_set.slug)
        made = Build.objects.filter(resource_set=resource_set, pk__gt=newest)
        return Response({"state": "failed", "reason": one_line(exc), "builds": _builds(made)})
    if isinstance(result, EagerResult) or eager:
        return Response({"state": "done", **done(value)})
    return Response({"task_id": result.id, "state": "queued"}, status=status.HTTP_202_ACCEPTED)


def _unreachable(task, resource_set, exc):
    logger.warning("Task %s for resource set %s could not be sent: %s", task.name, resource_set.slug, exc)
    return Response(
        {"detail": f"The task could not be sent to the workers (is the broker running?): {one_line(exc)}"},
        status=status.HTTP_503_SERVICE_UNAVAILABLE,
    )


def rebuilt(summary):
    """The answer's fields for ``resourcesync.rebuild_set``: the builds it made."""
    return {
        "builds": [
            {"id": made["build"], "capability": made["capability"], "status": made["status"], "entries": made["entries"]}
            for made in summary or []
        ]
    }


def reconciled(summary):
    """The answer's fields for ``resourcesync.reconcile_set``: what it found."""
    return {"summary": summary or ""}
