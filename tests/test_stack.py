"""The production stack's acceptance test, run as a user runs it, one process per command.

PostgreSQL (a database of its own), Redis (a database number of its own), an S3 endpoint (a
bucket of its own) and the example project configured by the environment variables of the
deployment guide: ``manage.py migrate``, ``manage.py seed_repository --items 200``, one
``celery -A example_project worker``, ``manage.py runserver``, ``manage.py resourcesync_rebuild
--async``. Then, over HTTP only: the Source Description and every document are served within
a minute, validate, list the hashes of the bytes served, and are objects in the bucket; an item
saved in ``manage.py shell`` shows up in the open Change List within seconds, through the worker.
Last, the worker is stopped while a shell saves and rewrites a file three times, and started
again: each save is one event at its time, and the Change Dump packs each state of the file.

Needs ``TEST_DATABASE_URL`` (a PostgreSQL server; the test creates and drops a database on it)
and ``TEST_S3_ENDPOINT_URL``; Redis is at ``TEST_REDIS_URL``'s host (database 14).
``python3 dev.py test`` gives all three.
"""

import hashlib
import os
import random
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from .helpers import free_port
from .xmlcheck import SM, check_document, entries, links, md

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DATABASE_URL = os.environ.get("TEST_DATABASE_URL", "")
S3_ENDPOINT_URL = os.environ.get("TEST_S3_ENDPOINT_URL", "")
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
REDIS_DB = 14
ITEMS = 200
DEADLINE = 60  # seconds from `resourcesync_rebuild --async` to every document served
CHANGE_DEADLINE = 15  # seconds from the shell's save to the open Change List
STORED = {"resourcelist", "resourcedump", "resourcedump-manifest", "package"}  # kinds kept in storage


def with_path(url, path):
    return urlunsplit(urlsplit(url)._replace(path=path))


@pytest.fixture
def database():
    if not DATABASE_URL.startswith(("postgres://", "postgresql://")):
        pytest.skip("the production stack needs PostgreSQL: set TEST_DATABASE_URL (python3 dev.py test does)")
    import psycopg

    name = f"resourcesync_stack_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    admin_url = with_path(DATABASE_URL, "/postgres")
    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_path(DATABASE_URL, f"/{name}")
    finally:
        with psycopg.connect(admin_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def broker():
    import redis

    url = with_path(REDIS_URL, f"/{REDIS_DB}")
    client = redis.Redis.from_url(url)
    client.ping()  # a missing broker is a failure, not a skip
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()


@pytest.fixture
def bucket():
    if not S3_ENDPOINT_URL:
        pytest.skip("the production stack needs an S3 endpoint: set TEST_S3_ENDPOINT_URL (python3 dev.py test does)")
    import boto3

    client = boto3.client(
        "s3", endpoint_url=S3_ENDPOINT_URL, aws_access_key_id="stack", aws_secret_access_key="stack", region_name="us-east-1"
    )
    name = f"stack-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    client.create_bucket(Bucket=name)
    try:
        yield client, name
    finally:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            for obj in page.get("Contents", []):
                client.delete_object(Bucket=name, Key=obj["Key"])
        client.delete_bucket(Bucket=name)


class Stack:
    """The example project's commands, each in a process of its own, sharing one environment."""

    def __init__(self, env, logs):
        self.env, self.logs, self.processes = env, logs, []

    def manage(self, *args, timeout=300):
        done = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def start(self, name, *command):
        log = open(self.logs / f"{name}.log", "w")
        process = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append((name, process, log))
        return process

    def stop(self):
        for name, process, log in reversed(self.processes):
            process.terminate()  # a worker's warm shutdown: it finishes the task at hand
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()
            print(f"--- {name} (exit {process.returncode}), last lines:\n{(self.logs / f'{name}.log').read_text()[-3000:]}")


@pytest.fixture
def stack(database, broker, bucket, tmp_path):
    client, bucket_name = bucket
    port = free_port()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("TEST_", "AWS_", "PYTEST_")) and k != "DJANGO_SETTINGS_MODULE"
    }
    env.update(
        DJANGO_SETTINGS_MODULE="example_project.settings",
        EXAMPLE_VAR_DIR=str(tmp_path / "var"),
        RESOURCESYNC_BASE_URL=f"http://127.0.0.1:{port}",
        DATABASE_URL=database,
        CELERY_BROKER_URL=broker,
        AWS_STORAGE_BUCKET_NAME=bucket_name,
        AWS_S3_ENDPOINT_URL=S3_ENDPOINT_URL,
        AWS_ACCESS_KEY_ID="stack",
        AWS_SECRET_ACCESS_KEY="stack",
        AWS_S3_REGION_NAME="us-east-1",
    )
    (tmp_path / "logs").mkdir()
    running = Stack(env, tmp_path / "logs")
    running.base, running.port, running.s3, running.bucket = env["RESOURCESYNC_BASE_URL"], port, client, bucket_name
    try:
        yield running
    finally:
        running.stop()


def get(url, timeout=30):
    """(status, body) of a GET; 4xx and 5xx answers are returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def loc(entry):
    return entry.find(f"{{{SM}}}loc").text


def published(base, expected):
    """Every document the Source Description leads to, ``{url: (kind, body)}``, once the sets in
    ``expected`` ({capability list URL: capabilities}) are complete; ``None`` until then."""
    status, body = get(f"{base}/.well-known/resourcesync")
    if status != 200:
        return None
    found = {f"{base}/.well-known/resourcesync": ("description", body)}
    listed = {loc(e) for e in entries(check_document(body, "description"))}
    if listed != set(expected):
        return None
    for capability_list, capabilities in expected.items():
        status, body = get(capability_list)
        if status != 200:
            return None
        found[capability_list] = ("capabilitylist", body)
        offered = {md(e)["capability"]: loc(e) for e in entries(check_document(body, "capabilitylist"))}
        if set(offered) != set(capabilities):
            return None
        for capability, url in offered.items():
            status, body = get(url)
            if status != 200:
                return None
            found[url] = (capability, body)
            if capability == "resourcedump":
                for package in entries(check_document(body, capability)):
                    (manifest,) = [ln["href"] for ln in links(package) if ln["rel"] == "contents"]
                    for url, kind in ((loc(package), "package"), (manifest, "resourcedump-manifest")):
                        status, body = get(url)
                        if status != 200:
                            return None
                        found[url] = (kind, body)
    return found


def bucket_digests(client, bucket):
    digests = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            digests.add(hashlib.sha256(client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()).hexdigest())
    return digests


def listening(port):
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_production_stack_publishes_within_a_minute_and_follows_a_shell_save(stack):
    timings = {}
    started = time.monotonic()
    stack.manage("migrate", "--no-input")
    seeded = stack.manage("seed_repository", "--items", str(ITEMS))
    files = int(seeded.split(" items and ")[1].split()[0])
    # What an administrator does in the admin: the files' set also offers a Resource Dump, so
    # that packages and manifests go to the bucket too.
    stack.manage("shell", "-c", (
        "from django_resourcesync.models import ResourceSet; s = ResourceSet.objects.get(slug='bitstreams'); "
        "s.capabilities = ['resourcelist', 'changelist', 'resourcedump']; s.save()"
    ))
    timings["migrate and seed"] = time.monotonic() - started
    stack.start("worker", sys.executable, "-m", "celery", "-A", "example_project", "worker", "--loglevel=INFO")
    server = stack.start("server", sys.executable, "manage.py", "runserver", f"127.0.0.1:{stack.port}", "--noreload")
    deadline = time.monotonic() + 60
    while not listening(stack.port):
        assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.2)

    started = time.monotonic()
    output = stack.manage("resourcesync_rebuild", "--async")
    # The fourth, the set for partners, is built too; the public Source Description (read below) does not list it.
    sets = ["bitstreams", "metadata", "pages", "all-records"]
    assert [line.split(": task ")[0] for line in output.splitlines()] == sets, output
    expected = {
        f"{stack.base}/resourcesync/bitstreams/capabilitylist.xml": {"resourcelist", "changelist", "resourcedump"},
        f"{stack.base}/resourcesync/metadata/capabilitylist.xml": {"resourcelist", "changelist"},
        f"{stack.base}/resourcesync/pages/capabilitylist.xml": {"resourcelist", "changelist"},
    }
    documents = None
    while documents is None:
        assert time.monotonic() - started < DEADLINE, f"not every document was served {DEADLINE}s after the rebuild was queued"
        time.sleep(0.5)
        documents = published(stack.base, expected)
    timings["rebuild --async to every document served"] = time.monotonic() - started

    # Every document validates; the Resource Lists list every item's resources.
    listed = {}
    for url, (kind, body) in documents.items():
        if kind != "package":
            doc = check_document(body, kind)
            if kind == "resourcelist":
                listed[url] = entries(doc)
    assert {url.rsplit("/", 2)[1]: len(urls) for url, urls in listed.items()} == {
        "bitstreams": files, "metadata": ITEMS, "pages": ITEMS
    }

    # The hashes and lengths listed are those of the bytes served, for a sample of resources.
    sample = [entry for urls in listed.values() for entry in random.Random(7).sample(urls, 15)]
    for entry in sample:
        meta = md(entry)
        status, body = get(loc(entry))
        assert status == 200, loc(entry)
        hashes = dict(token.split(":", 1) for token in meta["hash"].split())
        assert int(meta["length"]) == len(body), loc(entry)
        assert (
            hashes["md5"] == hashlib.md5(body).hexdigest() and hashes["sha-256"] == hashlib.sha256(body).hexdigest()
        ), loc(entry)
    # The dump's packages hold every file of the set, with the hashes the dump lists.
    dump = next(body for kind, body in documents.values() if kind == "resourcedump")
    for package in entries(check_document(dump, "resourcedump")):
        served = documents[loc(package)][1]
        assert (
            md(package)["hash"] == f"sha-256:{hashlib.sha256(served).hexdigest()}" and int(md(package)["length"]) == len(served)
        )

    # The stored documents are objects in the bucket, byte for byte.
    in_bucket = bucket_digests(stack.s3, stack.bucket)
    stored = {url: hashlib.sha256(body).hexdigest() for url, (kind, body) in documents.items() if kind in STORED}
    assert {"resourcelist", "resourcedump", "package", "resourcedump-manifest"} <= {documents[url][0] for url in stored}
    missing = [url for url, digest in stored.items() if digest not in in_bucket]
    assert not missing, f"served but not in the bucket: {missing}"

    # A save in a shell reaches the open Change List through the worker.
    changelist = f"{stack.base}/resourcesync/metadata/changelist.xml"
    first = sorted(listed[f"{stack.base}/resourcesync/metadata/resourcelist.xml"], key=loc)[0]
    pk = loc(first).rstrip("/").split("/")[-2]
    assert loc(first) == f"{stack.base}/items/{pk}/metadata.xml", loc(first)

    def events():
        status, body = get(changelist)
        assert status == 200
        return [e for e in entries(check_document(body, "changelist")) if loc(e) == loc(first)]

    before = len(events())
    shell_started = time.monotonic()
    stack.manage("shell", "-c", (
        "from example_project.repository.models import Item; "
        f"item = Item.objects.get(pk={pk}); item.title = 'Saved in a shell'; item.save()"
    ))
    saved = time.monotonic()
    while len(events()) == before:
        assert time.monotonic() - saved < CHANGE_DEADLINE, (
            f"the shell's save was not in the open Change List after {CHANGE_DEADLINE}s"
        )
        time.sleep(0.2)
    (event,) = events()[before:]
    assert md(event)["change"] == "updated"
    timings["shell's exit to the open Change List"] = time.monotonic() - saved
    timings["shell's start (with Django's) to the open Change List"] = time.monotonic() - shell_started
    status, body = get(loc(first))
    assert status == 200 and b"Saved in a shell" in body
    started = time.monotonic()
    worker_outage(stack, pk)
    timings["the worker outage, from its start to the Change Dump checked"] = time.monotonic() - started
    print("; ".join(f"{what}: {seconds:.1f}s" for what, seconds in timings.items()))


OUTAGE_SAVES = """
import json
import time
from django.core.files.base import ContentFile
from django.utils import timezone
from example_project.repository.models import Item
item = Item.objects.get(pk={pk})
upload = item.files.order_by("pk").first()
windows = []
for number, word in enumerate(["one", "two", "three"], start=1):
    before = timezone.now()
    item.title = f"Saved during the outage, {{number}}"
    item.save()
    upload.file.save("outage.txt", ContentFile((word + " ").encode() * 1000 * number))
    windows.append((before.isoformat(), timezone.now().isoformat()))
    # Saves a person makes are seconds apart; the sets that list an object are noted just after
    # its save commits (tens of milliseconds), and a save overtaken before that is not published.
    time.sleep(0.5)
print(json.dumps({{"file": upload.get_absolute_url(), "windows": windows}}))
"""


def worker_outage(stack, pk):
    """The worker is stopped while a shell saves an item and rewrites its file three times
    (each save its own transaction), then started again: each save is one event, dated when
    it was made, in order, and the file's three states are packed in the Change Dump with the
    Change List's hashes."""
    import json
    import zipfile
    from io import BytesIO

    from django.utils.dateparse import parse_datetime

    stack.manage("shell", "-c", (
        "from django_resourcesync.models import ResourceSet; s = ResourceSet.objects.get(slug='bitstreams'); "
        "s.capabilities = ['resourcelist', 'changelist', 'resourcedump', 'changedump']; s.save()"
    ))
    ((name, worker, _log),) = [entry for entry in stack.processes if entry[0] == "worker"]
    worker.terminate()
    worker.wait(timeout=60)
    saved = json.loads(stack.manage("shell", "-c", OUTAGE_SAVES.format(pk=pk)).strip().splitlines()[-1])
    windows = [(parse_datetime(before), parse_datetime(after)) for before, after in saved["windows"]]
    contents = [(word + " ").encode() * 1000 * number for number, word in enumerate(["one", "two", "three"], start=1)]
    record, upload = f"{stack.base}/items/{pk}/metadata.xml", stack.base + saved["file"]

    def events(slug, uri):
        status, body = get(f"{stack.base}/resourcesync/{slug}/changelist.xml")
        assert status == 200
        return [md(e) for e in entries(check_document(body, "changelist")) if loc(e) == uri]

    already = len(events("metadata", record))
    time.sleep(2)
    assert len(events("metadata", record)) == already and events("bitstreams", upload) == [], "processed with no worker"
    stack.start("worker-again", sys.executable, "-m", "celery", "-A", "example_project", "worker", "--loglevel=INFO")
    deadline = time.monotonic() + 60
    while len(events("metadata", record)) < already + 3 or len(events("bitstreams", upload)) < 3:
        assert time.monotonic() < deadline, "the changes made during the outage were not processed"
        time.sleep(0.5)
    for found in (events("metadata", record)[already:], events("bitstreams", upload)):
        assert [meta["change"] for meta in found] == ["updated"] * 3
        stamps = [parse_datetime(meta["datetime"]) for meta in found]
        assert all(before <= stamp <= after for stamp, (before, after) in zip(stamps, windows)), (stamps, windows)
    listed = events("bitstreams", upload)
    assert [meta["hash"].split()[-1] for meta in listed] == [f"sha-256:{hashlib.sha256(c).hexdigest()}" for c in contents]

    stack.manage("resourcesync_rebuild", "--set", "bitstreams", "--only", "changedump")
    status, body = get(f"{stack.base}/resourcesync/bitstreams/changedump.xml")
    assert status == 200
    (package,) = entries(check_document(body, "changedump"))
    status, zipped = get(loc(package))
    assert status == 200 and md(package)["hash"] == f"sha-256:{hashlib.sha256(zipped).hexdigest()}"
    archive = zipfile.ZipFile(BytesIO(zipped))
    manifest = check_document(archive.read("manifest.xml"), "changedump-manifest")
    packed = [md(e) for e in entries(manifest) if loc(e) == upload]
    assert [archive.read(meta["path"][1:]) for meta in packed] == contents
    assert [(meta["hash"], meta["datetime"]) for meta in packed] == [(meta["hash"], meta["datetime"]) for meta in listed]


def kill_tree(process):
    """SIGKILL a process and its children (a worker's pool), as a machine or the OOM killer would."""
    import psutil

    tree = psutil.Process(process.pid)
    for child in tree.children(recursive=True):
        child.kill()
    tree.kill()
    process.wait(timeout=30)


def test_a_worker_killed_mid_delivery_loses_no_notification(stack):
    """A subscriber at the built-in hub; the worker is SIGKILLed (with its pool) while it
    delivers a change notification; a worker started again delivers it."""
    from .websub import Subscriber

    stack.manage("migrate", "--no-input")
    stack.manage("seed_repository", "--items", "5")
    stack.manage("shell", "-c", (
        "from django_resourcesync.models import ResourceSet; s = ResourceSet.objects.get(slug='metadata'); "
        "s.capabilities = ['resourcelist', 'changelist', 'change-notification']; s.save()"
    ))
    stack.manage("resourcesync_rebuild", "--set", "metadata")
    worker = stack.start("worker", sys.executable, "-m", "celery", "-A", "example_project", "worker", "--loglevel=INFO")
    server = stack.start("server", sys.executable, "manage.py", "runserver", f"127.0.0.1:{stack.port}", "--noreload")
    deadline = time.monotonic() + 60
    while not listening(stack.port):
        assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.2)
    subscriber = Subscriber()
    try:
        changes = f"{stack.base}/resourcesync/metadata/change-notification"
        status, reason = subscriber.request(f"{stack.base}/resourcesync/hub", "subscribe", changes)
        assert status == 202, reason
        assert subscriber.wait(lambda: subscriber.verified, timeout=60), "the worker did not verify the subscription"
        time.sleep(1)  # the worker records it just after the subscriber confirms

        subscriber.hang_next = 1
        stack.manage("shell", "-c", (
            "from example_project.repository.models import Item; i = Item.objects.order_by('pk').first(); "
            "i.title = 'Delivered despite a dead worker'; i.save()"
        ))
        assert subscriber.hanging.wait(60), "no delivery was attempted"
        kill_tree(worker)
        subscriber.release.set()
        assert subscriber.received == []
        stack.start("worker-again", sys.executable, "-m", "celery", "-A", "example_project", "worker", "--loglevel=INFO")
        # Once the dead worker's claim runs out (HUB_TIMEOUT + 5 s), the new one delivers it.
        assert subscriber.wait(lambda: subscriber.received, timeout=90), "the notification was lost with the worker"
        [received] = subscriber.received
        doc = check_document(received.body, "change-notification")
        [entry] = entries(doc)
        assert md(entry)["change"] == "updated" and loc(entry).startswith(f"{stack.base}/items/")
        assert f'<{changes}>; rel="self"' in received.headers["Link"]
    finally:
        subscriber.close()
