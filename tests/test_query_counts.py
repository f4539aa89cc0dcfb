"""What anyone can ask for costs the same whatever the number of sets: the Source Description, a
Capability List and the REST API's list of sets make as many queries with 100 sets as with 3, a
conditional GET of the first two is a 304 from at most two, and what is kept of their bytes
never outlives what they are made of."""

import datetime

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_resourcesync import capabilities
from django_resourcesync.models import Build, ChangeDumpPackage, ChangeList, ResourceSet

from .helpers import fetch
from .xmlcheck import SM, check_document, entries

pytestmark = pytest.mark.django_db

DESCRIPTION = "/.well-known/resourcesync"
EVERY = [capability.name for capability in capabilities.TABLE]


def make_sets(up_to):
    """Sets ``many-<n>`` up to ``up_to`` of them, made as rows: each offers every capability and
    has a document of each (a published and a retired build of both snapshots, an open and an
    archived Change List, a Change Dump package and an archived one)."""
    have = ResourceSet.objects.filter(slug__startswith="many-").count()
    at = timezone.now() - datetime.timedelta(hours=1)
    made = ResourceSet.objects.bulk_create([
        ResourceSet(name=f"Many {n}", slug=f"many-{n:03d}", source="bitstreams", capabilities=EVERY, position=10 + n,
                    describedby=f"https://example.org/about/{n}")
        for n in range(have, up_to)
    ])
    made = list(ResourceSet.objects.filter(slug__in=[s.slug for s in made]))
    Build.objects.bulk_create([
        Build(resource_set=s, capability=capability, status=status, at=at, completed=at, finished=at)
        for s in made for capability in ("resourcelist", "resourcedump")
        for status in (Build.Status.RETIRED, Build.Status.PUBLISHED)
    ])
    ChangeList.objects.bulk_create([
        ChangeList(resource_set=s, number=number, from_time=at, until=until, last_datetime=at, archived=archived)
        for s in made for number, until, archived in ((1, at, at), (2, None, None))
    ])
    ChangeDumpPackage.objects.bulk_create([
        ChangeDumpPackage(resource_set=s, number=number, from_time=at, until=at, first_event=number, last_event=number,
                          storage_name=f"x/{s.pk}-{number}.zip", sha256="0" * 64,
                          manifest_storage_name=f"x/{s.pk}-{number}.xml", manifest_sha256="0" * 64, written=at,
                          archived=archived)
        for s in made for number, archived in ((1, at), (2, None))
    ])


def counted(path, client=None, **headers):
    """``(response, queries it made)``."""
    with CaptureQueriesContext(connection) as captured:
        response = (client or Client()).get(path, headers=headers)
    return response, len(captured)


def listed(body):
    return [e.find(f"{{{SM}}}loc").text for e in entries(check_document(body, "description"))]


def later(monkeypatch, seconds=2):
    """A live document has a Last-Modified once the second of its last change is over."""
    moment = timezone.now() + datetime.timedelta(seconds=seconds)
    monkeypatch.setattr(timezone, "now", lambda: moment)


CAPABILITY_LIST = "/resourcesync/many-000/capabilitylist.xml"


@pytest.mark.parametrize("path", [DESCRIPTION, CAPABILITY_LIST, "/resourcesync/api/sets/?page_size=1000"])
def test_as_many_queries_with_100_sets_as_with_3(path):
    make_sets(3)
    few, few_queries = counted(path)
    assert few.status_code == 200
    make_sets(100)
    many, many_queries = counted(path)
    assert many.status_code == 200
    assert many_queries == few_queries, f"{few_queries} queries with 3 sets, {many_queries} with 100"
    if path == DESCRIPTION:
        assert len(listed(many.content)) == 100
    elif "capabilitylist" in path:
        assert len(entries(check_document(many.content, "capabilitylist"))) == len(EVERY)
    else:
        sets = [found for found in many.json()["results"] if found["slug"].startswith("many-")]
        assert len(sets) == 100
        assert all(set(found["documents"]) == set(EVERY) for found in sets)


@pytest.mark.parametrize("path", [DESCRIPTION, CAPABILITY_LIST])
def test_a_conditional_get_is_a_304_from_at_most_two_queries(path, monkeypatch):
    make_sets(100)
    later(monkeypatch)
    first = Client().get(path)
    assert first.status_code == 200 and first["Last-Modified"]
    by_etag, queries = counted(path, **{"If-None-Match": first["ETag"]})
    assert by_etag.status_code == 304 and queries <= 2, queries
    by_date, queries = counted(path, **{"If-Modified-Since": first["Last-Modified"]})
    assert by_date.status_code == 304 and queries <= 2, queries


def test_a_disabled_set_leaves_the_source_description_at_once():
    make_sets(3)
    first = Client().get(DESCRIPTION)
    assert "http://testserver/resourcesync/many-001/capabilitylist.xml" in listed(first.content)
    ResourceSet.objects.filter(slug="many-001").update(enabled=False)  # (no save(): its date stays)
    status, body, response = fetch(DESCRIPTION, **{"If-None-Match": first["ETag"]})
    assert status == 200 and response["ETag"] != first["ETag"]
    assert "http://testserver/resourcesync/many-001/capabilitylist.xml" not in listed(body)
    assert fetch("/resourcesync/many-001/capabilitylist.xml")[0] == 404


def test_a_set_made_for_partners_leaves_the_source_description_at_once():
    make_sets(3)
    assert "http://testserver/resourcesync/many-002/capabilitylist.xml" in listed(fetch(DESCRIPTION)[1])
    ResourceSet.objects.filter(slug="many-002").update(access="token")
    assert "http://testserver/resourcesync/many-002/capabilitylist.xml" not in listed(fetch(DESCRIPTION)[1])


def test_a_published_build_shows_at_once():
    make_sets(3)
    fresh = ResourceSet.objects.create(name="Fresh", slug="fresh", source="bitstreams", capabilities=["resourcelist"])
    first = Client().get(DESCRIPTION)
    assert "http://testserver/resourcesync/fresh/capabilitylist.xml" not in listed(first.content)
    assert fetch("/resourcesync/fresh/capabilitylist.xml")[0] == 404
    now = timezone.now()
    Build.objects.create(resource_set=fresh, capability="resourcelist", status=Build.Status.PUBLISHED, at=now, finished=now)
    status, body, response = fetch(DESCRIPTION, **{"If-None-Match": first["ETag"]})
    assert status == 200 and "http://testserver/resourcesync/fresh/capabilitylist.xml" in listed(body)
    status, body, _ = fetch("/resourcesync/fresh/capabilitylist.xml")
    assert status == 200 and len(entries(check_document(body, "capabilitylist"))) == 1


def test_a_capability_lists_document_shows_at_once_and_its_date_moves(monkeypatch):
    make_sets(3)
    resource_set = ResourceSet.objects.get(slug="many-000")
    Build.objects.filter(resource_set=resource_set, capability="resourcedump").delete()
    later(monkeypatch)
    first = Client().get(CAPABILITY_LIST)
    named = [e.find(f"{{{SM}}}loc").text for e in entries(check_document(first.content, "capabilitylist"))]
    assert "http://testserver/resourcesync/many-000/resourcedump.xml" not in named
    # A Resource Dump published a second after: in the list at once, with the list's date.
    moment = timezone.now()
    Build.objects.create(resource_set=resource_set, capability="resourcedump", status=Build.Status.PUBLISHED, at=moment,
                         finished=moment)
    later(monkeypatch, 4)
    conditions = {"If-None-Match": first["ETag"], "If-Modified-Since": first["Last-Modified"]}
    status, body, response = fetch(CAPABILITY_LIST, **conditions)
    assert status == 200
    named = [e.find(f"{{{SM}}}loc").text for e in entries(check_document(body, "capabilitylist"))]
    assert "http://testserver/resourcesync/many-000/resourcedump.xml" in named
    assert response["Last-Modified"] != first["Last-Modified"]
