"""What the benchmark scripts share: each measured step runs in a fresh interpreter of its own
(so its peak RSS is its own), and hands its figures back as a JSON file."""

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def peak_rss_kib():
    """Peak RSS of this process so far (``ru_maxrss`` is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def current_rss_kib():
    """Current RSS of this process, from /proc (falls back to the peak elsewhere)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return peak_rss_kib()


def mib(kib):
    return kib / 1024


def cpu_times():
    """``{"user": ..., "sys": ...}``: the CPU seconds this process (all its threads) and the
    children it has waited for (and theirs) have spent so far. The difference of two readings is
    what a step cost the CPU, whether it ran here or in a program it started."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"user": own.ru_utime + children.ru_utime, "sys": own.ru_stime + children.ru_stime}


def cpu_since(before):
    """The CPU seconds spent since the reading ``before`` of :func:`cpu_times`."""
    now = cpu_times()
    return {kind: now[kind] - before[kind] for kind in now}


def run_child(script, role, result_dir, *args, tag=""):
    """Run step ``role`` of ``script`` in a fresh interpreter; return its JSON result."""
    result = Path(result_dir) / f"{role}{tag}-{time.monotonic_ns()}.json"
    command = [sys.executable, str(Path(script).resolve()), "--child", role, "--result", str(result)]
    command += ["--arg=" + json.dumps(arg) for arg in args]
    subprocess.run(command, check=True, cwd=ROOT)
    return json.loads(result.read_text())


def add_child_arguments(parser, children):
    parser.add_argument("--child", choices=sorted(children), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--arg", action="append", default=[], help=argparse.SUPPRESS)


def run_as_child(options, children):
    """If this interpreter was started as a step, run it, write its result and say so."""
    if not options.child:
        return False
    result = children[options.child](*(json.loads(arg) for arg in options.arg))
    Path(options.result).write_text(json.dumps(result))
    return True


def raw_read(rows):
    """Read every row of the queryset ``rows`` through a DB-API cursor, its SQL as Django writes
    it (psycopg's own cursor on PostgreSQL, past Django's wrapper); returns the row count. The
    limit a pass over the same rows is measured against."""
    from django.db import connections

    sql, params = rows.query.sql_with_params()
    connection = connections[rows.db]
    with connection.cursor() as cursor:
        (cursor.cursor if connection.vendor == "postgresql" else cursor).execute(sql, params)
        count = 0
        while chunk := cursor.fetchmany(10_000):
            count += len(chunk)
        return count


def best_of(runs, step):
    """``(the fastest of runs of step() in seconds, what its last run returned)``."""
    timings = []
    result = None
    for _ in range(runs):
        started = time.perf_counter()
        result = step()
        timings.append(time.perf_counter() - started)
    return min(timings), result


def profiled(func, *args, top, keys=("cumulative", "tottime"), **kwargs):
    """Call ``func`` under cProfile: ``{"seconds": ..., key: top functions as text, ...}``."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.runcall(func, *args, **kwargs)
    report = {"seconds": time.perf_counter() - started}
    for key in keys:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(key).print_stats(top)
        report[key] = out.getvalue()
    return report


def setup_django_sqlite(var_dir):
    """Django for a child step: the example project, its SQLite database and files in ``var_dir``."""
    import os

    os.environ["EXAMPLE_VAR_DIR"] = var_dir
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    os.environ.pop("DATABASE_URL", None)  # always the SQLite database in var_dir
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def setup_django_example(var_dir, database_url=None, broker_url=None, environ=None):
    """Django for a child step: the example project with its files (media, documents) in
    ``var_dir``; its SQLite database there too, or ``database_url``. Its tasks run in process,
    or are queued on the Celery broker ``broker_url``. ``environ``: more environment variables,
    each set or (a value of None) removed, such as ``PGOPTIONS``."""
    import os

    os.environ["EXAMPLE_VAR_DIR"] = var_dir
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    variables = {
        "DATABASE_URL": database_url,
        "CELERY_BROKER_URL": broker_url,
        "CELERY_RESULT_BACKEND": None,
        "AWS_STORAGE_BUCKET_NAME": None,
        **(environ or {}),
    }
    for name, value in variables.items():
        if value:
            os.environ[name] = value
        else:
            os.environ.pop(name, None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def database_name(database_url):
    """The name of the database ``database_url`` names."""
    from urllib.parse import urlsplit

    return urlsplit(database_url).path.lstrip("/")


def recreate_database(database_url, create=True):
    """Drop the PostgreSQL database ``database_url`` names (a throwaway one) and, with
    ``create``, create it afresh, through the server's ``postgres`` database. Returns the
    server's ``jit`` setting (on or off), which some benchmarks print."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg
    from psycopg import sql

    parts = urlsplit(database_url)
    name = database_name(database_url)
    with psycopg.connect(urlunsplit(("postgresql", parts.netloc, "/postgres", "", "")), autocommit=True) as connection:
        connection.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if create:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return connection.execute("SHOW jit").fetchone()[0]


def purge_broker(broker_url):
    """Empty the Redis database ``broker_url`` names (the tasks a step left queued)."""
    try:
        import redis
    except ImportError:
        from urllib.parse import urlsplit

        db = urlsplit(broker_url).path.lstrip("/") or "0"
        subprocess.run(["redis-cli", "-n", db, "flushdb"], check=True, stdout=subprocess.DEVNULL)
    else:
        redis.Redis.from_url(broker_url).flushdb()


def stop_process(process, timeout=60):
    """Ask a child process to end (SIGTERM), and kill it if it has not within ``timeout`` s."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def progress(message):
    """A line on stderr, with the time: where a long run is."""
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
