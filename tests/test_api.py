"""The REST API at /resourcesync/api/: anyone reads what the documents already publish, managers
(staff with the model permissions) the rest; every error is a 4xx with a JSON reason; the schema
is valid OpenAPI 3, generated without warnings."""

import base64
import datetime
import json
import re
from datetime import timedelta
from unittest import mock

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.staticfiles import finders
from django.core import checks
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from django_resourcesync import tasks
from django_resourcesync.api.filters import parse_w3c_datetime
from django_resourcesync.models import Build, ChangeEvent, Document, PendingChange, ResourceSet, Subscription
from django_resourcesync.sources import ResourceSource, registry
from django_resourcesync.validation import validate_resource_set
from example_project.repository.models import Item, ItemFile

from .conftest import demo_set
from .helpers import build

pytestmark = pytest.mark.django_db

API = "/resourcesync/api/"
W3C_UTC = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z")
PUBLIC_SET_FIELDS = {"url", "name", "slug", "capabilities", "capability_list", "documents", "resources", "last_good_build"}


@pytest.fixture(autouse=True)
def fresh_throttles():
    """DRF's throttles count in the default cache: each test starts with none counted."""
    cache.clear()
    yield
    cache.clear()


def make_user(username, *, staff=False, superuser=False, permissions=()):
    user = User.objects.create_user(username, f"{username}@example.org", "pw", is_staff=staff or superuser,
                                    is_superuser=superuser)
    if permissions == "all":
        user.user_permissions.set(Permission.objects.filter(content_type__app_label="resourcesync"))
    else:
        user.user_permissions.set(Permission.objects.filter(content_type__app_label="resourcesync", codename__in=permissions))
    return user


def logged_in(user):
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def anonymous():
    return Client()


@pytest.fixture
def member(db):
    """A logged-in user who is not staff: sees what anyone sees."""
    return logged_in(make_user("member"))


@pytest.fixture
def bare_staff(db):
    """Staff without any permission of the app."""
    return logged_in(make_user("bare", staff=True))


@pytest.fixture
def manager(db):
    """Staff holding every permission of the app, as a site gives its ResourceSync managers."""
    return logged_in(make_user("manager", staff=True, permissions="all"))


@pytest.fixture
def superuser(db):
    return logged_in(make_user("root", superuser=True))


@pytest.fixture
def published(seed, bitstreams, metadata, committing):
    """Both demo sets published, then changed: their logs hold created, updated and deleted events."""
    with committing():
        seed(2)
    build(bitstreams)
    build(metadata)
    with committing():
        seed(2)
    item = Item.objects.order_by("pk").first()
    with committing():
        item.title = "Retitled"
        item.save()
    with committing():
        ItemFile.objects.filter(item=item).first().delete()
    return bitstreams, metadata


def get_json(client, path, status=200, **extra):
    response = client.get(path, **extra)
    assert response.status_code == status, (path, response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    return response.json()


def every_result(client, path):
    """Follow ``next`` to the end; every row of every page."""
    rows = []
    while path:
        page = get_json(client, path)
        rows += page["results"]
        path = page["next"]
    return rows


def send(client, method, path, data=None, **extra):
    body = json.dumps(data) if data is not None else None
    return getattr(client, method)(path, body, content_type="application/json", **extra)


# -- routing --------------------------------------------------------------------------------------


def test_the_api_root_lists_every_endpoint_to_anyone(anonymous):
    root = get_json(anonymous, API)
    assert set(root) == {"sets", "builds", "documents", "changes", "pending", "subscriptions", "tokens"}
    assert root["sets"] == "http://testserver/resourcesync/api/sets/"


def test_an_unknown_path_under_the_api_is_a_json_404_not_a_page_or_a_sets_document(anonymous, bitstreams):
    assert get_json(anonymous, API + "nothing/here/", status=404) == {"detail": "Not found."}
    assert get_json(anonymous, API + "capabilitylist.xml", status=404) == {"detail": "Not found."}
    hint = get_json(anonymous, API + "sets", status=404)["detail"]
    assert "/resourcesync/api/sets/" in hint
    strict = Client(enforce_csrf_checks=True)
    for method in ("post", "put", "delete"):
        response = send(strict, method, API + "nothing/", {})
        assert response.status_code == 404 and response.json() == {"detail": "Not found."}


def test_an_unknown_set_slug_is_a_json_404(anonymous, manager, bitstreams):
    assert "detail" in get_json(anonymous, API + "sets/no-such-set/", status=404)
    assert "detail" in get_json(manager, API + "sets/no-such-set/", status=404)
    assert send(manager, "post", API + "sets/no-such-set/rebuild/").status_code == 404


def test_a_method_an_endpoint_does_not_take_is_a_405_with_a_json_reason(anonymous, manager, published):
    event = ChangeEvent.objects.first()
    for client in (anonymous, manager):
        for method, path in (("post", API + "changes/"), ("put", API + f"changes/{event.pk}/"), ("post", API + "documents/")):
            response = send(client, method, path, {})
            assert response.status_code == 405, (method, path, response.status_code)
            assert "detail" in response.json()
    build_id = Build.objects.first().pk
    assert send(manager, "delete", API + f"builds/{build_id}/").status_code == 405
    assert send(manager, "get", API + "sets/bitstreams/rebuild/").status_code == 405


# -- sets -----------------------------------------------------------------------------------------


def test_anyone_reads_the_enabled_sets_with_what_their_documents_show(anonymous, member, published, settings):
    settings.TIME_ZONE = "Europe/Berlin"  # datetimes are still UTC, with Z
    bitstreams, metadata = published
    for client in (anonymous, member):
        sets = get_json(client, API + "sets/")["results"]
        assert [s["slug"] for s in sets] == ["bitstreams", "metadata", "pages"]  # Source Description order
        shown = sets[0]
        assert set(shown) == PUBLIC_SET_FIELDS
        assert shown["capability_list"] == "http://testserver/resourcesync/bitstreams/capabilitylist.xml"
        assert shown["documents"] == {
            "resourcelist": "http://testserver/resourcesync/bitstreams/resourcelist.xml",
            "changelist": "http://testserver/resourcesync/bitstreams/changelist.xml",
        }
        assert shown["capabilities"] == ["resourcelist", "changelist"]
        assert shown["resources"] == bitstreams.resources.count() > 0
        assert W3C_UTC.fullmatch(shown["last_good_build"]), shown["last_good_build"]
        assert get_json(client, API + "sets/metadata/")["slug"] == "metadata"
        for uri in [shown["capability_list"], *shown["documents"].values()]:
            assert client.get(uri.removeprefix("http://testserver")).status_code == 200


def test_a_set_that_published_nothing_yet_has_no_capability_list(anonymous, bitstreams):
    shown = get_json(anonymous, API + "sets/bitstreams/")
    assert (shown["capability_list"], shown["documents"], shown["last_good_build"], shown["resources"]) == (None, {}, None, None)
    assert anonymous.get("/resourcesync/bitstreams/capabilitylist.xml").status_code == 404


def test_how_many_resources_a_set_holds_is_public_only_while_its_resource_list_is(
    anonymous, manager, seed, metadata, committing
):
    metadata.capabilities = ["changelist"]
    metadata.save()
    with committing():
        seed(2)
    from django_resourcesync.rebuild import rebuild_set

    rebuild_set(metadata)
    assert metadata.resources.count() == 2
    assert get_json(anonymous, API + "sets/metadata/")["resources"] is None  # no public document shows it
    assert get_json(manager, API + "sets/metadata/")["resources"] == 2


def test_a_disabled_set_is_invisible_to_anonymous_and_members_but_not_to_managers(anonymous, member, manager, published):
    bitstreams, _metadata = published
    demo_set("all-records")  # as migrated (an earlier test's flush may have taken it)
    ResourceSet.objects.filter(pk=bitstreams.pk).update(enabled=False)
    for client in (anonymous, member):
        assert [s["slug"] for s in get_json(client, API + "sets/")["results"]] == ["metadata", "pages"]
        get_json(client, API + "sets/bitstreams/", status=404)
        assert {d["set"] for d in every_result(client, API + "documents/")} == {"metadata"}
        assert {e["set"] for e in every_result(client, API + "changes/")} == {"metadata"}
        assert "set" in get_json(client, API + "changes/?set=bitstreams", status=400)
        assert "set" in get_json(client, API + "documents/?set=bitstreams", status=400)
    # Managers see the set for partners too (anyone else never does).
    assert [s["slug"] for s in get_json(manager, API + "sets/")["results"]] == ["all-records", "bitstreams", "metadata", "pages"]
    assert get_json(manager, API + "sets/bitstreams/")["enabled"] is False
    assert {d["set"] for d in every_result(manager, API + "documents/")} == {"bitstreams", "metadata"}
    assert {e["set"] for e in every_result(manager, API + "changes/")} == {"bitstreams", "metadata"}


def test_nothing_private_reaches_anonymous_clients_or_members(anonymous, member, published):
    bitstreams, metadata = published
    ResourceSet.objects.filter(pk=bitstreams.pk).update(lookups={"name__iregex": "lookupmarker|."})
    Build.objects.create(resource_set=bitstreams, capability="resourcelist", status=Build.Status.FAILED, at=timezone.now(),
                         error="Traceback (most recent call last): tracebackmarker", report={"note": "reportmarker"})
    hidden = ResourceSet.objects.create(name="Hidden marker", slug="hidden", source="metadata", enabled=False,
                                        capabilities=["resourcelist", "changelist"])
    build(hidden)
    Subscription.objects.create(resource_set=metadata, capability="change-notification", callback="https://example.org/cb",
                                secret="secretmarker", lease_seconds=60, expires=timezone.now() + timedelta(seconds=60))
    withdrawn = Document.objects.filter(resource_set=metadata).first()
    Document.objects.filter(pk=withdrawn.pk).update(withdrawn=timezone.now())
    for client in (anonymous, member):
        bodies = []
        for path in ("", "sets/", "sets/bitstreams/", "sets/metadata/", "documents/", "changes/"):
            response = client.get(API + path)
            assert response.status_code == 200, path
            bodies.append(response.content.decode())
        for path in ("builds/", "pending/", "subscriptions/", f"builds/{Build.objects.first().pk}/"):
            response = client.get(API + path)
            assert response.status_code in (401, 403), path
            bodies.append(response.content.decode())
        text = "\n".join(bodies)
        for marker in ("lookupmarker", "tracebackmarker", "Traceback", "reportmarker", "secretmarker", "Hidden marker", "hidden"):
            assert marker not in text, marker
        for shown in get_json(client, API + "sets/")["results"]:
            assert set(shown) == PUBLIC_SET_FIELDS
        assert withdrawn.pk not in {d["id"] for d in every_result(client, API + "documents/")}
        get_json(client, API + f"documents/{withdrawn.pk}/", status=404)


def test_managers_see_every_field_of_a_set(manager, superuser, published):
    for client in (manager, superuser):
        shown = get_json(client, API + "sets/bitstreams/")
        assert set(shown) == PUBLIC_SET_FIELDS | {
            "enabled", "access", "source", "lookups", "describedby", "prior_versions", "position", "left_out", "created",
            "modified",
        }
        assert (shown["source"], shown["lookups"], shown["left_out"]) == ("bitstreams", {}, 0)


def test_a_manager_creates_changes_and_deletes_a_set(manager, seed):
    seed(1)
    created = send(manager, "post", API + "sets/", {
        "name": "Theses", "slug": "theses", "source": "metadata", "lookups": {"collection__slug": "theses"},
        "capabilities": ["changelist", "resourcelist", "changelist"], "describedby": "/about/theses/", "position": 4,
    })
    assert created.status_code == 201, created.content
    assert created.json()["capabilities"] == ["resourcelist", "changelist"]  # each once, in the table's order
    resource_set = ResourceSet.objects.get(slug="theses")
    assert (resource_set.source, resource_set.lookups, resource_set.enabled) == ("metadata", {"collection__slug": "theses"}, True)
    changed = send(manager, "patch", API + "sets/theses/", {"enabled": False, "name": "Theses (paused)"})
    assert changed.status_code == 200, changed.content
    resource_set.refresh_from_db()
    assert (resource_set.enabled, resource_set.name, resource_set.source) == (False, "Theses (paused)", "metadata")
    replaced = send(manager, "put", API + "sets/theses/", {"name": "Theses", "slug": "theses", "source": "bitstreams",
                                                           "lookups": {}})
    assert replaced.status_code == 200, replaced.content
    assert ResourceSet.objects.get(slug="theses").source == "bitstreams"
    assert send(manager, "delete", API + "sets/theses/").status_code == 204
    assert not ResourceSet.objects.filter(slug="theses").exists()


def test_writing_a_set_needs_staff_with_the_model_permission(anonymous, member, bare_staff, bitstreams):
    values = {"name": "New", "slug": "new", "source": "metadata"}
    response = send(anonymous, "post", API + "sets/", values)
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Basic")
    assert "detail" in response.json()
    for client in (member, bare_staff, logged_in(make_user("viewer", staff=True, permissions=["view_resourceset"]))):
        assert send(client, "post", API + "sets/", values).status_code == 403
        assert send(client, "patch", API + "sets/bitstreams/", {"name": "x"}).status_code == 403
        assert send(client, "delete", API + "sets/bitstreams/").status_code == 403
    assert not ResourceSet.objects.filter(slug="new").exists()
    assert ResourceSet.objects.get(slug="bitstreams").name != "x"
    # Not staff, however many permissions: refused.
    member_with_rights = logged_in(make_user("rights", permissions="all"))
    assert send(member_with_rights, "post", API + "sets/", values).status_code == 403
    adder = logged_in(make_user("adder", staff=True, permissions=["add_resourceset"]))
    assert send(adder, "post", API + "sets/", values).status_code == 201
    assert send(adder, "delete", API + "sets/new/").status_code == 403
    deleter = logged_in(make_user("deleter", staff=True, permissions=["delete_resourceset"]))
    assert send(deleter, "delete", API + "sets/new/").status_code == 204


class Byteless(ResourceSource):
    """Item pages described by their lastmod alone: no file, no content, so no dumps."""

    name = "byteless"

    def items(self):
        return Item.objects.filter(is_public=True)

    def lastmod(self, obj):
        return obj.modified


@pytest.fixture
def byteless():
    registry.register(Byteless)
    yield "byteless"
    registry.unregister("byteless")


@pytest.mark.parametrize(
    "values, field, words",
    [
        ({"source": "nosuchsource"}, "source", "not a registered source"),
        ({"lookups": {"nosuchfield": 1}}, "lookups", "The source rejects this filter"),
        ({"lookups": {"title__regex": "("}}, "lookups", "The source rejects this filter"),
        ({"lookups": ["not", "a", "dict"]}, "lookups", "JSON object"),
        ({"source": "byteless", "capabilities": ["resourcelist", "resourcedump"]}, "capabilities", "gives no bytes"),
        ({"capabilities": ["resourcelist", "nosuchcapability"]}, "capabilities", "not a valid choice"),
        ({"slug": "api"}, "slug", "reserved"),
        ({"slug": "not a slug"}, "slug", "slug"),
        ({"describedby": "javascript:alert(1)"}, "describedby", "valid URL"),
    ],
)
def test_a_set_written_through_the_api_is_validated_as_the_admin_form_validates_it(manager, seed, byteless, values, field, words):
    seed(2)  # a filter over no rows may not be run by SQLite
    response = send(manager, "post", API + "sets/", {"name": "Bad", "slug": "bad", "source": "metadata", **values})
    assert response.status_code == 400, response.content
    errors = response.json()
    assert field in errors and words in json.dumps(errors[field]), errors
    assert not ResourceSet.objects.filter(name="Bad").exists()


def test_a_partial_change_of_a_set_is_validated_with_its_other_values(manager, seed, metadata, byteless):
    seed(2)
    ResourceSet.objects.filter(pk=metadata.pk).update(source="byteless")
    response = send(manager, "patch", API + "sets/metadata/", {"capabilities": ["resourcelist", "changedump"]})
    assert response.status_code == 400 and "gives no bytes" in json.dumps(response.json()["capabilities"])
    response = send(manager, "patch", API + "sets/metadata/", {"lookups": {"title__regex": "("}})
    assert response.status_code == 400 and "lookups" in response.json()
    metadata.refresh_from_db()
    assert (metadata.capabilities, metadata.lookups) == (["resourcelist", "changelist"], {})


def test_validate_resource_set_names_the_field_of_each_problem(seed, byteless):
    seed(1)
    validate_resource_set(source="metadata", lookups={"title__startswith": "A"}, capabilities=["resourcelist", "resourcedump"])
    validate_resource_set(source=None, lookups=None, capabilities=None)  # fields that failed already: nothing to add
    with pytest.raises(ValidationError) as refused:
        validate_resource_set(source="byteless", lookups={"nosuchfield": 1}, capabilities=["changedump"])
    assert set(refused.value.message_dict) == {"capabilities", "lookups"}
    assert "Change Dump" in refused.value.message_dict["capabilities"][0]
    with pytest.raises(ValidationError) as refused:
        validate_resource_set(source="gone", lookups={}, capabilities=[])
    assert set(refused.value.message_dict) == {"source"} and "metadata" in refused.value.message_dict["source"][0]


def test_the_slug_api_is_reserved_for_the_api(manager, bitstreams):
    reserved = ResourceSet(name="API", slug="api", source="metadata")
    with pytest.raises(ValidationError) as refused:
        reserved.full_clean()
    assert "reserved" in str(refused.value.message_dict["slug"])
    # A set saved with it behind the validators' back: a warning, as its documents cannot be reached.
    ResourceSet.objects.filter(pk=bitstreams.pk).update(slug="api")
    (warning,) = [m for m in checks.run_checks(databases=["default"]) if m.id == "resourcesync.W011"]
    assert "'api'" in warning.msg and warning.hint


# -- builds -----------------------------------------------------------------------------------------


def test_builds_and_their_reports_are_for_managers_only(anonymous, member, bare_staff, manager, superuser, published):
    bitstreams, _metadata = published
    failed = Build.objects.create(resource_set=bitstreams, capability="resourcelist", status=Build.Status.FAILED,
                                  at=timezone.now(), error="Traceback: boom", report={"missing": ["a"]})
    response = anonymous.get(API + "builds/")
    assert response.status_code == 401 and response["WWW-Authenticate"] and "detail" in response.json()
    assert anonymous.get(API + f"builds/{failed.pk}/").status_code == 401
    for client in (member, bare_staff):
        assert client.get(API + "builds/").status_code == 403
        assert client.get(API + f"builds/{failed.pk}/").status_code == 403
    viewer = logged_in(make_user("viewer", staff=True, permissions=["view_build"]))
    for client in (manager, superuser, viewer):
        builds = every_result(client, API + "builds/")
        assert [b["id"] for b in builds] == sorted((b["id"] for b in builds), reverse=True)  # newest first
        assert builds[0]["error"] == "Traceback: boom" and builds[0]["report"] == {"missing": ["a"]}
    published_build = Build.objects.filter(resource_set=bitstreams, status=Build.Status.PUBLISHED).get()
    detail = get_json(manager, API + f"builds/{published_build.pk}/")
    assert detail["set"] == "bitstreams" and detail["status"] == "published"
    assert [f["name"] for f in detail["files"]] == ["resourcelist.xml"]
    assert detail["files"][0]["uri"] == "http://testserver/resourcesync/bitstreams/resourcelist.xml"
    assert isinstance(detail["parts"], list)
    get_json(manager, API + "builds/999999/", status=404)


def test_builds_are_filtered_by_set_capability_and_status_and_a_bad_value_is_a_400(manager, published):
    bitstreams, _metadata = published
    Build.objects.create(resource_set=bitstreams, capability="resourcedump", status=Build.Status.FAILED, at=timezone.now())
    assert {b["set"] for b in every_result(manager, API + "builds/?set=metadata")} == {"metadata"}
    assert [b["capability"] for b in every_result(manager, API + "builds/?capability=resourcedump")] == ["resourcedump"]
    assert [b["status"] for b in every_result(manager, API + "builds/?status=failed")] == ["failed"]
    assert "status" in get_json(manager, API + "builds/?status=broken", status=400)
    assert "capability" in get_json(manager, API + "builds/?capability=sitemap", status=400)
    assert "set" in get_json(manager, API + "builds/?set=nope", status=400)


# -- documents -------------------------------------------------------------------------------------


def test_anyone_reads_the_current_documents_of_enabled_sets_never_a_retired_or_withdrawn_one(anonymous, published):
    bitstreams, metadata = published
    first = Document.objects.get(resource_set=bitstreams)
    build(bitstreams)  # the first build is retired
    current = Document.objects.get(resource_set=bitstreams, build__status=Build.Status.PUBLISHED)
    documents = every_result(anonymous, API + "documents/")
    assert {(d["set"], d["name"]) for d in documents} == {("bitstreams", "resourcelist.xml"), ("metadata", "resourcelist.xml")}
    shown = next(d for d in documents if d["set"] == "bitstreams")
    assert shown["id"] == current.pk != first.pk
    assert shown["uri"] == "http://testserver/resourcesync/bitstreams/resourcelist.xml"
    assert (shown["size"], shown["entries"], shown["sha256"]) == (current.size, current.entries, current.sha256)
    assert shown["capability"] == "resourcelist" and W3C_UTC.fullmatch(shown["at"]) and W3C_UTC.fullmatch(shown["completed"])
    assert anonymous.get(API + f"documents/{first.pk}/").status_code == 404
    assert [d["set"] for d in every_result(anonymous, API + "documents/?set=metadata&capability=resourcelist")] == ["metadata"]
    assert every_result(anonymous, API + "documents/?capability=resourcedump") == []
    assert "capability" in get_json(anonymous, API + "documents/?capability=nope", status=400)
    Document.objects.filter(pk=current.pk).update(withdrawn=timezone.now())
    assert {d["set"] for d in every_result(anonymous, API + "documents/")} == {"metadata"}
    # A capability the set no longer offers is not served: its documents are not listed either.
    ResourceSet.objects.filter(pk=metadata.pk).update(capabilities=["changelist"])
    assert every_result(anonymous, API + "documents/") == []


# -- changes ----------------------------------------------------------------------------------------


def test_following_the_change_log_cursor_to_the_end_gives_every_event_once_oldest_first(anonymous, published):
    events = list(ChangeEvent.objects.order_by("id").values_list("id", flat=True))
    assert len(events) > 5
    page = get_json(anonymous, API + "changes/?page_size=2")
    assert len(page["results"]) == 2 and page["previous"] is None and page["next"]
    followed = every_result(anonymous, API + "changes/?page_size=2")
    assert [e["id"] for e in followed] == events
    assert {e["change"] for e in followed} == {"created", "updated", "deleted"}
    first = followed[0]
    stored = ChangeEvent.objects.get(pk=first["id"])
    assert first["uri"] == stored.uri and first["changelist"] == stored.changelist.number
    assert W3C_UTC.fullmatch(first["datetime"])
    assert get_json(anonymous, API + f"changes/{first['id']}/")["uri"] == stored.uri


def test_changes_are_filtered_by_set_kind_since_and_until(anonymous, published):
    events = list(ChangeEvent.objects.order_by("id"))
    middle = sorted(e.datetime for e in events)[len(events) // 2]
    since = middle.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    shown = every_result(anonymous, API + f"changes/?since={since}&page_size=3")
    assert [e["id"] for e in shown] == [e.pk for e in events if e.datetime >= middle]
    shown = every_result(anonymous, API + f"changes/?until={since}")
    assert [e["id"] for e in shown] == [e.pk for e in events if e.datetime < middle]
    offset = middle.astimezone(datetime.timezone(timedelta(hours=2))).isoformat()  # +02:00, its "+" unescaped
    assert [e["id"] for e in every_result(anonymous, API + f"changes/?since={offset}")] == [
        e.pk for e in events if e.datetime >= middle
    ]
    assert every_result(anonymous, API + "changes/?since=2999") == []
    assert len(every_result(anonymous, API + "changes/?since=2000-01-01")) == len(events)
    deleted = every_result(anonymous, API + "changes/?change=deleted&set=bitstreams")
    assert deleted and {(e["change"], e["set"]) for e in deleted} == {("deleted", "bitstreams")}
    assert [e["id"] for e in deleted] == [e.pk for e in events if e.change == "deleted" and e.resource_set.slug == "bitstreams"]


@pytest.mark.parametrize(
    "query, parameter",
    [
        ("since=yesterday", "since"),
        ("since=2024-13-01", "since"),
        ("since=2024-02-30", "since"),
        ("since=2024-05-01T12:00:00", "since"),  # a time without its zone
        ("until=2024-05-01T25:00Z", "until"),
        ("until=2024-05-01T12:00:00%2B24:00", "until"),
        ("change=renamed", "change"),
        ("set=no-such-set", "set"),
        ("until=9999-12-31T23:59:59-23:59", "until"),  # past the last datetime once in UTC
        ("cursor=not-a-cursor", "cursor"),
        ("cursor=cD1hYmM%3D", "cursor"),  # p=abc: a position that is not a number
    ],
)
def test_a_parameter_that_cannot_be_understood_is_a_400_with_a_json_reason(anonymous, published, query, parameter):
    errors = get_json(anonymous, API + f"changes/?{query}", status=400)
    assert list(errors) == [parameter] and errors[parameter][0]


def test_w3c_datetimes_are_read_as_the_specification_writes_them():
    utc = datetime.timezone.utc
    assert parse_w3c_datetime("2024") == datetime.datetime(2024, 1, 1, tzinfo=utc)
    assert parse_w3c_datetime("2024-05") == datetime.datetime(2024, 5, 1, tzinfo=utc)
    assert parse_w3c_datetime("2024-05-01") == datetime.datetime(2024, 5, 1, tzinfo=utc)
    assert parse_w3c_datetime("2024-05-01T12:30Z") == datetime.datetime(2024, 5, 1, 12, 30, tzinfo=utc)
    assert parse_w3c_datetime("2024-05-01T12:30:15.25Z") == datetime.datetime(2024, 5, 1, 12, 30, 15, 250000, tzinfo=utc)
    assert parse_w3c_datetime("2024-05-01T14:30:00+02:00") == datetime.datetime(2024, 5, 1, 12, 30, tzinfo=utc)
    assert parse_w3c_datetime("2024-05-01T14:30:00 02:00") == datetime.datetime(2024, 5, 1, 12, 30, tzinfo=utc)
    assert parse_w3c_datetime("2024-05-01T10:30:00-02:00") == datetime.datetime(2024, 5, 1, 12, 30, tzinfo=utc)
    for bad in ("", "24", "2024-5-1", "2024-05-01T12Z", "2024-05-01T12:30", "2024-05-01 12:30Z", "2024-05-01T12:30:00+2"):
        assert parse_w3c_datetime(bad) is None, bad


def test_only_the_changes_of_sets_that_serve_a_change_list_are_public(anonymous, manager, published):
    bitstreams, metadata = published
    ResourceSet.objects.filter(pk=metadata.pk).update(capabilities=["resourcelist"])
    assert anonymous.get("/resourcesync/metadata/changelist.xml").status_code == 404
    assert {e["set"] for e in every_result(anonymous, API + "changes/")} == {"bitstreams"}
    assert get_json(anonymous, API + "changes/?set=metadata", status=400)
    hidden = ChangeEvent.objects.filter(resource_set=metadata).first()
    get_json(anonymous, API + f"changes/{hidden.pk}/", status=404)
    assert {e["set"] for e in every_result(manager, API + "changes/")} == {"bitstreams", "metadata"}


# -- pending changes and subscriptions -----------------------------------------------------------------


def test_pending_changes_are_for_managers_only(anonymous, member, bare_staff, manager, metadata):
    pending = [PendingChange.objects.create(source="metadata", object_pk=str(n)) for n in (1, 2, 3)]
    assert anonymous.get(API + "pending/").status_code == 401
    assert member.get(API + "pending/").status_code == 403
    assert bare_staff.get(API + "pending/").status_code == 403
    shown = every_result(manager, API + "pending/?page_size=2")
    assert [p["id"] for p in shown] == [p.pk for p in pending]
    assert shown[0]["source"] == "metadata" and shown[0]["set"] is None
    assert send(manager, "delete", API + f"pending/{pending[0].pk}/").status_code == 405


def test_managers_read_subscriptions_never_their_secret_and_end_one(anonymous, member, bare_staff, manager, metadata):
    subscription = Subscription.objects.create(
        resource_set=metadata, capability="change-notification", callback="https://example.org/callback",
        secret="s3cr3t-value", lease_seconds=600, expires=timezone.now() + timedelta(seconds=600),
    )
    path = API + f"subscriptions/{subscription.pk}/"
    assert anonymous.get(API + "subscriptions/").status_code == 401
    assert send(anonymous, "delete", path).status_code == 401
    for client in (member, bare_staff):
        assert client.get(API + "subscriptions/").status_code == 403
        assert send(client, "delete", path).status_code == 403
    (shown,) = every_result(manager, API + "subscriptions/")
    assert shown["callback"] == "https://example.org/callback" and shown["signed"] is True and shown["channel"] == (
        "change-notification")
    assert "s3cr3t-value" not in manager.get(API + "subscriptions/").content.decode()
    assert "s3cr3t-value" not in manager.get(path).content.decode()
    assert "secret" not in shown
    assert every_result(manager, API + "subscriptions/?set=bitstreams") == []
    assert send(manager, "patch", path, {"callback": "https://evil.example/"}).status_code == 405
    viewer = logged_in(make_user("viewer", staff=True, permissions=["view_subscription"]))
    assert viewer.get(path).status_code == 200
    assert send(viewer, "delete", path).status_code == 403
    assert send(manager, "delete", path).status_code == 204
    assert not Subscription.objects.exists()


# -- rebuild and reconcile ----------------------------------------------------------------------------


def test_a_manager_rebuilds_a_set_in_process_and_is_told_the_builds_made(manager, seed, metadata, committing):
    with committing():
        seed(2)
    response = send(manager, "post", API + "sets/metadata/rebuild/")
    assert response.status_code == 200, response.content
    answer = response.json()
    made = Build.objects.get(resource_set=metadata)
    assert answer == {"state": "done", "builds": [
        {"id": made.pk, "capability": "resourcelist", "status": "published", "entries": made.entries}
    ]}
    assert made.entries == 2


def test_a_manager_reconciles_a_set_in_process(manager, seed, metadata, committing):
    with committing():
        seed(2)
    editor = logged_in(make_user("editor", staff=True, permissions=["change_resourceset"]))
    for client in (manager, editor):
        response = send(client, "post", API + "sets/metadata/reconcile/")
        assert response.status_code == 200, response.content
        assert response.json()["state"] == "done" and isinstance(response.json()["summary"], str)
    assert metadata.resources.count() == 2


@pytest.fixture(params=[True, False], ids=["eager-propagates", "eager-keeps-errors"])
def eager_propagates(request):
    """Tasks run in process, their errors raised by ``delay()`` (the example project) or kept in the result."""
    conf = tasks.rebuild_set_task.app.conf
    before, conf.task_eager_propagates = conf.task_eager_propagates, request.param
    yield request.param
    conf.task_eager_propagates = before


def test_a_failing_rebuild_is_answered_failed_with_its_reason_not_a_500(
    manager, seed, metadata, eager_propagates, full_disk_for_metadata
):
    seed(2)
    response = send(manager, "post", API + "sets/metadata/rebuild/")
    assert response.status_code == 200, response.content
    failed = Build.objects.get(resource_set=metadata)
    assert failed.status == Build.Status.FAILED
    assert response.json() == {
        "state": "failed", "reason": "[Errno 28] No space left on device",
        "builds": [{"id": failed.pk, "capability": "resourcelist", "status": "failed", "entries": failed.entries}],
    }


def test_the_reason_of_a_failure_is_one_line_without_the_traceback(manager, seed, metadata, eager_propagates):
    from django_resourcesync.builders import resourcelist

    seed(1)
    with mock.patch.object(resourcelist, "update", side_effect=RuntimeError("The builder broke\n  File secret.py, line 1")):
        response = send(manager, "post", API + "sets/metadata/rebuild/")
    assert response.status_code == 200
    assert response.json()["state"] == "failed" and response.json()["reason"] == "The builder broke"
    assert "secret.py" not in response.content.decode()


def test_rebuild_and_reconcile_are_refused_to_anonymous_with_401_and_to_others_but_editors_with_403(
    anonymous, member, bare_staff, metadata
):
    viewer = logged_in(make_user("viewer", staff=True, permissions=["view_resourceset"]))
    with mock.patch.object(tasks.rebuild_set_task, "delay") as rebuild, \
            mock.patch.object(tasks.reconcile_set_task, "delay") as reconcile:
        for action in ("rebuild", "reconcile"):
            response = send(anonymous, "post", API + f"sets/metadata/{action}/")
            assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Basic")
            assert "detail" in response.json()
            for client in (member, bare_staff, viewer):
                response = send(client, "post", API + f"sets/metadata/{action}/")
                assert response.status_code == 403 and "detail" in response.json()
    assert not rebuild.called and not reconcile.called and not Build.objects.exists()


def test_rebuilding_a_disabled_set_is_a_409(manager, metadata):
    ResourceSet.objects.filter(pk=metadata.pk).update(enabled=False)
    response = send(manager, "post", API + "sets/metadata/rebuild/")
    assert response.status_code == 409 and "disabled" in response.json()["detail"]


@pytest.fixture
def with_broker(settings):
    """Tasks sent to a broker, as in production (none is started: ``delay`` is replaced)."""
    conf = tasks.rebuild_set_task.app.conf
    eager, conf.task_always_eager = conf.task_always_eager, False
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "TASKS": "celery"}
    yield
    conf.task_always_eager = eager


def test_a_task_sent_to_a_broker_is_answered_202_queued(manager, metadata, with_broker):
    from celery.result import AsyncResult

    with mock.patch.object(tasks.rebuild_set_task, "delay", return_value=AsyncResult("some-id")) as rebuild:
        response = send(manager, "post", API + "sets/metadata/rebuild/")
    assert response.status_code == 202
    assert response.json() == {"task_id": "some-id", "state": "queued"}
    rebuild.assert_called_once_with(metadata.pk)


@pytest.mark.parametrize("eager", [False, True], ids=["broker", "eager"])
def test_a_broker_that_cannot_be_reached_is_a_503_with_a_json_reason(manager, metadata, eager, settings):
    from kombu.exceptions import OperationalError

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "TASKS": "celery"}
    conf = tasks.reconcile_set_task.app.conf
    before, conf.task_always_eager = conf.task_always_eager, eager
    try:
        refused = OperationalError("[Errno 111] Connection refused")
        with mock.patch.object(tasks.reconcile_set_task, "delay", side_effect=refused):
            response = send(manager, "post", API + "sets/metadata/reconcile/")
    finally:
        conf.task_always_eager = before
    assert response.status_code == 503
    assert "Connection refused" in response.json()["detail"]


# -- authentication -----------------------------------------------------------------------------------


def test_basic_and_token_authentication_reach_the_managers_endpoints(anonymous, published):
    from rest_framework.authtoken.models import Token

    user = make_user("robot", staff=True, permissions="all")
    credentials = base64.b64encode(b"robot:pw").decode()
    assert anonymous.get(API + "builds/", HTTP_AUTHORIZATION=f"Basic {credentials}").status_code == 200
    wrong = base64.b64encode(b"robot:wrong").decode()
    response = anonymous.get(API + "builds/", HTTP_AUTHORIZATION=f"Basic {wrong}")
    assert response.status_code == 401 and "detail" in response.json()
    token = Token.objects.create(user=user)
    assert anonymous.get(API + "builds/", HTTP_AUTHORIZATION=f"Token {token.key}").status_code == 200
    response = send(anonymous, "post", API + "sets/metadata/reconcile/", HTTP_AUTHORIZATION=f"Token {token.key}")
    assert response.status_code == 200 and response.json()["state"] == "done"
    assert anonymous.get(API + "builds/", HTTP_AUTHORIZATION="Token not-a-token").status_code == 401
    member = make_user("member")
    token = Token.objects.create(user=member)
    assert anonymous.get(API + "builds/", HTTP_AUTHORIZATION=f"Token {token.key}").status_code == 403


def test_a_client_that_is_not_logged_in_gets_401_whenever_one_authentication_class_has_a_challenge(anonymous, db):
    from rest_framework.authentication import SessionAuthentication, TokenAuthentication

    from django_resourcesync.api.views import BuildViewSet

    # Session authentication first (it has no challenge), as in the example project.
    with mock.patch.object(BuildViewSet, "authentication_classes", [SessionAuthentication, TokenAuthentication]):
        response = anonymous.get(API + "builds/")
    assert response.status_code == 401 and response["WWW-Authenticate"] == "Token"
    # None has one: a 401 must carry a challenge (RFC 9110), so DRF answers 403.
    with mock.patch.object(BuildViewSet, "authentication_classes", [SessionAuthentication]):
        response = anonymous.get(API + "builds/")
    assert response.status_code == 403 and "WWW-Authenticate" not in response and "detail" in response.json()


# -- schema ---------------------------------------------------------------------------------------------


def test_the_schema_is_valid_openapi_3_and_generated_without_warnings(anonymous):
    from drf_spectacular.drainage import GENERATOR_STATS
    from openapi_spec_validator import validate

    GENERATOR_STATS.reset()
    schema = get_json(anonymous, API + "schema/?format=json", HTTP_ACCEPT="application/json")
    assert not GENERATOR_STATS, (dict(GENERATOR_STATS._warn_cache), dict(GENERATOR_STATS._error_cache))
    validate(schema)
    assert schema["openapi"].startswith("3.")
    paths = schema["paths"]
    assert set(paths) == {
        f"{API}{p}" for p in ("sets/", "sets/{slug}/", "sets/{slug}/rebuild/", "sets/{slug}/reconcile/", "builds/",
                              "builds/{id}/", "documents/", "documents/{id}/", "changes/", "changes/{id}/", "pending/",
                              "pending/{id}/", "subscriptions/", "subscriptions/{id}/", "tokens/", "tokens/{id}/",
                              "tokens/{id}/revoke/")
    }
    assert {p["name"] for p in paths[f"{API}changes/"]["get"]["parameters"]} >= {"set", "change", "since", "until", "cursor"}
    assert {} in paths[f"{API}sets/"]["get"]["security"]  # anyone reads the sets
    assert {} not in paths[f"{API}sets/"]["post"]["security"]
    assert {} not in paths[f"{API}builds/"]["get"]["security"]
    assert "secret" not in schema["components"]["schemas"]["Subscription"]["properties"]
    assert anonymous.get(API + "schema/").status_code == 200  # YAML


def test_the_spectacular_command_generates_the_sites_schema_without_warnings(tmp_path):
    from drf_spectacular.drainage import GENERATOR_STATS

    GENERATOR_STATS.reset()
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    assert "/resourcesync/api/changes/" in out.read_text()


# A site whose settings name no DEFAULT_SCHEMA_CLASS (DRF's own default then): the settings are
# read when the views are imported, so in a process of its own.
WITHOUT_SCHEMA_CLASS = """
import sys, types
import django
from tests import settings as base
plain = types.ModuleType("plain_settings")
plain.__dict__.update({k: v for k, v in vars(base).items() if k.isupper()})
plain.REST_FRAMEWORK = {k: v for k, v in base.REST_FRAMEWORK.items() if k != "DEFAULT_SCHEMA_CLASS"}
sys.modules["plain_settings"] = plain
django.setup()
from django.core.management import call_command
call_command("spectacular", "--validate", "--fail-on-warn", "--format", "openapi-json", "--file", sys.argv[1])
"""


def test_a_site_without_drf_spectaculars_schema_class_gets_the_schema_without_warnings(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from openapi_spec_validator import validate

    out = tmp_path / "schema.json"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "plain_settings", "PYTHONPATH": str(Path(__file__).parent.parent)}
    done = subprocess.run([sys.executable, "-c", WITHOUT_SCHEMA_CLASS, str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Warning" not in done.stderr and "Error" not in done.stderr, done.stderr
    schema = json.loads(out.read_text())
    validate(schema)
    assert "/resourcesync/api/sets/{slug}/rebuild/" in schema["paths"]


@pytest.mark.parametrize("site, expected", [
    (None, ("django-resourcesync API", "own version", "own description")),  # a new site that never set them
    ({"TITLE": "Our repository", "VERSION": "7.1"}, ("Our repository", "7.1", "own description")),
    ("example", ("django-resourcesync", "own version", "What the ResourceSync Source publishes: sets, builds, "
                                                       "documents, changes.")),
], ids=["none", "title-and-version", "example"])
def test_the_schema_names_the_app_and_its_version_but_what_the_site_set(anonymous, settings, site, expected):
    from django_resourcesync import __version__
    from django_resourcesync.api.schema import OWN_INFO

    if site is None:
        del settings.SPECTACULAR_SETTINGS
    elif site != "example":
        settings.SPECTACULAR_SETTINGS = site
    info = get_json(anonymous, API + "schema/?format=json", HTTP_ACCEPT="application/json")["info"]
    own = {"own version": __version__, "own description": OWN_INFO["DESCRIPTION"]}
    assert (info["title"], info["version"], info["description"]) == tuple(own.get(value, value) for value in expected)
    assert __version__ != "0.0.0" and "ResourceSync Source" in OWN_INFO["DESCRIPTION"]


@pytest.mark.parametrize("assets", ["sidecar", "cdn"])
def test_the_schema_page_answers_and_references_no_other_host(anonymous, settings, assets):
    from drf_spectacular.settings import SPECTACULAR_DEFAULTS, patched_settings

    # Whatever the site says: drf-spectacular's own default is a CDN.
    cdn = {key: SPECTACULAR_DEFAULTS[key] for key in ("SWAGGER_UI_DIST", "SWAGGER_UI_FAVICON_HREF")}
    with patched_settings(cdn if assets == "cdn" else None):
        response = anonymous.get(API + "schema/ui/")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    hosts = set(re.findall(r"(?:https?:)?//([A-Za-z0-9.-]+)", html))
    assert hosts <= {"testserver"}, hosts
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert len(assets) >= 3
    for asset in assets:
        assert asset.startswith(settings.STATIC_URL), asset
        assert finders.find(asset.removeprefix(settings.STATIC_URL)), asset  # served by the site itself
    assert '"/resourcesync/api/schema/"' in html and '"validatorUrl": null' in html


# -- throttling -----------------------------------------------------------------------------------------


def test_the_fourth_anonymous_request_in_a_minute_is_a_429_with_a_json_reason(anonymous, manager, bitstreams, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "API_ANON_RATE": "3/minute"}
    for path in ("sets/", "documents/", "changes/"):
        assert anonymous.get(API + path).status_code == 200
    response = anonymous.get(API + "sets/")
    assert response.status_code == 429 and "Retry-After" in response
    assert "throttled" in response.json()["detail"]
    for _n in range(5):  # a logged-in client is not counted
        assert manager.get(API + "sets/").status_code == 200
    for path in ("schema/", "schema/ui/", "nothing/"):  # every answer of the API is JSON, errors included
        response = anonymous.get(API + path)
        assert response.status_code in (404, 429) and response.json()["detail"]


def test_no_anonymous_rate_means_no_limit(anonymous, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "API_ANON_RATE": None}
    for _n in range(10):
        assert anonymous.get(API + "sets/").status_code == 200


def test_a_malformed_anonymous_rate_is_a_check_error_with_a_hint_and_the_default_limit_holds(anonymous, settings):
    for rate in ("lots", "300/fortnight", "0/minute", 300):
        settings.RESOURCESYNC = {**settings.RESOURCESYNC, "API_ANON_RATE": rate}
        (error,) = [m for m in checks.run_checks() if m.id == "resourcesync.E026"]
        assert repr(rate) in error.msg and "300/minute" in error.hint
    assert anonymous.get(API + "sets/").status_code == 200  # not a 500
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "API_ANON_RATE": "10/s"}
    assert not [m for m in checks.run_checks() if m.id == "resourcesync.E026"]


def test_the_api_pages_warn_when_drf_spectacular_or_its_sidecar_is_not_installed(anonymous, settings):
    assert not [m for m in checks.run_checks() if m.id == "resourcesync.W010"]
    settings.INSTALLED_APPS = [app for app in settings.INSTALLED_APPS if not app.startswith("drf_spectacular")]
    (warning,) = [m for m in checks.run_checks() if m.id == "resourcesync.W010"]
    assert "drf_spectacular, drf_spectacular_sidecar" in warning.msg and "INSTALLED_APPS" in warning.hint
    response = anonymous.get(API + "schema/ui/")
    assert response.status_code == 503 and "INSTALLED_APPS" in response.json()["detail"]
    assert anonymous.get(API + "schema/?format=json").status_code == 200


# -- the browsable API ------------------------------------------------------------------------------------


def test_the_browsable_api_renders_for_anyone_and_for_managers(anonymous, manager, published):
    build_id = Build.objects.first().pk
    pages = {anonymous: ["", "sets/", "sets/bitstreams/", "documents/", "changes/"],
             manager: ["", "sets/", "sets/bitstreams/", "builds/", f"builds/{build_id}/", "changes/", "pending/",
                       "subscriptions/"]}
    for client, paths in pages.items():
        for path in paths:
            response = client.get(API + path, HTTP_ACCEPT="text/html")
            assert response.status_code == 200, (path, response.content[:1000])
            assert response["Content-Type"].startswith("text/html")
    response = manager.get(API + "sets/bitstreams/rebuild/", HTTP_ACCEPT="text/html")
    assert response.status_code == 405


# -- found in review ----------------------------------------------------------------------------------------


def test_events_of_an_archived_change_list_are_public_only_where_the_set_offers_the_change_list_archive(
    seed, metadata, committing, anonymous, manager, settings
):
    from django_resourcesync.rebuild import rebuild_set

    from .test_archives import age_the_log

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "CHANGELIST_RETENTION": 30 * 86400}
    metadata.capabilities = ["resourcelist", "changelist", "changelist-archive"]
    metadata.save()
    with committing():
        seed(2)
    rebuild_set(metadata)
    with committing():
        item = Item.objects.order_by("pk").first()
        item.title = "Retitled"
        item.save()
    age_the_log(metadata, days=31)
    assert metadata.changelists.filter(archived__isnull=False).exists()
    assert every_result(anonymous, API + "changes/?set=metadata")  # the Change List Archive serves its list
    metadata.capabilities = ["resourcelist", "changelist"]
    metadata.save()
    # No document serves the archived list any more: its events are not public either.
    assert every_result(anonymous, API + "changes/?set=metadata") == []
    assert every_result(manager, API + "changes/?set=metadata")  # managers see the whole log


@pytest.mark.parametrize("value", ["%00", "a%00", "%F0%9F%98%80", "x" * 300])
def test_a_set_parameter_that_is_no_slug_is_a_400_not_sent_to_the_database(anonymous, metadata, value):
    for path in ("changes/", "documents/"):
        body = get_json(anonymous, f"{API}{path}?set={value}", status=400)
        assert "set" in body


def test_a_filter_the_orm_cannot_build_is_refused_with_its_reason(manager, seed, metadata):
    response = send(manager, "post", API + "sets/", {
        "name": "x", "slug": "x", "source": "metadata", "lookups": {"pk__range": [1]}, "capabilities": ["resourcelist"],
    })
    assert response.status_code == 400, response.content
    assert "lookups" in response.json()


def test_the_documents_of_many_sets_are_listed(anonymous, db):
    ResourceSet.objects.bulk_create(
        ResourceSet(
            name=f"Set {n}", slug=f"set-{n:04d}", source="metadata", capabilities=["resourcelist", "changelist"][:1 + n % 2]
        )
        for n in range(1200)
    )
    assert get_json(anonymous, API + "documents/")["results"] == []


def test_many_sets_at_one_position_are_each_listed_once(anonymous, db):
    ResourceSet.objects.bulk_create(
        ResourceSet(name=f"Set {n}", slug=f"set-{n:04d}", source="metadata", position=0) for n in range(1150)
    )
    slugs = [row["slug"] for row in every_result(anonymous, API + "sets/?page_size=100")]
    assert len(slugs) == ResourceSet.objects.public().count() and len(set(slugs)) == len(slugs) > 1150


def test_a_body_nested_too_deep_to_read_is_a_400(manager):
    response = manager.post(API + "sets/", "[" * 50_000 + "]" * 50_000, content_type="application/json")
    assert response.status_code == 400 and "detail" in response.json()


def test_the_api_answers_over_http_with_a_token(live_server, settings, transactional_db):
    import requests
    from rest_framework.authtoken.models import Token

    user = make_user("tokenholder", staff=True, permissions="all")
    token = Token.objects.create(user=user)
    url = f"{live_server.url}{API}builds/"
    refused = requests.get(url, timeout=30)
    assert refused.status_code == 401 and refused.headers["WWW-Authenticate"]
    answered = requests.get(url, headers={"Authorization": f"Token {token.key}"}, timeout=30)
    assert answered.status_code == 200 and answered.json()["results"] == []
    assert requests.get(url, headers={"Authorization": "Token not-a-token"}, timeout=30).status_code == 401
