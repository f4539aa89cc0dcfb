"""The demo Source, run as a user runs it, harvested by the ``resync`` client library."""

import hashlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from resync.client import Client
from resync.resource_list_builder import ResourceListBuilder
from resync.source_description import SourceDescription

from .helpers import free_port

ROOT = Path(__file__).resolve().parents[1]


_DEMO_ENV = {}


def demo_env(base):
    return _DEMO_ENV[base]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "TEST_DATABASE_URL", "CELERY_BROKER_URL")
    }
    _DEMO_ENV[base] = {"EXAMPLE_VAR_DIR": str(tmp_path_factory.mktemp("demo-var")), "RESOURCESYNC_BASE_URL": base}
    env.update(DJANGO_SETTINGS_MODULE="example_project.settings", **_DEMO_ENV[base])

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


def test_source_description_names_the_three_sets(demo):
    assert capability_lists(demo) == [
        f"{demo}/resourcesync/bitstreams/capabilitylist.xml",
        f"{demo}/resourcesync/metadata/capabilitylist.xml",
        f"{demo}/resourcesync/pages/capabilitylist.xml",
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


OPERATIONS = """
from example_project.repository.models import Item
items = list(Item.objects.order_by("pk"))
items[0].title = "A changed title"; items[0].save()
items[1].delete()
items[2].is_public = False; items[2].save()
Item.objects.filter(pk__in=[items[3].pk, items[4].pk]).update(title="Updated in bulk")
"""


def test_resync_follows_the_change_list_and_ends_in_sync(demo, tmp_path, monkeypatch):
    """Baseline, then every kind of change the site makes, then incremental sync: IN SYNC."""
    monkeypatch.chdir(tmp_path)
    env = {
        key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "TEST_DATABASE_URL", "CELERY_BROKER_URL")
    }
    env.update(DJANGO_SETTINGS_MODULE="example_project.settings", **demo_env(demo))
    clients = {}
    for slug in ("bitstreams", "metadata"):
        client = Client(hashes=["md5", "sha-256"])
        client.set_mappings([f"{demo}/", str(tmp_path / slug)])
        # The client keeps its incremental state per Resource List URI: one per set.
        client.sitemap_name = f"{demo}/resourcesync/{slug}/resourcelist.xml"
        client.baseline_or_audit()
        clients[slug] = client
    before = {slug: {r.uri for r in client.find_resource_list()} for slug, client in clients.items()}

    def manage(*args):
        subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)

    manage("shell", "-c", OPERATIONS)
    manage("resourcesync_reconcile")  # for the queryset.update() above
    manage("seed_repository", "--items", "3")

    for slug, client in clients.items():
        client.incremental(allow_deletion=True, change_list_uri=f"{demo}/resourcesync/{slug}/changelist.xml")
    manage("resourcesync_rebuild")
    for slug, client in clients.items():
        source_list = client.find_resource_list()
        local = ResourceListBuilder(set_hashes=["md5"], mapper=client.mapper).from_disk()
        same, updated, deleted, created = local.compare(source_list)
        assert (len(updated), len(deleted), len(created)) == (0, 0, 0), slug
        gone = before[slug] - {r.uri for r in source_list}
        assert gone, "items were deleted and made private"
        for uri in gone:
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(uri, timeout=10)
            assert answer.value.code == 404


def test_a_destination_that_lands_on_a_resource_finds_the_source(demo):
    """Over HTTP, from one resource alone: its Link header names a Capability List (read by
    resync), whose up link is the Source Description that lists it; the landing pages say the
    same in HTML, and robots.txt names every Resource List."""
    import re

    from lxml import html
    from resync.capability_list import CapabilityList
    from resync.resource_list import ResourceList

    robots = urllib.request.urlopen(f"{demo}/robots.txt", timeout=30).read().decode()
    sitemaps = re.findall(r"^Sitemap: (\S+)$", robots, re.M)
    assert sitemaps == [f"{demo}/resourcesync/{slug}/resourcelist.xml" for slug in ("bitstreams", "metadata", "pages")]
    for slug, resource_list in zip(("bitstreams", "metadata", "pages"), sitemaps):
        listed = ResourceList()
        listed.read(uri=resource_list)
        uri = next(iter(listed)).uri
        found = {}
        for method in ("HEAD", "GET"):
            with urllib.request.urlopen(urllib.request.Request(uri, method=method), timeout=30) as response:
                found[method] = re.findall(r'<([^>]+)>;\s*rel="resourcesync"', response.headers["Link"])
                body = response.read()
        target = f"{demo}/resourcesync/{slug}/capabilitylist.xml"
        assert found == {"HEAD": [target], "GET": [target]}
        capability_list = CapabilityList()
        capability_list.read(uri=target)
        assert capability_list.has_capability("resourcelist")
        description = SourceDescription()
        description.read(uri=capability_list.up)
        assert description.capability == "description"
        assert target in [resource.uri for resource in description.resources]
        if slug == "pages":
            assert html.fromstring(body).xpath('//head/link[@rel="resourcesync"]/@href') == [target]


def test_the_landing_pages_served_are_the_bytes_listed(demo):
    """resync's file mapping cannot mirror URIs that end in "/" (a landing page): the audit of
    that set, as a Destination makes it, by fetching each page and hashing it."""
    from resync.resource_list import ResourceList

    listed = ResourceList()
    listed.read(uri=f"{demo}/resourcesync/pages/resourcelist.xml")
    assert len(listed) > 0
    for resource in listed:
        data = urllib.request.urlopen(resource.uri, timeout=30).read()
        assert (len(data), hashlib.md5(data).hexdigest(), hashlib.sha256(data).hexdigest()) == (
            resource.length, resource.md5, resource.sha256
        ), resource.uri
        assert b'rel="resourcesync"' in data


def test_resync_syncs_and_audits_the_partners_set_with_a_token_and_is_refused_without(demo, tmp_path):
    """The resync command line client, as a partner runs it: --access-token sends the token as a
    bearer token with each request (documents and resources alike)."""
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "TEST_DATABASE_URL")}
    env.update(DJANGO_SETTINGS_MODULE="example_project.settings", **demo_env(demo))
    issued = subprocess.run(
        [sys.executable, "manage.py", "resourcesync_token", "create", "--name", "resync partner", "--set", "all-records"],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True, timeout=120,
    )
    token = issued.stdout.strip()
    sync = [str(Path(sys.executable).parent / "resync-sync"), "--capabilitylist",
            f"{demo}/resourcesync/all-records/capabilitylist.xml", "--hash", "md5", "--hash", "sha-256",
            f"{demo}/", str(tmp_path / "mirror")]

    def resync(mode, *extra):
        return subprocess.run([sync[0], mode, *extra, *sync[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=300)

    refused = resync("--baseline")
    assert refused.returncode != 0 or "401" in refused.stderr + refused.stdout
    assert not (tmp_path / "mirror").exists() or not any((tmp_path / "mirror").rglob("*.xml"))

    baseline = resync("--baseline", "--access-token", token)
    assert baseline.returncode == 0, baseline.stderr
    assert "SYNCED" in baseline.stderr
    records = list((tmp_path / "mirror" / "items").rglob("metadata.xml"))
    assert len(records) == int(subprocess.run(
        [sys.executable, "manage.py", "shell", "-c",
         "from example_project.repository.models import Item; print(Item.objects.count())"],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True, timeout=120,
    ).stdout.split()[-1])
    audit = resync("--audit", "--access-token", token)
    assert audit.returncode == 0 and "IN SYNC" in audit.stderr, audit.stderr
