"""The admin shows what each set publishes, and rebuilds on request."""

import pytest

from django_resourcesync.models import Build

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
    assert f"{result.entries} entries in 1 file(s)" in html
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
