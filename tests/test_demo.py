"""The demo Source, run as a user runs it, harvested by the ``resync`` client library."""

import hashlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from resync.client import Client
from resync.resource_list_builder import ResourceListBuilder
from resync.source_description import SourceDescription

ROOT = Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "TEST_DATABASE_URL", "CELERY_BROKER_URL")}
    env.update(
        EXAMPLE_VAR_DIR=str(tmp_path_factory.mktemp("demo-var")),
        RESOURCESYNC_BASE_URL=base,
        DJANGO_SETTINGS_MODULE="example_project.settings",
    )

    def manage(*args):
        subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)

    manage("migrate", "--no-input")
    manage("seed_repository", "--items", "40")
    manage("resourcesync_rebuild")
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/.well-known/resourcesync", timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the demo server did not start")
                time.sleep(0.2)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)


def capability_lists(base):
    description = SourceDescription()
    description.read(uri=f"{base}/.well-known/resourcesync")
    return [resource.uri for resource in description.resources]


def test_source_description_names_both_sets(demo):
    assert capability_lists(demo) == [
        f"{demo}/resourcesync/bitstreams/capabilitylist.xml",
        f"{demo}/resourcesync/metadata/capabilitylist.xml",
    ]


@pytest.mark.parametrize("slug", ["bitstreams", "metadata"])
def test_resync_baseline_sync_then_audit_in_sync(demo, slug, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the client keeps its state file in the working directory
    mirror = tmp_path / "mirror"
    client = Client(hashes=["md5", "sha-256"])
    client.set_mappings([f"{demo}/", str(mirror)])
    client.capability_list_uri = f"{demo}/resourcesync/{slug}/capabilitylist.xml"
    client.baseline_or_audit()

    source_list = client.find_resource_list()
    assert len(source_list) > 0
    for resource in source_list:
        copy = Path(client.mapper.src_to_dst(resource.uri))
        data = copy.read_bytes()
        assert len(data) == resource.length
        assert hashlib.md5(data).hexdigest() == resource.md5
        assert hashlib.sha256(data).hexdigest() == resource.sha256

    local = ResourceListBuilder(set_hashes=["md5"], mapper=client.mapper).from_disk()
    same, updated, deleted, created = local.compare(source_list)
    assert (len(updated), len(deleted), len(created)) == (0, 0, 0)
    assert len(same) == len(source_list)
