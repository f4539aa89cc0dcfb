"""Real HTTP against a running server: what is listed is what is served, and resync reads it."""

import hashlib
import urllib.request

import pytest
from resync.resource_list import ResourceList

from example_project.repository.models import Item

from .conftest import demo_set
from .helpers import build


@pytest.fixture
def live_source(live_server, settings, seed, transactional_db):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BASE_URL": live_server.url}
    return live_server.url


def get(uri):
    with urllib.request.urlopen(uri, timeout=30) as response:
        return response.status, response.read(), response.headers


@pytest.mark.parametrize("slug", ["bitstreams", "metadata"])
def test_listed_hash_and_length_match_the_served_bytes(live_source, seed, slug):
    seed(12)
    resource_set = demo_set(slug)
    build(resource_set)
    listing = ResourceList(allow_multifile=True)
    listing.read(uri=f"{live_source}/resourcesync/{slug}/resourcelist.xml")
    assert len(listing) == resource_set.resources.count() > 0
    for resource in listing:
        status, body, headers = get(resource.uri)
        assert status == 200
        assert resource.length == len(body) == int(headers["Content-Length"])
        assert resource.md5 == hashlib.md5(body).hexdigest()
        assert resource.sha256 == hashlib.sha256(body).hexdigest()
        assert resource.mime_type == headers["Content-Type"].split(";")[0]


def test_resync_reads_a_resource_list_index_over_http(live_source, seed, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 4}
    seed(10)
    metadata = demo_set("metadata")
    result = build(metadata)
    assert result.documents == 4  # three parts and the index
    listing = ResourceList(allow_multifile=True)
    listing.read(uri=f"{live_source}/resourcesync/metadata/resourcelist.xml")
    assert len(listing) == 10
    assert {r.uri for r in listing} == {
        f"{live_source}/items/{pk}/metadata.xml" for pk in Item.objects.values_list("pk", flat=True)
    }
    assert listing.md_at is not None
