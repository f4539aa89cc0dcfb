"""Benchmark: push. Latency from a save's commit to the delivery of its change notification at a
subscriber, and deliveries per second to 100 subscribers.

Run from the repository root::

    .venv/bin/python benchmarks/push.py                               # embedded (SQLite, tasks in process)
    .venv/bin/python benchmarks/push.py --database-url postgres://postgres:postgres@127.0.0.1:5432/push_bench \\
        --broker-url redis://127.0.0.1:6379/14                        # and with a Celery worker

Subscribers run in a process of their own (``--child subscribers``): ``--subscribers`` HTTP
servers on loopback, each answering 202 to a POST and recording when it arrived (wall clock, the
same machine's). The Source is the example project with a fresh database (the PostgreSQL database
``--database-url`` names is dropped and created again), ``--items`` items, and
its ``metadata`` set offering ``change-notification``; the subscriptions are rows made directly
(verification of intent is not what is measured).

1. **Latency** (one subscriber): ``--rounds`` rounds, one after the other; each saves one item's
   title (autocommit: the save commits at once) and waits until its notification arrives. The
   latency is the arrival time minus the time just before ``save()``: it includes processing the
   change, recording the notification and delivering it. Embedded: tasks run in process (the
   processing in the saving thread, the notification in the app's thread). With a worker
   (``--database-url`` and ``--broker-url``): a ``celery worker`` process (prefork, 2 processes)
   does the processing and the delivery; the save only queues. Reported: median and p99, against
   the target (p99 under 2 s with a worker) and against the time of the save alone.
2. **Throughput** (``--subscribers`` subscribers): ``--notifications`` notifications are recorded
   (one change each) and delivered to every subscriber; timed from the first delivery queued to
   the last one done. Embedded: ``resourcesync.deliver`` run in this process (``HUB_DELIVERY_THREADS``
   at once). With a worker: queued to the worker. Compared with a plain client: the same number
   of POSTs of the same payload to the same subscribers by 16 threads of ``http.client``, no
   database, no signature: the machine's floor. Target: 500 deliveries a second.

Nothing is asserted: the script prints figures and ratios. At the end, also when the run fails
or is interrupted (Ctrl-C, SIGTERM), the subscribers' process and the worker are stopped, the
broker's Redis database is emptied, and the temporary folder (the SQLite database, the documents,
the subscribers' port file) and the PostgreSQL database are removed, unless ``--keep``.
"""

import argparse
import http.client
import http.server
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from _steps import database_name, progress, purge_broker, recreate_database, setup_django_example, stop_process

ROOT = Path(__file__).resolve().parent.parent
TARGET_P99 = 2.0
TARGET_RATE = 500


# --- the subscribers' process --------------------------------------------------------------


def run_subscribers(count, port_file):
    arrivals, lock = [], threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                arrivals.append(time.time())
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self):  # the control route: what arrived since an index
            since = int(self.path.rsplit("/", 1)[-1] or 0)
            with lock:
                body = json.dumps(arrivals[since:]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    servers = []
    for _ in range(count + 1):  # the last one is the control route
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    Path(port_file).write_text(json.dumps([server.server_address[1] for server in servers]))
    threading.Event().wait()


class Subscribers:
    """The subscribers' process; its port file is written in ``folder``."""

    def __init__(self, count, folder):
        ports = Path(folder) / "ports.json"
        self.process = subprocess.Popen([sys.executable, __file__, "--child", "subscribers", "--count", str(count),
                                         "--port-file", str(ports)])
        try:
            while not ports.exists() or not ports.read_text():
                if self.process.poll() is not None:
                    raise RuntimeError(f"the subscribers' process ended (exit status {self.process.returncode})")
                time.sleep(0.05)
        except BaseException:
            self.close()
            raise
        *callbacks, control = json.loads(ports.read_text())
        self.callbacks = [f"http://127.0.0.1:{port}/callback" for port in callbacks]
        self.control = f"http://127.0.0.1:{control}/since/"
        self.seen = 0

    def arrivals(self):
        with urllib.request.urlopen(self.control + str(self.seen), timeout=30) as answer:
            new = json.loads(answer.read())
        self.seen += len(new)
        return new

    def wait(self, count, timeout=120):
        found, deadline = [], time.monotonic() + timeout
        while len(found) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(found)} of {count} deliveries arrived")
            found += self.arrivals()
            if len(found) < count:
                time.sleep(0.002)
        return found

    def close(self):
        self.process.kill()
        self.process.wait()


# --- the Source ----------------------------------------------------------------------------


def setup(var_dir, database_url, broker_url):
    if database_url:
        recreate_database(database_url)  # its data migrations make the sets
    setup_django_example(var_dir, database_url, broker_url)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django_resourcesync.models import ResourceSet

    ResourceSet.objects.filter(slug="metadata").update(capabilities=["resourcelist", "changelist", "change-notification"])
    ResourceSet.objects.exclude(slug="metadata").update(enabled=False)


def subscribe(callbacks):
    from datetime import timedelta

    from django.utils import timezone

    from django_resourcesync.models import ResourceSet, Subscription

    resource_set = ResourceSet.objects.get(slug="metadata")
    Subscription.objects.all().delete()
    Subscription.objects.bulk_create([
        Subscription(resource_set=resource_set, capability="change-notification", callback=callback, lease_seconds=86400,
                     expires=timezone.now() + timedelta(days=1), secret="benchmark secret")
        for callback in callbacks
    ])


def latency(subscribers, rounds, wait_settled):
    from example_project.repository.models import Item

    subscribe(subscribers.callbacks[:1])
    item = Item.objects.filter(is_public=True).order_by("pk").first()
    found, saves = [], []
    for number in range(rounds):
        item.title = f"Round {number}"
        started = time.time()
        item.save()
        saves.append(time.time() - started)
        [arrived] = subscribers.wait(1)
        found.append(arrived - started)
        wait_settled()
    return found, saves


def prepare_throughput(subscribers, notifications):
    """Record ``notifications`` change notifications (one change each) to every subscriber,
    with their deliveries held back (due tomorrow): nothing delivers them before the run."""
    from datetime import timedelta

    from django.utils import timezone

    from django_resourcesync import tracking
    from django_resourcesync.models import Delivery
    from django_resourcesync.push import announce
    from django_resourcesync.tracking import outbox
    from example_project.repository.models import Item

    subscribe(subscribers.callbacks)
    items = list(Item.objects.filter(is_public=True).order_by("pk")[:notifications])
    made = []
    with _quiet_push():
        for number, item in enumerate(items):  # one change, one notification
            item.title = f"Throughput {number}"
            item.save()
            outbox.dispatcher.flush()  # with a broker, the save's row is written by the app's thread
            tracking.process_pending()
            made += announce.announce()
    deliveries = Delivery.objects.filter(notification__in=made)
    deliveries.update(next_attempt=timezone.now() + timedelta(days=1))
    return list(deliveries.order_by("pk").values_list("pk", flat=True)), made[0].payload.encode()


def throughput(subscribers, ids, deliver):
    from django.utils import timezone

    from django_resourcesync.models import Delivery

    Delivery.objects.filter(pk__in=ids).update(next_attempt=timezone.now())
    subscribers.arrivals()
    started = time.time()
    deliver(ids)
    arrived = subscribers.wait(len(ids), timeout=600)
    seconds = max(arrived) - started
    deadline = time.monotonic() + 60
    while (delivered := Delivery.objects.filter(pk__in=ids, state="delivered").count()) < len(ids):
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return seconds, delivered


class _quiet_push:
    """Record the changes without sending them (the throughput run delivers them itself)."""

    def __enter__(self):
        from django_resourcesync import push

        self.push, self.queue = push, push.queue
        push.queue = lambda *args, **kwargs: None

    def __exit__(self, *exc):
        self.push.queue = self.queue


def floor(callbacks, payload, total, threads=16):
    """``total`` POSTs of ``payload`` spread over ``callbacks``, ``threads`` at once: seconds."""
    def post(index):
        port = int(callbacks[index % len(callbacks)].split(":")[2].split("/")[0])
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("POST", "/callback", body=payload, headers={"Content-Type": "application/xml"})
        connection.getresponse().read()
        connection.close()

    started = time.time()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(post, range(total)))
    return time.time() - started


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def report_latency(name, found, saves):
    median, p99 = statistics.median(found), percentile(found, 0.99)
    print(f"latency, {name}: median {median * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms over {len(found)} saves "
          f"(the save alone: median {statistics.median(saves) * 1000:.1f} ms); p99 / target {TARGET_P99:.0f} s = "
          f"{p99 / TARGET_P99:.2f}")


def report_throughput(name, total, seconds, delivered, floor_seconds):
    rate = total / seconds
    print(f"throughput, {name}: {total} deliveries ({delivered} recorded delivered) in {seconds:.2f} s = {rate:.0f}/s; "
          f"plain client {total / floor_seconds:.0f}/s (ratio {rate / (total / floor_seconds):.2f}); "
          f"target {TARGET_RATE}/s: {'met' if rate >= TARGET_RATE else 'NOT met'}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--notifications", type=int, default=50)
    parser.add_argument("--database-url")
    parser.add_argument("--broker-url", help="Redis broker for the worker, emptied at the end")
    parser.add_argument("--child", choices=["subscribers"])
    parser.add_argument("--count", type=int)
    parser.add_argument("--port-file")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (and the PostgreSQL database)")
    options = parser.parse_args()
    if options.child == "subscribers":
        run_subscribers(options.count, options.port_file)
        return
    with_worker = bool(options.database_url and options.broker_url)
    database_url = options.database_url if with_worker else None
    # SIGTERM ends the run as Ctrl-C does: through the clean-up of the ExitStack.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    var_dir = tempfile.mkdtemp(prefix="push-bench-")
    with ExitStack() as cleanup:  # undone last to first, whatever happens
        cleanup.callback(clean_up, var_dir, database_url, options.keep)
        if with_worker:
            cleanup.callback(purge_broker, options.broker_url)  # after the worker stopped: what it left queued
        progress(f"setting up ({'PostgreSQL and a worker' if with_worker else 'embedded'}), {options.items} items")
        setup(var_dir, database_url, options.broker_url if with_worker else None)
        from django.core.management import call_command

        from django_resourcesync import push
        from django_resourcesync.models import ResourceSet
        from django_resourcesync.push import hub
        from django_resourcesync.rebuild import rebuild_set

        call_command("seed_repository", items=options.items, verbosity=0)
        rebuild_set(ResourceSet.objects.get(slug="metadata"))
        subscribers = Subscribers(options.subscribers, var_dir)
        cleanup.callback(subscribers.close)
        name = "with a worker" if with_worker else "embedded"
        progress(f"throughput: {options.notifications} notifications x {options.subscribers} subscribers")
        ids, payload = prepare_throughput(subscribers, options.notifications)
        if with_worker:
            env = {**os.environ, "EXAMPLE_VAR_DIR": var_dir}
            worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "example_project", "worker", "--concurrency=2",
                                       "--loglevel=WARNING"], cwd=ROOT, env=env)
            cleanup.callback(stop_process, worker)
            time.sleep(8)  # the worker connects and is ready

            def deliver(ids):
                from django_resourcesync.tasks import deliver_task

                for start in range(0, len(ids), options.subscribers):
                    deliver_task.delay(ids[start : start + options.subscribers])

            def settled():
                pass
        else:
            def deliver(ids):
                for start in range(0, len(ids), options.subscribers):
                    hub.deliver(ids[start : start + options.subscribers])

            def settled():
                push.runner.idle(timeout=30)
        seconds, delivered = throughput(subscribers, ids, deliver)
        floor_seconds = floor(subscribers.callbacks, payload, len(ids))
        subscribers.wait(len(ids), timeout=600)
        report_throughput(name, len(ids), seconds, delivered, floor_seconds)

        progress(f"latency: {options.rounds} saves")
        found, saves = latency(subscribers, options.rounds, settled)
        report_latency(name, found, saves)


def clean_up(var_dir, database_url, keep):
    """Remove the temporary folder and the database (closing this process's connections first)."""
    if keep:
        progress(f"kept {var_dir}" + (f" and the database {database_name(database_url)}" if database_url else ""))
        return
    from django.apps import apps

    if apps.ready:  # Django was set up
        from django.db import connections

        connections.close_all()
    if database_url:
        recreate_database(database_url, create=False)
    for _attempt in range(20):  # the app's threads may still be writing there (SQLite's journal)
        shutil.rmtree(var_dir, ignore_errors=True)
        if not os.path.exists(var_dir):
            break
        time.sleep(0.25)


if __name__ == "__main__":
    main()
