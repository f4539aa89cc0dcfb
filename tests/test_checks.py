"""Every misconfiguration a site owner can make is a system check error with a hint."""

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client

from django_resourcesync.models import ResourceSet

from .conftest import demo_set


def ids(databases=None):
    """The app's check messages but the information on where its tasks run (I001)."""
    return {
        m.id: m for m in checks.run_checks(databases=databases)
        if m.id and m.id.startswith("resourcesync.") and m.level > checks.INFO
    }


def test_default_configuration_is_clean():
    assert ids() == {}


@pytest.mark.parametrize(
    "override, expected",
    [
        ({"BASE_URL": None}, "resourcesync.E003"),
        ({"BASE_URL": ""}, "resourcesync.E003"),
        ({"BASE_URL": "ftp://example.org"}, "resourcesync.E004"),
        ({"BASE_URL": "https://example.org/sub"}, "resourcesync.E004"),
        ({"STORAGE": "nosuchalias"}, "resourcesync.E005"),
        ({"BATCH_SIZE": 0}, "resourcesync.E006"),
        ({"BUILD_THREADS": 0}, "resourcesync.E006"),
        ({"BUILD_THREADS": "2"}, "resourcesync.E006"),
        ({"MAX_ENTRIES_PER_DOCUMENT": 60_000}, "resourcesync.E007"),
        ({"MAX_DOCUMENT_BYTES": 100 * 1024 * 1024}, "resourcesync.E008"),
        ({"KEEP_BUILDS": -1}, "resourcesync.E009"),
        ({"SWEEP_GRACE_SECONDS": -5}, "resourcesync.E009"),
        ({"SWEEP_GRACE_SECONDS": "1h"}, "resourcesync.E009"),
        ({"NO_SUCH_KEY": 1}, "resourcesync.E002"),
        ({"BASE_URL": "https://not-allowed.example"}, "resourcesync.E016"),
        ({"CHANGELIST_PERIOD": "fortnightly"}, "resourcesync.E014"),
        ({"CHANGELIST_RETENTION": 0}, "resourcesync.E015"),
        ({"BACKGROUND_DISPATCH": "yes"}, "resourcesync.E018"),
        ({"HTML_PAGES": "no"}, "resourcesync.E031"),
        ({"TASKS": "workers"}, "resourcesync.E030"),
        ({"LINK_SCHEMES": "https"}, "resourcesync.E021"),
        ({"LINK_SCHEMES": ["http", "https:"]}, "resourcesync.E021"),
        ({"LINK_SCHEMES": ("http", None)}, "resourcesync.E021"),
    ],
)
def test_bad_settings(settings, override, expected):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, **override}
    found = ids()
    assert expected in found, found
    assert found[expected].hint
    with pytest.raises(SystemCheckError):
        call_command("check")


def test_settings_not_a_dict(settings):
    settings.RESOURCESYNC = ["BASE_URL"]
    assert "resourcesync.E001" in ids()


def test_urls_not_included(settings):
    settings.ROOT_URLCONF = "example_project.repository.urls"
    assert "resourcesync.E010" in ids()


@pytest.mark.django_db
def test_set_with_unregistered_source_or_bad_filter():
    ResourceSet.objects.create(name="Ghost", slug="ghost", source="nosuchsource", capabilities=["resourcelist"])
    ResourceSet.objects.create(
        name="Bad", slug="bad", source="metadata", lookups={"nosuchfield": 1}, capabilities=["resourcelist"]
    )
    found = ids(databases=["default"])
    assert "resourcesync.W003" in found and "nosuchsource" in found["resourcesync.W003"].msg
    assert "resourcesync.W004" in found and found["resourcesync.W004"].hint
    call_command("migrate", verbosity=0)  # warnings: they do not stop migrate


@pytest.mark.django_db
def test_unregistered_source_is_not_a_500():
    ResourceSet.objects.create(name="Ghost", slug="ghost", source="nosuchsource", capabilities=["resourcelist"])
    client = Client(raise_request_exception=False)
    assert client.get("/resourcesync/ghost/capabilitylist.xml").status_code == 404
    assert client.get("/.well-known/resourcesync").status_code == 200


@pytest.mark.django_db
def test_rebuild_command_reports_a_broken_set_and_goes_on(bitstreams, metadata, pages, capsys):
    from django.core.management.base import CommandError

    demo_set("all-records")  # as migrated (an earlier test's flush may have taken it)
    ResourceSet.objects.create(name="Ghost", slug="ghost", source="nosuchsource", capabilities=["resourcelist"])
    with pytest.raises(CommandError, match="1 set"):
        call_command("resourcesync_rebuild", verbosity=0)
    captured = capsys.readouterr()
    assert "not registered" in captured.err
    # The example's four sets (the partners' set among them) and the ghost.
    assert "Built 4 capability document(s) for 5 set(s)" in captured.out and "failed: ghost" in captured.out


def test_admin_form_rejects_a_filter_the_source_cannot_apply(db):
    from django_resourcesync.admin import ResourceSetForm

    form = ResourceSetForm(
        data={
            "name": "X", "slug": "x", "source": "metadata", "lookups": '{"nosuchfield": 1}',
            "capabilities": ["resourcelist"], "position": 0
        }
    )
    assert not form.is_valid()
    assert "lookups" in form.errors
    form = ResourceSetForm(
        data={
            "name": "X", "slug": "x", "source": "metadata", "lookups": '{"collection__slug": "theses"}',
            "capabilities": ["resourcelist"], "position": 0
        }
    )
    assert form.is_valid(), form.errors


def test_related_models_lookup_that_leads_nowhere(monkeypatch):
    from django_resourcesync.sources import registry
    from example_project.repository.models import Item

    monkeypatch.setattr(type(registry.get("bitstreams")), "related_models", {Item: "itme"})
    found = ids()
    assert "resourcesync.E017" in found and "itme" in found["resourcesync.E017"].msg
    assert "item__collection" in found["resourcesync.E017"].hint


@pytest.mark.parametrize("fields", [("title", "colection__name"), "title", ("title", "files__name")])
def test_fingerprint_fields_that_cannot_be_read(monkeypatch, fields):
    from django_resourcesync.sources import registry

    monkeypatch.setattr(type(registry.get("metadata")), "fingerprint_fields", fields)
    found = ids()
    assert "resourcesync.E020" in found and "'metadata'" in found["resourcesync.E020"].msg
    assert "values_list()" in found["resourcesync.E020"].hint


def test_fingerprint_written_in_vain_beside_fingerprint_fields(monkeypatch):
    from django_resourcesync.sources import registry

    assert "resourcesync.W005" not in ids(), "the example's sources use the fields alone"
    monkeypatch.setattr(type(registry.get("bitstreams")), "fingerprint", lambda self, obj: obj.name, raising=False)
    assert "resourcesync.W005" in ids()
