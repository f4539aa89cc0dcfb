"""The example project served as a site serves it: under an ASGI server (uvicorn, running
``example_project.asgi``) and a WSGI server (gunicorn, running ``example_project.wsgi``), each a
process of its own, over real HTTP. Both serve the same site (SQLite and files in a folder of
their own, the embedded mode), whose files set offers a Resource Dump with a package of 300 MB.

Under both, that package is downloaded whole and by ranges, byte for byte, while the server's
memory stays flat; a HEAD reads none of it, and a client that goes away mid-download has the file
closed; every other document answers the same under both. Under uvicorn, a save through the
admin is processed and pushed to a subscriber by the app's own threads.

Last, in process, Django's ``AsyncClient`` (an ASGI request) gets an asynchronous iterator from
the views, on the local storage and on S3.
"""

import hashlib
import http.client
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import tracemalloc
import urllib.parse
import urllib.request
import warnings
from http.cookiejar import CookieJar
from pathlib import Path

import lxml.html
import psutil
import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient

from django_resourcesync import streaming
from django_resourcesync.rebuild import rebuild_set

from .helpers import free_port
from .test_embedded import Site
from .test_push import wait_for
from .websub import Subscriber
from .xmlcheck import RS, SM, check_document, entries, md

try:  # the S3 endpoint's fixtures (test_s3 skips where boto3 is missing)
    from .test_s3 import s3_documents, s3_endpoint  # noqa: F401
except pytest.skip.Exception:
    pass

#: Past 256 MB, and not a whole number of chunks.
BIG = 300 * 1024 * 1024 + 12345
#: What a server may grow by while it sends it (it would grow by the package's size if it held it).
MEMORY_BOUND = 100 * 1024 * 1024
#: What Django says when it reads a whole streamed response into memory to send it.
BUFFERED = "StreamingHttpResponse must consume"
ADMIN_PASSWORD = "a pass phrase for this test only"

SETUP = """
import json, struct
from django.contrib.auth.models import User
from django.core.files.base import ContentFile
from django.core.management import call_command
from django_resourcesync import access
from django_resourcesync.models import Document, ResourceSet
from example_project.repository.models import Collection, Item, ItemFile

call_command("seed_repository", items=3, verbosity=0)
files = ResourceSet.objects.get(slug="bitstreams")
files.capabilities = ["resourcelist", "changelist", "resourcedump"]
files.save()
records = ResourceSet.objects.get(slug="metadata")
records.capabilities = ["resourcelist", "changelist", "changedump", "change-notification"]
records.prior_versions = True
records.save()
item = Item.objects.create(collection=Collection.objects.order_by("pk").first(), title="A big file")
row = ItemFile(item=item, name="big.bin", media_type="application/octet-stream")
row.file.save("big.bin", ContentFile(b""), save=False)
# Sparse but for its offset written every 64 KiB: a byte sent from the wrong place shows.
with open(row.file.path, "r+b") as handle:
    handle.truncate({size})
    for offset in range(0, {size} - 16, 64 * 1024):
        handle.seek(offset)
        handle.write(struct.pack(">QQ", offset, {size} - offset))
row.save()
call_command("resourcesync_rebuild", verbosity=0)
first = Item.objects.order_by("pk").first()
first.title = "Changed once: a memento"
first.save()
User.objects.create_superuser("admin", "admin@example.org", {password!r})
_, token = access.issue("A partner", [ResourceSet.objects.get(slug="all-records")])
package = Document.objects.filter(media_type="application/zip", build__status="published").order_by("-size").first()
small = first.files.order_by("pk").first()
print(json.dumps({{"token": token, "package": package.storage_name, "big": row.file.path, "item": first.pk,
                  "big_url": f"/items/{{item.pk}}/files/{{row.pk}}/big.bin",
                  "small_url": f"/items/{{first.pk}}/files/{{small.pk}}/{{small.name}}"}}))
"""


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(8 * 1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


class Server:
    """A server process (and its workers), its address and its log."""

    def __init__(self, name, port, command, env, log):
        self.name, self.port, self.log = name, port, log
        with open(log, "wb") as output:
            self.process = subprocess.Popen(command, cwd=Site.root, env=env, stdout=output, stderr=subprocess.STDOUT)

    def processes(self):
        parent = psutil.Process(self.process.pid)
        return [parent, *parent.children(recursive=True)]

    def rss(self):
        return sum(process.memory_info().rss for process in self.processes())

    def read_chars(self):
        """Bytes the processes have read (files, sockets, pipes) since they started."""
        return sum(process.io_counters().read_chars for process in self.processes())

    def open_paths(self):
        return {os.path.realpath(f.path) for process in self.processes() for f in process.open_files()}

    def said(self, since=0):
        return self.log.read_bytes()[since:].decode(errors="replace")

    def request(self, method, path, headers=None, into=None, stop_after=None):
        """``(status, headers with lower-case names, body)``; with ``into``, the body goes into
        that hash instead, and ``body`` is its length."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            connection.request(method, path, headers=headers or {})
            response = connection.getresponse()
            found = {name.lower(): value for name, value in response.getheaders()}
            if into is None:
                return response.status, found, response.read()
            length = 0
            while chunk := response.read(1024 * 1024):
                into.update(chunk)
                length += len(chunk)
            return response.status, found, length
        finally:
            connection.close()


class Peak:
    """How much a server's memory grows above what it held at the start, at its highest, looked
    at every 10 ms."""

    def __init__(self, server):
        self.server = server

    def __enter__(self):
        self.baseline = self.peak = self.server.rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self.server.rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def growth(self):
        return self.peak - self.baseline


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = Site(tmp_path_factory.mktemp("asgi-site"))
    site.ports = {"uvicorn": free_port(), "gunicorn": free_port()}
    site.base = f"http://127.0.0.1:{site.ports['uvicorn']}"
    # Every occurrence of the buffering warning is logged, not only the first.
    site.env.update(RESOURCESYNC_BASE_URL=site.base, PYTHONWARNINGS=f"always:{BUFFERED}")
    site.env.pop("AWS_STORAGE_BUCKET_NAME", None)  # the documents in the site's folder, where the test reads them
    site.manage("migrate", "--no-input")
    said = site.manage("shell", "-c", SETUP.format(size=BIG, password=ADMIN_PASSWORD)).stdout
    site.facts = json.loads(said.strip().splitlines()[-1])
    site.package = Path(site.folder, "resourcesync", site.facts["package"])
    site.package_sha256 = sha256_of(site.package)
    site.big_sha256 = sha256_of(site.facts["big"])
    return site


@pytest.fixture(scope="module")
def servers(site):
    """uvicorn and gunicorn (gthread workers, as docs/deployment.rst has it), on the same site."""
    pytest.importorskip("uvicorn")
    pytest.importorskip("gunicorn")
    python = sys.executable
    commands = {
        "uvicorn": [python, "-m", "uvicorn", "example_project.asgi:application", "--host", "127.0.0.1",
                    "--port", str(site.ports["uvicorn"]), "--no-access-log"],
        "gunicorn": [python, "-m", "gunicorn", "example_project.wsgi", "--bind", f"127.0.0.1:{site.ports['gunicorn']}",
                     "--workers", "1", "--worker-class", "gthread", "--threads", "4"],
    }
    started = {}
    try:
        for name, command in commands.items():
            # HOME: where gunicorn puts its control socket.
            server = started[name] = Server(name, site.ports[name], command, {**site.env, "HOME": str(site.folder)},
                                            site.folder / f"{name}.log")
            up = wait_for(lambda: server.process.poll() is not None or _answers(server), timeout=60)
            assert up and server.process.poll() is None, server.said()[-3000:]
        yield started
    finally:
        for server in started.values():
            server.process.terminate()
        for server in started.values():
            server.process.wait(timeout=30)


def _answers(server):
    try:
        return server.request("GET", "/.well-known/resourcesync")[0] == 200
    except OSError:
        return False


def path_of_site(site, uri):
    assert uri.startswith(site.base + "/"), uri
    return uri[len(site.base):]


@pytest.fixture
def resource_dump(site, servers):
    """The paths of the Resource Dump's package and of its manifest, as the Resource Dump lists them."""
    status, _, body = servers["uvicorn"].request("GET", "/resourcesync/bitstreams/resourcedump.xml")
    assert status == 200
    (entry,) = entries(check_document(body, "resourcedump"))
    (contents,) = [ln.get("href") for ln in entry.findall(f"{{{RS}}}ln") if ln.get("rel") == "contents"]
    return path_of_site(site, entry.find(f"{{{SM}}}loc").text), path_of_site(site, contents)


SERVERS = pytest.mark.parametrize("name", ["uvicorn", "gunicorn"])


@SERVERS
def test_a_package_past_256_mb_is_downloaded_whole_and_by_ranges_in_flat_memory(site, servers, resource_dump, name):
    server, (package, _) = servers[name], resource_dump
    size = site.package.stat().st_size
    assert size > 256 * 1024 * 1024
    said_before = len(server.said())
    with Peak(server) as memory:
        whole = hashlib.sha256()
        status, headers, length = server.request("GET", package, into=whole)
        assert (status, length, headers["content-length"], headers["content-type"]) == (200, size, str(size), "application/zip")
        assert whole.hexdigest() == site.package_sha256 == headers["etag"].strip('"')

        # By ranges that cross the chunks' boundaries anywhere, the last one open-ended.
        pieces, step = hashlib.sha256(), 64 * 1024 * 1024 + 3
        for start in range(0, size, step):
            end = start + step - 1
            spec = f"bytes={start}-{end}" if end < size - 1 else f"bytes={start}-"
            status, headers, length = server.request("GET", package, {"Range": spec}, into=pieces)
            end = min(end, size - 1)
            assert (status, headers["content-range"], length) == (206, f"bytes {start}-{end}/{size}", end - start + 1)
        assert pieces.hexdigest() == site.package_sha256
        status, headers, tail = server.request("GET", package, {"Range": "bytes=-1000"})
        assert status == 206 and tail == site.package.read_bytes()[-1000:]
    assert memory.growth < MEMORY_BOUND, f"{name} grew by {memory.growth / 2**20:.0f} MiB sending {size / 2**20:.0f} MiB"
    assert BUFFERED not in server.said(said_before)


@SERVERS
def test_the_examples_file_view_streams_a_big_file_in_flat_memory(site, servers, name):
    server = servers[name]
    said_before = len(server.said())
    with Peak(server) as memory:
        digest = hashlib.sha256()
        status, headers, length = server.request("GET", site.facts["big_url"], into=digest)
    assert (status, length, headers["content-length"]) == (200, BIG, str(BIG))
    assert digest.hexdigest() == site.big_sha256
    assert headers["content-disposition"] == 'attachment; filename="big.bin"'
    assert headers["x-content-type-options"] == "nosniff" and "sandbox" in headers["content-security-policy"]
    assert memory.growth < MEMORY_BOUND, f"{name} grew by {memory.growth / 2**20:.0f} MiB sending {BIG / 2**20:.0f} MiB"
    assert BUFFERED not in server.said(said_before)


@SERVERS
def test_a_head_request_reads_no_byte_of_the_file(site, servers, resource_dump, name):
    server = servers[name]
    for path, size in ((resource_dump[0], site.package.stat().st_size), (site.facts["big_url"], BIG)):
        before = server.read_chars()
        status, headers, body = server.request("HEAD", path)
        read = server.read_chars() - before
        assert (status, headers["content-length"], body) == (200, str(size), b"")
        assert read < streaming.CHUNK_SIZE, f"{name} read {read} bytes to answer a HEAD of {path}"


@SERVERS
def test_a_client_that_goes_away_mid_download_has_the_file_closed(site, servers, resource_dump, name):
    server, stored = servers[name], os.path.realpath(site.package)
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(f"GET {resource_dump[0]} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        received = 0
        while received < 8 * 1024 * 1024:
            received += len(sock.recv(1024 * 1024))
        assert stored in server.open_paths()  # the download is under way
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset: gone at once
    assert wait_for(lambda: stored not in server.open_paths(), timeout=30), f"{name} kept the package open"


def _documents(site, servers, resource_dump):
    """``{(method, path, headers): expected status}`` of the site's documents and pages."""
    status, _, body = servers["uvicorn"].request("GET", "/resourcesync/metadata/changelist.xml")
    assert status == 200
    memento = path_of_site(site, next(ln.get("href") for entry in entries(check_document(body, "changelist"))
                                      for ln in entry.findall(f"{{{RS}}}ln") if ln.get("rel") == "memento"))
    item = site.facts["item"]
    package, manifest = resource_dump
    bearer = {"Authorization": f"Bearer {site.facts['token']}"}
    _, headers, _ = servers["uvicorn"].request("GET", "/resourcesync/bitstreams/resourcelist.xml")
    return {
        ("GET", "/.well-known/resourcesync", ()): 200,
        ("GET", "/resourcesync/bitstreams/capabilitylist.xml", ()): 200,
        ("GET", "/resourcesync/bitstreams/resourcelist.xml", ()): 200,
        ("HEAD", "/resourcesync/bitstreams/resourcelist.xml", ()): 200,
        ("GET", "/resourcesync/bitstreams/resourcelist.xml", (("Range", "bytes=10-99"),)): 206,
        ("GET", "/resourcesync/bitstreams/resourcelist.xml", (("If-None-Match", headers["etag"]),)): 304,
        ("GET", "/resourcesync/bitstreams/resourcelist.xml", (("Accept", "text/html"),)): 200,  # its page
        ("GET", "/resourcesync/bitstreams/resourcedump.xml", ()): 200,
        ("GET", manifest, ()): 200,
        ("GET", package, (("Range", "bytes=100-2000000"),)): 206,
        ("GET", package, (("Range", f"bytes={10**12}-"),)): 416,
        ("GET", "/resourcesync/metadata/changelist.xml", ()): 200,
        ("GET", f"/resourcesync/metadata/timegate/{item}", ()): 302,
        ("GET", memento, ()): 200,
        ("HEAD", memento, ()): 200,
        ("GET", f"/resourcesync/metadata/timemap/{item}", ()): 200,
        ("GET", f"/items/{item}/", ()): 200,  # with the discovery middleware's Link
        ("GET", f"/items/{item}/metadata.xml", ()): 200,
        ("GET", site.facts["small_url"], ()): 200,
        ("GET", "/resourcesync/all-records/resourcelist.xml", ()): 401,
        ("GET", "/resourcesync/all-records/resourcelist.xml", tuple(bearer.items())): 200,
        ("GET", "/resourcesync/all-records/resourcelist.xml", (("Authorization", "Bearer not-a-token"),)): 401,
        ("GET", "/resourcesync/no-such-set/resourcelist.xml", ()): 404,
    }


#: The headers that say what a response is (not the server's own: Date, Server, Connection...).
KEY_HEADERS = (
    "content-type", "content-length", "content-range", "accept-ranges", "etag", "last-modified", "cache-control",
    "vary", "link", "location", "content-disposition", "x-content-type-options", "content-security-policy",
    "memento-datetime", "www-authenticate",
)


def test_every_other_document_answers_the_same_under_both(site, servers, resource_dump):
    said_before = len(servers["uvicorn"].said())
    for (method, path, headers), expected in _documents(site, servers, resource_dump).items():
        answers = {}
        for name, server in servers.items():
            status, found, body = server.request(method, path, dict(headers))
            answers[name] = (status, {key: found.get(key) for key in KEY_HEADERS}, body)
            assert status == expected, (name, method, path, headers, status)
        assert answers["uvicorn"] == answers["gunicorn"], (method, path, headers)
    assert BUFFERED not in servers["uvicorn"].said(said_before)


def test_a_save_through_the_admin_under_uvicorn_is_processed_and_pushed(site, servers):
    """The app's threads (the dispatcher, the push) do their work in uvicorn's process."""
    server = servers["uvicorn"]
    local = f"http://127.0.0.1:{server.port}"
    subscriber = Subscriber()
    try:
        topic = f"{site.base}/resourcesync/metadata/change-notification"
        assert subscriber.request(f"{local}/resourcesync/hub", "subscribe", topic)[0] == 202
        assert subscriber.wait(lambda: subscriber.verified, timeout=30)

        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))

        def submit(path, form_id, **changes):
            with browser.open(local + path) as page:
                form = lxml.html.fromstring(page.read()).get_element_by_id(form_id)
                url = page.url
            values = [(key, changes.pop(key, value)) for key, value in form.form_values()]
            values += [*changes.items()]
            sending = urllib.request.Request(url, urllib.parse.urlencode(values).encode(), headers={"Referer": url})
            with browser.open(sending) as sent:
                return sent.status, sent.url

        logged_in = submit("/admin/login/?next=/admin/", "login-form", username="admin", password=ADMIN_PASSWORD)
        assert logged_in[1].endswith("/admin/")
        item = site.facts["item"]
        status, landed = submit(f"/admin/repository/item/{item}/change/", "item_form", title="Saved in the admin", _save="Save")
        assert status == 200 and landed.endswith("/admin/repository/item/")

        record = server.request("GET", f"/items/{item}/metadata.xml")[2]
        assert b"Saved in the admin" in record
        digest = hashlib.sha256(record).hexdigest()

        def listed():
            body = server.request("GET", "/resourcesync/metadata/changelist.xml")[2]
            return any(md(entry).get("hash", "").endswith(digest) for entry in entries(check_document(body, "changelist")))

        assert wait_for(listed, timeout=30), "the change made in the admin is not in the Change List"
        assert subscriber.wait(lambda: any(digest.encode() in received.body for received in subscriber.received), timeout=30)
    finally:
        subscriber.close()


# --- in process: an ASGI request gets an asynchronous iterator ----------------------------------------


async def _received(response):
    """``(sha-256, largest chunk)`` of the body of a response sent as an ASGI server sends it."""
    digest, largest = hashlib.sha256(), 0
    async for chunk in response.streaming_content:
        digest.update(chunk)
        largest = max(largest, len(chunk))
    return digest.hexdigest(), largest


def _asgi_get(path, **headers):
    """GET ``path`` as an ASGI server hands it to Django: ``(response, sha-256 of the body, largest chunk)``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=BUFFERED)
        response = async_to_sync(AsyncClient().get)(path, headers=headers)
        assert response.streaming and response.is_async, "a synchronous iterator under ASGI"
        return response, *async_to_sync(_received)(response)


def _dump_package(bitstreams, seed, file_size):
    bitstreams.capabilities = ["resourcelist", "resourcedump"]
    bitstreams.save()
    seed(4, file_size=file_size)
    rebuild_set(bitstreams)
    from django_resourcesync.models import Document
    from django_resourcesync.storage import get_storage

    package = Document.objects.filter(media_type="application/zip", build__status="published").order_by("-size").first()
    with get_storage().open(package.storage_name, "rb") as handle:
        stored = handle.read()
    return f"/resourcesync/bitstreams/{package.name}", stored


@pytest.mark.django_db
@pytest.mark.parametrize("where", ["files", "s3"])
def test_under_asgi_packages_are_read_a_chunk_at_a_time(request, where, seed, bitstreams):
    if where == "s3":
        pytest.importorskip("boto3")
        request.getfixturevalue("s3_documents")
    path, stored = _dump_package(bitstreams, seed, 3 * 1024 * 1024)
    assert len(stored) > 12 * 1024 * 1024
    tracemalloc.start()
    try:
        response, digest, largest = _asgi_get(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 200 and digest == hashlib.sha256(stored).hexdigest()
    assert largest <= streaming.CHUNK_SIZE
    assert peak < 4 * 1024 * 1024, f"{peak} bytes held while streaming {len(stored)}"
    response, digest, _ = _asgi_get(path, Range="bytes=1000-5242999")
    assert response.status_code == 206 and digest == hashlib.sha256(stored[1000:5243000]).hexdigest()
