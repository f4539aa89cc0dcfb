"""Documents and dump packages in S3 (django-storages) against a local S3 endpoint (moto).

``TEST_S3_ENDPOINT_URL`` names a running endpoint (``python3 dev.py test`` starts one); unset,
the tests start ``python -m moto.server`` themselves.
"""

import hashlib
import os
import socket
import subprocess
import sys
import time
import tracemalloc
import urllib.request

import pytest

from django_resourcesync.rebuild import rebuild_set

from .helpers import fetch, path_of, resource_list_entries
from .test_dumps import unpack
from .xmlcheck import SM, check_document, entries

pytestmark = pytest.mark.django_db
boto3 = pytest.importorskip("boto3")


@pytest.fixture(scope="module")
def s3_endpoint():
    if os.environ.get("TEST_S3_ENDPOINT_URL"):
        yield os.environ["TEST_S3_ENDPOINT_URL"].rstrip("/")
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline:
                server.kill()
                raise RuntimeError("the S3 endpoint did not start")
            time.sleep(0.2)
    yield url
    server.terminate()
    server.wait(timeout=30)


@pytest.fixture
def s3_documents(settings, s3_endpoint):
    client = boto3.client(
        "s3", endpoint_url=s3_endpoint, aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
    )
    bucket = f"documents-{time.monotonic_ns()}"
    client.create_bucket(Bucket=bucket)
    settings.STORAGES = {
        **settings.STORAGES,
        "resourcesync": {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {
                "bucket_name": bucket, "endpoint_url": s3_endpoint, "access_key": "test", "secret_key": "test",
                "region_name": "us-east-1", "file_overwrite": False,
            },
        },
    }
    return client, bucket


def test_lists_and_dumps_live_in_the_bucket_and_are_served_from_it(seed, bitstreams, s3_documents, settings):
    client, bucket = s3_documents
    bitstreams.capabilities = ["resourcelist", "changelist", "resourcedump", "changedump"]
    bitstreams.save()
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 4}
    seed(6, file_size=2 * 1024 * 1024)  # 8 files of 2 MiB: 8 MiB packages, uploaded in parts
    rebuild_set(bitstreams)
    keys = {obj["Key"]: obj["Size"] for obj in client.list_objects_v2(Bucket=bucket)["Contents"]}
    zips = [key for key in keys if key.endswith(".zip")]
    assert len(zips) == 2 and all(keys[key] > 5 * 1024 * 1024 for key in zips), keys
    assert any(key.endswith("resourcelist.xml") for key in keys)
    assert len(resource_list_entries(bitstreams)) == 8
    _, packages = unpack(bitstreams, "resourcedump")
    assert sum(len(listed) for _m, _meta, listed in packages) == 8


def test_packages_in_s3_are_streamed_in_chunks_with_ranges_and_conditional_gets(seed, bitstreams, s3_documents, settings):
    """A package is served from the bucket a chunk at a time (never held whole by the web
    process), with single ranges, HEAD, 304s and, with SERVE_BY_REDIRECT, a redirect."""
    client, bucket = s3_documents
    bitstreams.capabilities = ["resourcelist", "resourcedump"]
    bitstreams.save()
    seed(4, file_size=3 * 1024 * 1024)
    rebuild_set(bitstreams)
    status, body, _ = fetch("/resourcesync/bitstreams/resourcedump.xml")
    assert status == 200
    (package,) = entries(check_document(body, "resourcedump"))
    path = path_of(package.find(f"{{{SM}}}loc").text)
    key = next(k["Key"] for k in client.list_objects_v2(Bucket=bucket)["Contents"] if k["Key"].endswith(".zip"))
    stored = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert len(stored) > 12 * 1024 * 1024

    # Whole: streamed, the right bytes, memory held far below the package's size.
    from django.test import Client

    digest, largest = hashlib.sha256(), 0
    tracemalloc.start()
    try:
        response = Client().get(path)
        assert response.status_code == 200 and response.streaming
        for chunk in response.streaming_content:
            largest = max(largest, len(chunk))
            digest.update(chunk)
        _, peak = tracemalloc.get_traced_memory()  # (the test client closed the response at the end)
    finally:
        tracemalloc.stop()
    assert response["Content-Length"] == str(len(stored)) and response["Accept-Ranges"] == "bytes"
    etag, last_modified = response["ETag"], response["Last-Modified"]
    assert digest.hexdigest() == hashlib.sha256(stored).hexdigest() == etag.strip('"')
    assert largest <= 1024 * 1024
    assert peak < 4 * 1024 * 1024, f"{peak} bytes held while streaming {len(stored)}"

    # A single range, a suffix range, an unsatisfiable one, an If-Range that no longer matches.
    status, part, response = fetch(path, Range="bytes=1000-5242999")
    assert status == 206 and part == stored[1000:5243000]
    assert response["Content-Range"] == f"bytes 1000-5242999/{len(stored)}"
    status, part, _ = fetch(path, Range="bytes=-100")
    assert status == 206 and part == stored[-100:]
    status, _, response = fetch(path, Range=f"bytes={len(stored)}-")
    assert status == 416 and response["Content-Range"] == f"bytes */{len(stored)}"
    status, part, _ = fetch(path, Range="bytes=0-9", **{"If-Range": '"stale"'})
    assert status == 200 and len(part) == len(stored)

    # Conditional GETs and HEAD are answered without reading the object.
    assert fetch(path, **{"If-None-Match": etag})[0] == 304
    assert fetch(path, **{"If-Modified-Since": last_modified})[0] == 304
    head = Client().head(path)
    assert head.status_code == 200 and head["Content-Length"] == str(len(stored))

    # By redirect: the storage's own (signed) URL of the same object.
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "SERVE_BY_REDIRECT": True}
    response = Client().get(path)
    assert response.status_code == 302 and response["Location"].startswith(client.meta.endpoint_url.rstrip("/"))
    assert bucket in response["Location"]
    with urllib.request.urlopen(response["Location"], timeout=30) as answer:
        assert hashlib.sha256(answer.read()).digest() == hashlib.sha256(stored).digest()
    assert fetch(path, **{"If-None-Match": etag})[0] == 304


def test_a_memento_kept_in_s3_is_streamed_in_chunks_not_held_whole(seed, committing, s3_documents):
    """The version store in S3: a memento of 12 MB is read a chunk at a time (a ranged GET of
    the object's body), never downloaded whole into memory before it is sent."""
    from django.core.files.base import ContentFile
    from django.test import Client

    from example_project.repository.models import ItemFile

    from .conftest import publish_versions

    resource_set = publish_versions(seed, committing, 2)
    upload = ItemFile.objects.filter(item__is_public=True).order_by("pk").first()
    content = os.urandom(12 * 1024 * 1024)
    with committing():
        upload.file.save("large-version.bin", ContentFile(content))
    uri = resource_set.resources.get(object_pk=str(upload.pk)).uri
    status, body, _ = fetch(f"/resourcesync/{resource_set.slug}/changelist.xml")
    (entry,) = [e for e in entries(check_document(body, "changelist")) if e.find(f"{{{SM}}}loc").text == uri]
    links = entry.findall("{http://www.openarchives.org/rs/terms/}ln")
    (memento,) = [ln.get("href") for ln in links if ln.get("rel") == "memento"]
    digest, largest = hashlib.sha256(), 0
    tracemalloc.start()
    try:
        response = Client().get(path_of(memento))
        assert response.status_code == 200 and response.streaming
        for chunk in response.streaming_content:
            largest = max(largest, len(chunk))
            digest.update(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert digest.hexdigest() == hashlib.sha256(content).hexdigest()
    assert largest <= 1024 * 1024
    assert peak < 6 * 1024 * 1024, f"{peak} bytes held while streaming a memento of {len(content)}"
