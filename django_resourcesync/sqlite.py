"""SQLite as the embedded default runs it: writers that wait their turn.

With the app's threads (the processing of changes, the push runner) a site on SQLite has more than
one writer in a process. SQLite lets one connection write at a time, and a transaction that began
by reading and then writes fails at once with "database is locked" when another connection wrote
meanwhile; it does not wait. So, unless the site's ``DATABASES`` options choose otherwise, every
SQLite connection of the process (files, not in-memory databases) is opened with:

- transactions that take the write lock when they begin (``BEGIN IMMEDIATE``, Django's
  ``"transaction_mode": "IMMEDIATE"``), so that a writer waits for the other to commit instead
  of failing;
- the write-ahead log (``PRAGMA journal_mode = WAL``), so that readers never wait for a writer,
  nor a writer for readers;
- a busy timeout of :data:`BUSY_TIMEOUT_SECONDS` (Python's default is 5 seconds) for the writer
  that waits.

A site that sets ``"transaction_mode"``, ``"timeout"``, or a ``journal_mode`` in its
``"init_command"`` keeps its own choice for it.
"""

import logging
import sqlite3

from django.db.backends.signals import connection_created

logger = logging.getLogger(__name__)

BUSY_TIMEOUT_SECONDS = 30


def _options(connection):
    return connection.settings_dict.get("OPTIONS") or {}


def tuned(connection):
    """Whether :func:`tune` applies to ``connection``: a SQLite database in a file."""
    return connection.vendor == "sqlite" and not connection.is_in_memory_db()


def takes_the_lock_at_begin(connection):
    """Whether a transaction of ``connection`` (SQLite) takes the write lock when it begins."""
    if connection.connection is not None:  # open: as it was opened (before the app was ready, say)
        return str(connection.transaction_mode or "").upper() in ("IMMEDIATE", "EXCLUSIVE")
    options = _options(connection)
    if "transaction_mode" in options:
        return str(options["transaction_mode"] or "").upper() in ("IMMEDIATE", "EXCLUSIVE")
    return tuned(connection)


def tune(sender, connection, **kwargs):
    if not tuned(connection):
        return
    options = _options(connection)
    if "transaction_mode" not in options:
        connection.transaction_mode = "IMMEDIATE"
    raw = connection.connection
    if "timeout" not in options:
        raw.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_SECONDS * 1000}")
    if "journal_mode" in str(options.get("init_command") or "").lower():
        return
    try:
        # The mode is kept in the file: switched once (which needs the database to itself),
        # then only read.
        if str(raw.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
            raw.execute("PRAGMA journal_mode = WAL")
    except sqlite3.Error as exc:  # a read-only file, a busy database: it keeps its journal
        logger.warning("SQLite database %s keeps its journal mode: %s", connection.settings_dict.get("NAME"), exc)


def connect():
    connection_created.connect(tune, dispatch_uid="resourcesync_sqlite_tune")
