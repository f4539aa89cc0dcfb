"""Every number a URL of the app takes, past what any database column holds (2**63, 10**30, a
number of thousands of digits, which Python itself refuses to convert), is a 404, or a 400 for
a query parameter, never a 500: on SQLite, which refuses to bind an integer past 64 bits, as on
PostgreSQL."""

import base64
from urllib.parse import quote, urlencode

import pytest
from django.core.files.base import ContentFile
from django.test import Client

from django_resourcesync import capabilities
from django_resourcesync.models import Build
from django_resourcesync.rebuild import rebuild_set
from example_project.repository.models import ItemFile

from .conftest import publish_versions

pytestmark = pytest.mark.django_db

NUMBERS = {
    "2**63": str(2**63),
    "10**30": str(10**30),
    "5000 digits": "9" * 5000,
}
SET = "/resourcesync/bitstreams"
#: Every URL of the app (and of the REST API) with a number in its path, ``{n}`` where it goes.
PATHS = [
    "/.well-known/resourcesync/{n}.xml",
    "/resourcesync/{n}/capabilitylist.xml",
    f"{SET}/changelist/{{n}}.xml",
    f"{SET}/changedump/{{n}}.zip",
    f"{SET}/changedump/{{n}}-manifest.xml",
    f"{SET}/changedump/dump-{{n}}.xml",
    *(f"{SET}/{capability}/{{n}}.xml" for capability in capabilities.ARCHIVES),
    *(f"{SET}/{capability}/part-{{n}}.xml" for capability in capabilities.ARCHIVES),
    f"{SET}/resourcelist/part-{{n}}.xml",
    f"{SET}/resourcedump/{{n}}.zip",
    f"{SET}/{{n}}.xml",
    f"{SET}/memento/{{n}}/{{key}}",
    f"{SET}/memento/20240101000000000000/{{n}}",
    f"{SET}/timemap/{{n}}",
    f"{SET}/timegate/{{n}}",
    *(f"/resourcesync/api/{route}/{{n}}/" for route in ("sets", "documents", "changes")),
]
#: Those only a manager reaches past the permission check, and that take a POST.
MANAGER_POSTS = [
    "/resourcesync/api/sets/{n}/rebuild/",
    "/resourcesync/api/sets/{n}/reconcile/",
    "/resourcesync/api/tokens/{n}/revoke/",
    "/admin/resourcesync/resourceset/{n}/rebuild/",
    "/admin/resourcesync/resourceset/{n}/reconcile/",
]
MANAGER_GETS = [
    *(f"/resourcesync/api/{route}/{{n}}/" for route in
      ("sets", "builds", "documents", "changes", "pending", "subscriptions", "tokens")),
    *(f"/admin/resourcesync/{model}/{{n}}/change/" for model in
      ("resourceset", "build", "document", "changelist", "changedumppackage", "subscription", "accesstoken")),
]
#: Query parameters that take a number, or a cursor that holds one.
QUERIES = [
    ("/resourcesync/api/sets/", {"page_size": "{n}"}),
    ("/resourcesync/api/changes/", {"page_size": "{n}"}),
    ("/resourcesync/api/documents/", {"cursor": "{cursor}"}),
    ("/resourcesync/api/changes/", {"cursor": "{cursor}"}),
    ("/resourcesync/api/sets/", {"cursor": "{cursor}"}),
]


@pytest.fixture
def published(seed, committing, documents_storage):
    """The files' set offering every capability, with prior versions, published, and a file
    changed since (a change, its memento, a Change Dump package)."""
    resource_set = publish_versions(seed, committing, 2, [capability.name for capability in capabilities.TABLE])
    upload = ItemFile.objects.filter(item__is_public=True).order_by("pk").first()
    with committing():
        upload.file.save("again.txt", ContentFile(b"changed\n"))
    rebuild_set(resource_set)
    return resource_set, str(upload.pk)


def _cursor(number):
    return base64.b64encode(f"p={number}".encode()).decode()


@pytest.mark.parametrize("number", NUMBERS.values(), ids=NUMBERS.keys())
@pytest.mark.parametrize("path", PATHS)
def test_a_number_out_of_range_in_a_path_is_a_404(published, path, number):
    _set, key = published
    response = Client(raise_request_exception=False).get(path.format(n=number, key=key))
    assert response.status_code == 404, response.status_code


@pytest.mark.parametrize("number", NUMBERS.values(), ids=NUMBERS.keys())
@pytest.mark.parametrize(("method", "path"), [*(("get", p) for p in MANAGER_GETS), *(("post", p) for p in MANAGER_POSTS)])
def test_a_number_out_of_range_in_a_managers_path_is_a_404(published, admin_client, method, path, number):
    admin_client.raise_request_exception = False
    response = getattr(admin_client, method)(path.format(n=number))
    assert response.status_code == 404 or _admin_says_no_such_object(response), response.status_code


def _admin_says_no_such_object(response):
    """The admin's way with an object that does not exist: back to its index, with a message
    (or to the object's change page, which does so)."""
    return response.status_code == 302 and response["Location"].startswith("/admin/")


@pytest.mark.parametrize("number", NUMBERS.values(), ids=NUMBERS.keys())
@pytest.mark.parametrize(("path", "query"), QUERIES)
def test_a_number_out_of_range_in_a_query_is_a_400_or_is_capped(published, path, query, number):
    values = {name: value.format(n=number, cursor=_cursor(number)) for name, value in query.items()}
    response = Client(raise_request_exception=False).get(f"{path}?{urlencode(values, quote_via=quote)}")
    assert response.status_code in (200, 400), response.status_code


def test_the_same_routes_answer_for_numbers_that_exist(published):
    """(What the tests above ask is answered by the views they mean, not refused before.)"""
    resource_set, key = published
    build = Build.objects.filter(resource_set=resource_set, capability="resourcelist", status="published").get()
    for path in (f"{SET}/changelist/1.xml", f"{SET}/changedump/1.zip", f"{SET}/resourcelist-archive/{build.pk}.xml",
                 f"{SET}/timemap/{key}", "/resourcesync/api/documents/?set=bitstreams"):
        assert Client().get(path).status_code == 200, path
