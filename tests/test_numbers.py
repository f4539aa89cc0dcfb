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


# The admin pages: a number in a filter of a list, or in the selection an action is asked for.

#: Past 64 bits either way (a filter or a selection takes a sign, a path does not).
ADMIN_NUMBERS = {**NUMBERS, "-2**63-1": str(-(2**63) - 1)}


def _admin_pages():
    """``(list URL, ModelAdmin)`` of each model of the app, and of the example project's
    repository, with an admin page."""
    from django.apps import apps
    from django.contrib import admin

    for label in ("resourcesync", "repository"):
        for model in apps.get_app_config(label).get_models():
            if admin.site.is_registered(model):
                yield f"/admin/{label}/{model._meta.model_name}/", admin.site.get_model_admin(model)


def _relation_filters():
    """Each list filter of the app's admin pages on a relation, by the parameter its links set
    (``resource_set__id__exact``), by the relation's name alone and with ``__in``, which the
    admin takes too; and ``id__in`` on every list (Django guards ``id=`` only)."""
    from django.contrib.admin.utils import get_fields_from_path

    for page, model_admin in _admin_pages():
        yield page, "id__in"
        for name in model_admin.list_filter:
            field = get_fields_from_path(model_admin.model, name)[-1] if isinstance(name, str) else None
            if field is not None and field.is_relation:
                yield from ((page, name), (page, f"{name}__{field.target_field.name}__exact"), (page, f"{name}__in"))


def _actions():
    """``(list URL, action)`` of each action a superuser is offered on the app's admin pages."""
    from django.contrib.auth.models import User
    from django.test import RequestFactory

    request = RequestFactory().get("/")
    request.user = User(is_superuser=True, is_active=True)
    return [(page, action) for page, model_admin in _admin_pages() for action in model_admin.get_actions(request)]


RELATION_FILTERS = list(_relation_filters())
ACTIONS = _actions()
#: Years of the app's dates no date has: the list's date hierarchy, a lookup on another date.
YEARS = [("/admin/resourcesync/changeevent/", "datetime__year"), ("/admin/resourcesync/subscription/", "created__year")]
NOTHING_SELECTED = "Items must be selected in order to perform actions on them. No items have been changed."


def _admin_refuses_the_filter(admin_client, response):
    """The admin's answer to a filter it cannot apply: back to the list, unfiltered; or, where
    Django itself sees that the number names no object (``resource_set__id__exact``), the list
    of none."""
    if response.status_code == 200:
        assert response.context["cl"].result_count == 0
        return
    assert response.status_code == 302 and response["Location"].endswith("?e=1"), response.status_code
    assert admin_client.get(response["Location"]).status_code == 200


@pytest.mark.parametrize("number", ADMIN_NUMBERS.values(), ids=ADMIN_NUMBERS.keys())
@pytest.mark.parametrize(("page", "name"), [*RELATION_FILTERS, *YEARS])
def test_a_number_out_of_range_in_an_admin_filter_is_refused_as_a_bad_filter(admin_client, page, name, number):
    admin_client.raise_request_exception = False
    _admin_refuses_the_filter(admin_client, admin_client.get(f"{page}?{urlencode({name: number})}"))


@pytest.mark.parametrize("year", ["0", "10000"])
@pytest.mark.parametrize(("page", "name"), YEARS)
def test_a_year_no_date_has_in_an_admin_filter_is_refused_as_a_bad_filter(admin_client, page, name, year):
    admin_client.raise_request_exception = False
    _admin_refuses_the_filter(admin_client, admin_client.get(f"{page}?{urlencode({name: year})}"))


@pytest.mark.parametrize("number", [str(2**63 - 1), str(-(2**63))], ids=["2**63-1", "-2**63"])
@pytest.mark.parametrize(("page", "name"), RELATION_FILTERS)
def test_the_same_admin_filters_take_the_numbers_a_database_holds(admin_client, page, name, number):
    """(Those above are refused for their number, not for their name.)"""
    assert admin_client.get(f"{page}?{urlencode({name: number})}").status_code == 200


@pytest.mark.parametrize("number", ADMIN_NUMBERS.values(), ids=ADMIN_NUMBERS.keys())
@pytest.mark.parametrize(("page", "action"), ACTIONS)
def test_a_number_out_of_range_selected_for_an_admin_action_selects_nothing(admin_client, page, action, number):
    admin_client.raise_request_exception = False
    response = admin_client.post(page, {"action": action, "index": 0, "_selected_action": [number]})
    assert response.status_code == 302, response.status_code
    shown = [str(m) for m in admin_client.get(response["Location"]).context["messages"]]
    assert shown == [NOTHING_SELECTED]


@pytest.mark.parametrize("number", ADMIN_NUMBERS.values(), ids=ADMIN_NUMBERS.keys())
@pytest.mark.parametrize("page", [page for page, action in ACTIONS if action == "delete_selected"])
def test_a_number_out_of_range_confirmed_for_deletion_deletes_nothing(admin_client, page, number):
    """The form of the page that asks to confirm a deletion, posted with such a number."""
    admin_client.raise_request_exception = False
    response = admin_client.post(page, {"action": "delete_selected", "post": "yes", "_selected_action": [number]})
    assert response.status_code == 302, response.status_code
    assert [str(m) for m in admin_client.get(response["Location"]).context["messages"]] == [NOTHING_SELECTED]


def test_an_action_acts_on_the_objects_selected_with_a_number_out_of_range(admin_client):
    from django_resourcesync import access
    from django_resourcesync.models import AccessToken

    token, _issued = access.issue("Partner", [])
    admin_client.raise_request_exception = False
    response = admin_client.post(
        "/admin/resourcesync/accesstoken/",
        {"action": "revoke", "index": 0, "_selected_action": [str(2**63), token.pk, "9" * 5000]}, follow=True,
    )
    assert [str(m) for m in response.context["messages"]] == ["1 token revoked."]
    assert AccessToken.objects.get(pk=token.pk).revoked is not None
