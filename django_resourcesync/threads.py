"""How many threads may share a long piece of work done in one process (the command, eager
mode), each on a database connection of its own."""

from django.db import connections

from .conf import app_settings


def available(using):
    """``BUILD_THREADS`` on PostgreSQL, where most of the work is the server's (and the
    storage's) while the interpreter is free; one inside a transaction, whose uncommitted rows
    another connection would not see, and on other databases. (On SQLite in write-ahead-log
    mode readers could go on beside each other, but a Resource List's parts were measured no
    faster: rendering them is the interpreter's work, which two threads take turns at. A
    reconcile's search is SQLite's own, and gets a thread there: :func:`beside_a_writer`.)"""
    connection = connections[using]
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return 1
    return app_settings.BUILD_THREADS


def beside_a_writer(using):
    """How many threads may read beside the one thread that writes what they find (the search of
    a reconcile for the objects that differ from their record), each on a connection of its own:
    :func:`available` on PostgreSQL; one on SQLite in write-ahead-log mode, where a reader goes on
    beside a writer, and the search runs inside the SQLite library, which lets the interpreter go
    to the writing thread; none (the writing thread reads too) inside a transaction, with
    ``BUILD_THREADS`` at 1, and in SQLite's other journal modes, where a reader holds up the
    writer's commits."""
    connection = connections[using]
    if connection.in_atomic_block or app_settings.BUILD_THREADS < 2:
        return 0
    if connection.vendor == "postgresql":
        return app_settings.BUILD_THREADS
    if connection.vendor == "sqlite" and _journal_mode(connection) == "wal":
        return 1
    return 0


def _journal_mode(connection):
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        return str(cursor.fetchone()[0]).lower()
