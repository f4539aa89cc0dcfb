"""The admin shows what each set publishes, and rebuilds on request."""

import re

import pytest

from django_resourcesync.models import Build, ResourceSet

from .helpers import build

pytestmark = pytest.mark.django_db


def test_set_page_shows_counts_and_links(admin_client, seed, bitstreams):
    seed(4)
    result = build(bitstreams)
    changelist = admin_client.get("/admin/resourcesync/resourceset/")
    assert changelist.status_code == 200
    assert b"Files of public items" in changelist.content
    page = admin_client.get(f"/admin/resourcesync/resourceset/{bitstreams.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "http://testserver/resourcesync/bitstreams/resourcelist.xml" in html
    assert "resourcesync-state-published" in html
    assert f"<td>{result.entries}</td>" in html
    assert admin_client.get(f"/admin/resourcesync/build/{result.pk}/change/").status_code == 200
    assert admin_client.get("/admin/resourcesync/resource/").status_code == 200


def test_rebuild_action(admin_client, seed, metadata):
    seed(2)
    response = admin_client.post(
        "/admin/resourcesync/resourceset/", {"action": "rebuild", "_selected_action": [metadata.pk]}, follow=True
    )
    assert response.status_code == 200
    assert Build.objects.get(resource_set=metadata).status == Build.Status.PUBLISHED


def test_add_set_through_the_admin(admin_client, seed):
    response = admin_client.post(
        "/admin/resourcesync/resourceset/add/",
        {
            "name": "Theses",
            "slug": "theses",
            "source": "metadata",
            "lookups": '{"collection__slug": "theses"}',
            "describedby": "https://example.org/about-theses",
            "capabilities": ["resourcelist"],
            "enabled": "on",
            "position": 3,
        },
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    response = admin_client.post(
        "/admin/resourcesync/resourceset/add/",
        {"name": "Bad", "slug": "bad", "source": "nosuchsource", "lookups": "{}", "position": 0},
    )
    assert response.status_code == 200 and b"Select a valid choice" in response.content


def test_the_published_record_cannot_be_edited_or_deleted(admin_client, seed, metadata):
    seed(1)
    result = build(metadata)
    assert admin_client.get(f"/admin/resourcesync/build/{result.pk}/delete/").status_code == 403
    resource = metadata.resources.get()
    assert admin_client.get(f"/admin/resourcesync/resource/{resource.pk}/delete/").status_code == 403


def staff_client(client, username, *permissions):
    """A client logged in as a staff user holding only the given permissions of the app."""
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user(username, f"{username}@example.org", "pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="resourcesync", codename__in=permissions))
    client.force_login(user)
    return client


def test_the_actions_need_the_change_permission(client, seed, metadata):
    from unittest import mock

    from django_resourcesync import tasks

    seed(1)
    viewer = staff_client(client, "viewer", "view_resourceset")
    changelist = viewer.get("/admin/resourcesync/resourceset/")
    assert changelist.status_code == 200 and b'value="rebuild"' not in changelist.content
    with mock.patch.object(tasks.rebuild_set_task, "delay") as rebuild, \
            mock.patch.object(tasks.reconcile_set_task, "delay") as reconcile:
        for action in ("rebuild", "reconcile"):
            response = viewer.post(
                "/admin/resourcesync/resourceset/", {"action": action, "index": 0, "_selected_action": [metadata.pk]}, follow=True
            )
            assert response.status_code in (200, 403)
    assert not rebuild.called and not reconcile.called and not Build.objects.exists()

    editor = staff_client(client, "editor", "change_resourceset")
    changelist = editor.get("/admin/resourcesync/resourceset/").content
    assert b'value="rebuild"' in changelist and b'value="reconcile"' in changelist
    response = editor.post(
        "/admin/resourcesync/resourceset/", {"action": "rebuild", "index": 0, "_selected_action": [metadata.pk]}, follow=True
    )
    assert response.status_code == 200
    assert Build.objects.get(resource_set=metadata).status == Build.Status.PUBLISHED


@pytest.mark.parametrize("view", ["add", "change"])
@pytest.mark.parametrize("slug, lookup", [("metadata", "title__regex"), ("bitstreams", "item__title__regex")])
def test_a_filter_the_database_rejects_is_a_form_error(admin_client, seed, bitstreams, metadata, view, slug, lookup):
    seed(2)
    resource_set = ResourceSet.objects.get(slug=slug)
    form = {"name": "Bad regex", "slug": "bad-regex", "source": slug, "lookups": f'{{"{lookup}": "("}}',
            "capabilities": ["resourcelist"], "enabled": "on", "position": 3}
    url = "/admin/resourcesync/resourceset/" + ("add/" if view == "add" else f"{resource_set.pk}/change/")
    response = admin_client.post(url, form)
    assert response.status_code == 200
    assert "The source rejects this filter" in response.content.decode()
    assert not ResourceSet.objects.filter(slug="bad-regex").exists()
    resource_set.refresh_from_db()
    assert resource_set.lookups != {lookup: "("}


@pytest.fixture(params=[True, False], ids=["eager-propagates", "eager-keeps-errors"])
def eager_propagates(request):
    """Tasks run in process, their errors raised by ``delay()`` (the example project) or kept in the result."""
    from django_resourcesync.tasks import rebuild_set_task

    conf = rebuild_set_task.app.conf
    before, conf.task_eager_propagates = conf.task_eager_propagates, request.param
    yield request.param
    conf.task_eager_propagates = before


def test_a_failing_rebuild_is_a_message_and_the_other_sets_go_on(
    admin_client, seed, bitstreams, metadata, eager_propagates, full_disk_for_metadata
):
    seed(2)
    response = admin_client.post(
        "/admin/resourcesync/resourceset/",
        {"action": "rebuild", "index": 0, "_selected_action": [metadata.pk, bitstreams.pk]},
        follow=True,
    )
    assert response.status_code == 200
    shown = [(m.level_tag, str(m)) for m in response.context["messages"]]
    assert ("error", f"Rebuilding “{metadata}” failed: [Errno 28] No space left on device") in shown, shown
    assert ("success", "Rebuilt 1 set.") in shown, shown
    assert Build.objects.get(resource_set=bitstreams).status == Build.Status.PUBLISHED
    assert Build.objects.get(resource_set=metadata).status == Build.Status.FAILED


def test_a_broker_that_cannot_be_reached_is_a_message(admin_client, metadata):
    from unittest import mock

    from kombu.exceptions import OperationalError

    from django_resourcesync import tasks

    refused = OperationalError("[Errno 111] Connection refused")
    with mock.patch.object(tasks.reconcile_set_task, "delay", side_effect=refused):
        response = admin_client.post(
            "/admin/resourcesync/resourceset/",
            {"action": "reconcile", "index": 0, "_selected_action": [metadata.pk]},
            follow=True,
        )
    assert response.status_code == 200
    shown = [(m.level_tag, str(m)) for m in response.context["messages"]]
    assert ("error", f"Reconciling “{metadata}” failed: [Errno 111] Connection refused") in shown, shown


def test_a_task_sent_to_a_broker_is_reported_queued(admin_client, metadata, settings):
    from unittest import mock

    from celery.result import AsyncResult

    from django_resourcesync import tasks

    conf = tasks.rebuild_set_task.app.conf
    eager, conf.task_always_eager = conf.task_always_eager, False
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "TASKS": "celery"}  # no broker is started
    try:
        with mock.patch.object(tasks.rebuild_set_task, "delay", return_value=AsyncResult("some-id")):
            response = admin_client.post(
                "/admin/resourcesync/resourceset/",
                {"action": "rebuild", "index": 0, "_selected_action": [metadata.pk]},
                follow=True,
            )
    finally:
        conf.task_always_eager = eager
    assert [str(m) for m in response.context["messages"]] == ["Rebuild queued for 1 set."]


def test_left_out_objects_are_shown_with_their_reason(admin_client, seed, bitstreams):
    from example_project.repository.models import ItemFile

    seed(2)
    ItemFile.objects.filter(pk=ItemFile.objects.order_by("pk")[0].pk).update(name="new\nline.txt")
    build(bitstreams)
    sets = admin_client.get("/admin/resourcesync/resourceset/").content.decode()
    left_out = f'leftout/?resource_set__id__exact={bitstreams.pk}" class="resourcesync-failure">1 left out</a>'
    assert left_out in sets
    listed = admin_client.get(f"/admin/resourcesync/leftout/?resource_set__id__exact={bitstreams.pk}").content.decode()
    assert "NoReverseMatch" in listed
    resource_list = Build.objects.get(resource_set=bitstreams, capability="resourcelist")
    assert "left_out" in admin_client.get(f"/admin/resourcesync/build/{resource_list.pk}/change/").content.decode()


def test_the_apps_tokens_are_told_apart_from_the_rest_frameworks(admin_client):
    index = admin_client.get("/admin/").content.decode()
    assert ">Partner access tokens</a>" in index and ">Tokens</a>" in index  # the REST framework's, beside
    tokens = admin_client.get("/admin/resourcesync/accesstoken/").content.decode()
    assert "Select partner access token to change" in tokens
    help_text = re.search(r'<p class="resourcesync-help" id="resourcesync-token-help">(.*?)</p>', tokens, re.S).group(1)
    assert "open the sets for partners to Destinations" in help_text and "not the REST framework" in help_text


def test_counts_read_as_words_and_a_sets_slug_and_source_are_labelled(admin_client, seed, metadata, bitstreams):
    from django_resourcesync import access

    seed(2)
    response = admin_client.post(
        "/admin/resourcesync/resourceset/", {"action": "rebuild", "index": 0, "_selected_action": [metadata.pk, bitstreams.pk]},
        follow=True,
    )
    assert [str(m) for m in response.context["messages"]] == ["Rebuilt 2 sets."]
    sets = response.content.decode()
    assert ('<span class="resourcesync-pair">slug: bitstreams</span> · <span class="resourcesync-pair">source: bitstreams</span>'
            in sets)
    assert "(s)" not in sets
    token, _issued = access.issue("Partner", [])
    response = admin_client.post(
        "/admin/resourcesync/accesstoken/", {"action": "revoke", "index": 0, "_selected_action": [token.pk]}, follow=True
    )
    assert [str(m) for m in response.context["messages"]] == ["1 token revoked."]


def test_the_sets_page_says_where_tasks_run_and_warns_of_stalled_changes(admin_client, metadata):
    from datetime import timedelta

    from django.utils import timezone

    from django_resourcesync.models import PendingChange

    page = admin_client.get("/admin/resourcesync/resourceset/")
    assert 'id="resourcesync-tasks" data-mode="eager"' in page.content.decode()
    assert not [m for m in page.context["messages"] if m.level_tag == "warning"]
    PendingChange.objects.create(source="metadata", object_pk="1", related="", recorded=timezone.now() - timedelta(minutes=3))
    page = admin_client.get("/admin/resourcesync/resourceset/")
    warned = [str(m) for m in page.context["messages"] if m.level_tag == "warning"]
    assert len(warned) == 1 and warned[0].startswith("1 pending change has waited since") and "own process" in warned[0]


def test_what_a_set_publishes_is_counted_in_words(admin_client, seed, metadata):
    from django_resourcesync.rebuild import rebuild_set

    seed(1)
    ResourceSet.objects.filter(pk=metadata.pk).update(
        capabilities=["resourcelist", "changelist", "resourcelist-archive", "change-notification"])
    metadata.refresh_from_db()
    rebuild_set(metadata)
    for url in ("/admin/resourcesync/resourceset/", f"/admin/resourcesync/resourceset/{metadata.pk}/change/"):
        page = admin_client.get(url).content.decode()
        assert "(s)" not in page and not re.search(r"\d bytes", page), url
    page = admin_client.get(f"/admin/resourcesync/resourceset/{metadata.pk}/change/").content.decode()
    assert re.search(r"\b1 (entry|document|change|subscription)\b", page), "a count of one in the singular"
