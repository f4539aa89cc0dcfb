"""Benchmark: a 1 GiB Resource Dump package downloaded from uvicorn, from gunicorn and from nginx.

Run from the repository root (nginx must be installed: ``apt-get install nginx``; the project's
tests never need it, only this script)::

    .venv/bin/python benchmarks/asgi_download.py                  # 1 GiB, 5 rounds
    .venv/bin/python benchmarks/asgi_download.py --rounds 9 --requests 3000

Setup (not timed): a fresh temporary ``EXAMPLE_VAR_DIR`` (the example project, SQLite, files on
the filesystem, the embedded mode), three items, and a fourth whose one file is of ``--size-gb``
GiB (sparse, but for its offset written every 64 KiB); the ``bitstreams`` set offers a Resource
Dump, built by ``resourcesync_rebuild``: its largest package (the big file, and a little more)
is the one downloaded.

Then three servers, each a process of its own on a free port of the loopback interface:

- **uvicorn** (``uvicorn example_project.asgi:application``, one process, with uvloop and
  httptools where they are installed: ``uvicorn[standard]``);
- **gunicorn** (``gunicorn example_project.wsgi``, one worker, ``gthread`` with 4 threads);
- **nginx** (one worker, ``sendfile on``), with a configuration of this script's own in the
  temporary folder, serving the package's file from the documents' folder as a static file: the
  floor, no Python at all.

Each round downloads the package once from each server, in an order that turns round by round
(the machine is noisy; the rounds pair the figures). The client is curl (``-o /dev/null``) where
it is installed, else (or with ``--client python``) this script: one connection, ``recv_into`` a
buffer of 1 MiB, the bytes counted and dropped. The size is checked each time, and the sha-256 of
each server's bytes once, before the rounds, by this script. The CPU seconds each server spends
on each download are read from the system (user and system time, its children included). The
servers' resident memory (a server and its children) is sampled every 10 ms during their
downloads: its peak is printed beside what it held before the first one.

It prints each round's MB/s and CPU seconds, the medians, the ratios of the medians (uvicorn /
nginx, the target being at least 0.8; uvicorn / gunicorn; gunicorn / nginx), and each server's
memory.

Second part (``--requests``, 0 to skip): what it costs that the app's discovery middleware is
synchronous. Under ASGI, Django calls a synchronous-only middleware on a thread
(``sync_to_async``), and the rest of the chain back on the event loop (``async_to_sync``); the
other middleware of the example are both synchronous and asynchronous. In a process of its own
(Django set up with the example's settings, on the same database), Django's ASGI application is
called as an ASGI server calls it (a scope, ``receive`` and ``send``, on an asyncio event loop),
and its WSGI application as a WSGI server does, one ``GET /items/1/`` after another (a page the
middleware adds its Link to), with three lists of middleware in paired rounds: the example's;
the same without the discovery middleware; and the same with, in its place, a middleware that
does nothing and is synchronous only. The last two differ by the adaptation alone, the first
two by the middleware's whole cost (its lookup included). It prints the CPU time (every thread
of the process) and the wall time per request of each, and the differences. In process, with
no server and no network, the differences are not lost in the noise of a loaded machine.
MB = 10**6 bytes, MiB = 2**20 bytes, GiB = 2**30 bytes.
"""

import argparse
import hashlib
import http.client
import json
import os
import pwd
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _steps import ROOT, progress, stop_process  # noqa: E402

#: Run by ``manage.py shell`` once the big file is in the media folder, as ``items/big.bin``.
SETUP = """
import json
from django.core.management import call_command
from django_resourcesync.models import Document, ResourceSet
from example_project.repository.models import Collection, Item, ItemFile

call_command("seed_repository", items=3, verbosity=0)
ResourceSet.objects.filter(slug="bitstreams").update(capabilities=["resourcelist", "changelist", "resourcedump"])
item = Item.objects.create(collection=Collection.objects.order_by("pk").first(), title="A big file")
ItemFile.objects.create(item=item, name="big.bin", file="items/big.bin", media_type="application/octet-stream")
call_command("resourcesync_rebuild", verbosity=0)
package = Document.objects.filter(media_type="application/zip", build__status="published").order_by("-size").first()
print(json.dumps({"name": package.name, "storage_name": package.storage_name, "sha256": package.sha256}))
"""


def write_big_file(path, size):
    """``size`` bytes at ``path``: a hole but for the offset, written every 64 KiB (cheap to make,
    and a byte sent from the wrong place would show in the package's hash)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    marks = range(0, max(size - 16, 0), 64 * 1024)
    with open(path, "wb") as handle:
        handle.truncate(size)
        for offset in marks:
            handle.seek(offset)
            handle.write(offset.to_bytes(8, "big") + (size - offset).to_bytes(8, "big"))


#: A middleware that does nothing and is synchronous only, as the discovery middleware is.
PASSTHROUGH = """
class Passthrough:
    sync_capable, async_capable = True, False

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)
"""

NGINX = """
{user}daemon off;
worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/nginx-error.log;
events {{ worker_connections 64; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    default_type application/zip;
    client_body_temp_path {folder}/tmp;
    proxy_temp_path {folder}/tmp;
    fastcgi_temp_path {folder}/tmp;
    uwsgi_temp_path {folder}/tmp;
    scgi_temp_path {folder}/tmp;
    server {{
        listen 127.0.0.1:{port};
        location = {path} {{ alias {file}; }}
    }}
}}
"""


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers(port, path):
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("HEAD", path)
        return connection.getresponse().status == 200
    except OSError:
        return False


class Server:
    def __init__(self, name, command, env, folder, port, path):
        self.name, self.port, self.path = name, port, path
        self.log = folder / f"{name}.log"
        with open(self.log, "wb") as output:
            self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not answers(port, path):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name} did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def rss(self):
        import psutil

        try:
            parent = psutil.Process(self.process.pid)
            return sum(p.memory_info().rss for p in [parent, *parent.children(recursive=True)])
        except psutil.Error:
            return 0

    def cpu(self):
        """CPU seconds the server (and its children) have spent so far, user and system."""
        import psutil

        parent = psutil.Process(self.process.pid)
        return sum(sum(p.cpu_times()[:2]) for p in [parent, *parent.children(recursive=True)])

    def stop(self):
        stop_process(self.process)


class Memory:
    """The peak of a server's resident memory while ``with`` it, sampled every 10 ms."""

    def __init__(self, server):
        self.server, self.peak = server, 0

    def __enter__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while True:
            self.peak = max(self.peak, self.server.rss())
            if self._stop.wait(0.01):
                return

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def download(port, path, digest=None):
    """GET ``path`` on one connection: ``(seconds, bytes of the body)``; the body goes into
    ``digest`` if given, else nowhere."""
    buffer = bytearray(1024 * 1024)
    view = memoryview(buffer)
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            received = sock.recv(65536)
            if not received:
                raise RuntimeError(f"no answer from port {port}")
            head += received
        head, body = head.split(b"\r\n\r\n", 1)
        status = head.split(b" ", 2)[1]
        if status != b"200":
            raise RuntimeError(f"port {port} answered {head.decode(errors='replace')}")
        length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")))
        if digest is not None:
            digest.update(body)
        got = len(body)
        while got < length:
            n = sock.recv_into(view)
            if not n:
                break
            if digest is not None:
                digest.update(view[:n])
            got += n
    return time.perf_counter() - started, got


def download_with_curl(port, path):
    """GET ``path`` with curl, the body written nowhere: ``(seconds, bytes of the body)``."""
    done = subprocess.run(["curl", "-s", "-o", os.devnull, "-w", "%{http_code} %{size_download} %{time_total}",
                           f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True, check=True)
    status, got, seconds = done.stdout.split()
    if status != "200":
        raise RuntimeError(f"port {port} answered {status}")
    return float(seconds), int(got)


def set_up(folder, size):
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "CELERY_BROKER_URL", "AWS_STORAGE_BUCKET_NAME")}
    env.update(EXAMPLE_VAR_DIR=str(folder / "var"), DJANGO_SETTINGS_MODULE="example_project.settings",
               PYTHONPATH=os.pathsep.join([str(folder), str(ROOT)]), HOME=str(folder))

    def manage(*args):
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True, capture_output=True,
                              text=True).stdout

    progress("migrating, seeding, building the package")
    manage("migrate", "--no-input")

    write_big_file(folder / "var" / "media" / "items" / "big.bin", size)
    facts = json.loads(manage("shell", "-c", SETUP).strip().splitlines()[-1])
    (folder / "bench_passthrough.py").write_text(PASSTHROUGH)
    return env, facts


def start_python_servers(env, folder, path):
    python = sys.executable
    uvicorn_port, gunicorn_port = free_port(), free_port()
    return [
        Server("uvicorn", [python, "-m", "uvicorn", "example_project.asgi:application", "--host", "127.0.0.1",
                           "--port", str(uvicorn_port), "--no-access-log"], env, folder, uvicorn_port, path),
        Server("gunicorn", [python, "-m", "gunicorn", "example_project.wsgi", "--bind", f"127.0.0.1:{gunicorn_port}",
                            "--workers", "1", "--worker-class", "gthread", "--threads", "4"], env, folder, gunicorn_port, path),
    ]


def start_nginx(folder, package_file, path):
    nginx = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)
    if nginx is None:
        raise SystemExit("nginx is not installed: apt-get install nginx (the benchmark needs it, the tests do not)")
    (folder / "tmp").mkdir(exist_ok=True)
    port = free_port()
    # Run by root, nginx's workers would be "nobody", who may not read a temporary folder.
    user = f"user {pwd.getpwuid(os.geteuid()).pw_name};\n" if os.geteuid() == 0 else ""
    config = folder / "nginx.conf"
    config.write_text(NGINX.format(user=user, folder=folder, port=port, path=path, file=package_file))
    return Server("nginx", [nginx, "-c", str(config), "-p", str(folder)], None, folder, port, path)


def downloads(servers, rounds, size, expected, client):
    for server in servers:
        digest = hashlib.sha256()
        _, got = download(server.port, server.path, digest)
        if got != size or digest.hexdigest() != expected:
            raise SystemExit(f"{server.name} sent {got} bytes, sha-256 {digest.hexdigest()}: not the package")
    before = {server.name: server.rss() for server in servers}
    memory = {server.name: Memory(server) for server in servers}
    speeds = {server.name: [] for server in servers}
    cpu = {server.name: [] for server in servers}
    print(f"\nDownloads of the package ({size / 2**30:.2f} GiB), MB/s (and the server's CPU seconds):")
    print("round  " + "  ".join(f"{server.name:>16}" for server in servers))
    for number in range(rounds):
        turn = number % len(servers)
        for server in servers[turn:] + servers[:turn]:
            spent = server.cpu()
            with memory[server.name]:
                seconds, got = client(server.port, server.path)
            cpu[server.name].append(server.cpu() - spent)
            if got != size:
                raise SystemExit(f"{server.name} sent {got} bytes of {size}")
            speeds[server.name].append(size / seconds / 1e6)
        print(f"{number + 1:>5}  " + "  ".join(f"{speeds[s.name][-1]:>9.0f} ({cpu[s.name][-1]:4.2f})" for s in servers))
    medians = {name: statistics.median(values) for name, values in speeds.items()}
    print("median " + "  ".join(f"{medians[s.name]:>9.0f} ({statistics.median(cpu[s.name]):4.2f})" for s in servers))
    print(f"\nuvicorn / nginx:    {medians['uvicorn'] / medians['nginx']:.2f} (target: at least 0.8)")
    print(f"uvicorn / gunicorn: {medians['uvicorn'] / medians['gunicorn']:.2f}")
    print(f"gunicorn / nginx:   {medians['gunicorn'] / medians['nginx']:.2f}")
    print("\nResident memory (the server and its children), MiB: before the first download, peak during them")
    for server in servers:
        name = server.name
        print(f"  {name:<9} {before[name] / 2**20:7.1f}  {memory[name].peak / 2**20:7.1f}  "
              f"(+{(memory[name].peak - before[name]) / 2**20:.1f})")


DISCOVERY = "django_resourcesync.discovery.ResourceSyncLinkMiddleware"
PAGE = "/items/1/"


async def asgi_requests(handler, count):
    """``count`` GETs of PAGE through ``handler`` (Django's ASGI application), as an ASGI server
    sends them, one after another."""
    import asyncio

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": PAGE, "raw_path": PAGE.encode(), "query_string": b"", "headers": [(b"host", b"127.0.0.1:8000")],
        "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000),
    }
    for _ in range(count):
        statuses, asked, never = [], [], asyncio.Event()

        async def receive():
            if not asked:
                asked.append(True)
                return {"type": "http.request", "body": b"", "more_body": False}
            await never.wait()  # the client stays connected

        async def send(message):
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        await handler(dict(scope), receive, send)
        if statuses != [200]:
            raise SystemExit(f"{PAGE} answered {statuses}")


def wsgi_requests(handler, count):
    """The same through Django's WSGI application."""
    import io

    environ = {
        "REQUEST_METHOD": "GET", "PATH_INFO": PAGE, "QUERY_STRING": "", "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1", "HTTP_HOST": "127.0.0.1:8000", "REMOTE_ADDR": "127.0.0.1", "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr, "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
    }
    statuses = []
    for _ in range(count):
        body = handler({**environ, "wsgi.input": io.BytesIO()}, lambda status, headers: statuses.append(status))
        for _chunk in body:
            pass
        body.close()
    if set(statuses) != {"200 OK"}:
        raise SystemExit(f"{PAGE} answered {set(statuses)}")


def child_adaptation(requests, rounds):
    """In this process, Django set up with the example's settings: the CPU time and the wall time
    per request, of each middleware list under ASGI and WSGI, as JSON on the standard output."""
    import asyncio

    import django

    django.setup()
    from django.conf import settings
    from django.core.handlers.asgi import ASGIHandler
    from django.core.handlers.wsgi import WSGIHandler
    from django.test.utils import override_settings

    example = list(settings.MIDDLEWARE)
    without = [name for name in example if name != DISCOVERY]
    variants = {"example": example, "without": without, "no-op": ["bench_passthrough.Passthrough", *without]}
    handlers = {}
    for label, middleware in variants.items():
        with override_settings(MIDDLEWARE=middleware):
            handlers[label, "ASGI"], handlers[label, "WSGI"] = ASGIHandler(), WSGIHandler()

    def batch(key, count):
        handler = handlers[key]
        if key[1] == "ASGI":
            asyncio.run(asgi_requests(handler, count))
        else:
            wsgi_requests(handler, count)

    for key in handlers:
        batch(key, 50)  # warm up
    cpu, wall = {key: [] for key in handlers}, {key: [] for key in handlers}
    keys = list(handlers)
    for number in range(rounds):
        turn = number % len(keys)
        for key in keys[turn:] + keys[:turn]:
            cpu_started, started = time.process_time(), time.perf_counter()
            batch(key, requests)
            cpu[key].append((time.process_time() - cpu_started) / requests)
            wall[key].append((time.perf_counter() - started) / requests)
    print(json.dumps([[*key, statistics.median(cpu[key]), statistics.median(wall[key])] for key in keys]))


def adaptation(env, rounds, requests):
    progress(f"the middleware, in process: {requests} requests a round")
    done = subprocess.run([sys.executable, __file__, "--child-adaptation", "--rounds", str(rounds), "--requests", str(requests)],
                          cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    figures = {(label, kind): (cpu * 1e6, wall * 1e6) for label, kind, cpu, wall in json.loads(done.stdout.splitlines()[-1])}
    print(f"\nGET {PAGE} through Django's handlers, in one process ({requests} a round, {rounds} rounds), "
          "medians of the rounds: µs per request, CPU (all threads) and wall:")
    print(f"{'middleware':<44}{'ASGI CPU':>10}{'wall':>8}{'WSGI CPU':>10}{'wall':>8}")
    labels = {"example": "the example's", "without": "the example's without the discovery one",
              "no-op": "... and a synchronous-only no-op instead"}
    for label, text in labels.items():
        print(f"{text:<44}{figures[label, 'ASGI'][0]:>10.0f}{figures[label, 'ASGI'][1]:>8.0f}"
              f"{figures[label, 'WSGI'][0]:>10.0f}{figures[label, 'WSGI'][1]:>8.0f}")
    for kind in ("ASGI", "WSGI"):
        print(f"{kind}: the discovery middleware costs {figures['example', kind][0] - figures['without', kind][0]:+.0f} µs "
              f"of CPU a request; a synchronous-only middleware that does nothing "
              f"{figures['no-op', kind][0] - figures['without', kind][0]:+.0f} µs")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="GiB in the big file (default 1)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000, help="requests a round in the second part (0: skip it)")
    parser.add_argument("--client", choices=["curl", "python"], default="curl" if shutil.which("curl") else "python",
                        help="what downloads: curl (the default, where it is installed), or this script")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--child-adaptation", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child_adaptation:
        return child_adaptation(options.requests, options.rounds)
    folder = Path(tempfile.mkdtemp(prefix="asgi-download-"))
    servers = []
    try:
        env, facts = set_up(folder, int(options.size_gb * 2**30))
        path = f"/resourcesync/bitstreams/{facts['name']}"
        package_file = folder / "var" / "resourcesync" / facts["storage_name"]
        size = package_file.stat().st_size
        servers = start_python_servers(env, folder, path) + [start_nginx(folder, package_file, path)]
        progress("servers up: " + ", ".join(f"{s.name} on {s.port}" for s in servers))
        client = download_with_curl if options.client == "curl" else download
        progress(f"client: {options.client}")
        downloads(servers, options.rounds, size, facts["sha256"], client)
        for server in servers:
            server.stop()
        servers = []
        if options.requests:
            adaptation(env, options.rounds, options.requests)
    finally:
        for server in servers:
            server.stop()
        if options.keep:
            print(f"\n(kept: {folder})")
        else:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
