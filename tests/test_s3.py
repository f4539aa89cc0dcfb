"""Documents and dump packages in S3 (django-storages) against a local S3 endpoint (moto)."""

import socket
import subprocess
import sys
import time

import pytest

from django_resourcesync.rebuild import rebuild_set

from .test_dumps import unpack
from .helpers import resource_list_entries

pytestmark = pytest.mark.django_db
boto3 = pytest.importorskip("boto3")


@pytest.fixture(scope="module")
def s3_endpoint():
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
    client = boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1")
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
