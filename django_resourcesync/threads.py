"""How many threads may share a long piece of work done in one process (the command, eager
mode), each on a database connection of its own."""

from django.db import connections

from .conf import app_settings


def available(using):
    """``BUILD_THREADS`` on PostgreSQL, where most of the work is the server's (and the
    storage's) while the interpreter is free; one inside a transaction, whose uncommitted rows
    another connection would not see, and on other databases. (On SQLite in write-ahead-log
    mode its readers could go on beside a writer, but were measured no faster: a Resource
    List's parts no faster, a reconcile a tenth faster for half as much CPU again, its queries
    calling back into the interpreter for the functions Django gives SQLite.)"""
    connection = connections[using]
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return 1
    return app_settings.BUILD_THREADS
