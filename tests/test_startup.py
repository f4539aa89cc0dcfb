"""A mistake in a source never stops the site: start-up runs none of a source's queries, and a
source that cannot say what it publishes is a system check error naming it; its sets alone are
left unpublished."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import CommandError

from django_resourcesync import sources
from django_resourcesync.models import Build, ResourceSet
from django_resourcesync.sources import registry
from django_resourcesync.tracking import receivers
from example_project.repository.models import Item

ROOT = Path(__file__).resolve().parents[1]


def manage(*args):
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.broken.settings", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
def test_commands_start_with_broken_sources_and_check_names_them():
    found = manage("check")
    assert found.returncode == 1, found.stdout + found.stderr
    report = found.stdout + found.stderr
    assert "Traceback" not in report
    assert "resourcesync.E029" in report
    assert "'misspelled'" in report and "FieldError" in report and "is_publik" in report
    assert "'eager'" in report and "ran a query" in report
    # ``model`` is given: items() is not called to learn it, so its failure stops nothing.
    assert "'with-model'" not in report
    helped = manage("help", "resourcesync_rebuild")
    assert helped.returncode == 0 and "Traceback" not in helped.stderr


@pytest.fixture
def misspelled():
    @sources.register
    class Misspelled(sources.ResourceSource):
        name = "misspelled"

        def items(self):
            return Item.objects.filter(is_publik=True)

    receivers.connect_tracked_models()
    yield registry.get("misspelled")
    registry.unregister("misspelled")


def test_a_source_whose_items_fail_is_an_error_naming_it(misspelled):
    errors = [m for m in checks.run_checks() if m.id == "resourcesync.E029"]
    assert len(errors) == 1 and "'misspelled'" in errors[0].msg and "is_publik" in errors[0].msg
    assert errors[0].hint
    # The other sources are still tracked.
    assert registry.sources_tracking(Item) and misspelled not in registry.sources_tracking(Item)


def test_a_source_with_a_model_is_not_asked_for_its_items():
    class WithModel(sources.ResourceSource):
        model = Item

        def items(self):
            raise ConnectionError("the search backend is down")

    assert WithModel().item_model is Item


@pytest.mark.django_db
def test_only_the_sets_of_a_broken_source_are_left_unpublished(misspelled, metadata, capsys):
    broken = ResourceSet.objects.create(name="Broken", slug="broken", source="misspelled", capabilities=["resourcelist"])
    with pytest.raises(CommandError, match="1 set"):
        call_command("resourcesync_rebuild", set=["broken", "metadata"], verbosity=0)
    assert "is_publik" in capsys.readouterr().err
    assert Build.objects.filter(resource_set=metadata, status=Build.Status.PUBLISHED).exists()
    assert not Build.objects.filter(resource_set=broken, status=Build.Status.PUBLISHED).exists()
