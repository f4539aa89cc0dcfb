"""The change history to the letter (spec sections 12 and 13): every kind of source reports its
updates, and only a source that gives bytes offers dumps."""

import pytest
from django.core import checks

from django_resourcesync import sources
from django_resourcesync.admin import ResourceSetForm
from django_resourcesync.models import Build, ResourceSet
from django_resourcesync.rebuild import rebuild_set
from django_resourcesync.sources import registry
from example_project.repository.models import Item

from .helpers import fetch
from .xmlcheck import SM, check_document, entries, md

pytestmark = pytest.mark.django_db

ALL = ["resourcelist", "changelist", "resourcedump", "changedump"]


class LandingLastmod(sources.ResourceSource):
    """Item landing pages described by their ``lastmod`` alone: no file, no content."""

    name = "lastmod-only"

    def items(self):
        return Item.objects.filter(is_public=True)

    def lastmod(self, obj):
        return obj.modified


def changes(resource_set):
    """[(change, loc, md)] of the set's open Change List, checked against schema and spec rules."""
    status, body, _ = fetch(f"/resourcesync/{resource_set.slug}/changelist.xml")
    assert status == 200
    return [(md(e)["change"], e.find(f"{{{SM}}}loc").text, md(e)) for e in entries(check_document(body, "changelist"))]


@pytest.fixture
def lastmod_only(seed, committing, documents_storage):
    registry.register(LandingLastmod)
    try:
        resource_set = ResourceSet.objects.create(
            name="Landing pages, lastmod only", slug="lastmod-only", source="lastmod-only",
            capabilities=["resourcelist", "changelist"],
        )
        with committing():
            seed(3)
        rebuild_set(resource_set)
        yield resource_set
    finally:
        registry.unregister("lastmod-only")


@pytest.fixture
def committing(django_capture_on_commit_callbacks):
    return lambda: django_capture_on_commit_callbacks(execute=True)


def test_a_source_without_bytes_reports_an_update_when_its_lastmod_moves(lastmod_only, committing):
    item = Item.objects.order_by("pk").first()
    assert changes(lastmod_only) == []
    with committing():
        item.title = "Retitled"
        item.save()
    [(change, loc, meta)] = changes(lastmod_only)
    assert (change, loc) == ("updated", f"http://testserver{item.get_absolute_url()}")
    assert "hash" not in meta and "length" not in meta
    with committing():
        item.save()  # saved again: a new lastmod, a new change
    assert [change for change, _loc, _meta in changes(lastmod_only)] == ["updated", "updated"]


def test_a_source_with_bytes_reports_no_update_when_only_its_lastmod_moves(seed, metadata, committing, documents_storage):
    metadata.capabilities = ["resourcelist", "changelist"]
    metadata.save()
    with committing():
        seed(2)
    rebuild_set(metadata)
    item = Item.objects.order_by("pk").first()
    with committing():
        item.save()  # lastmod moves, the record's bytes are the same
    assert changes(metadata) == []


def test_a_source_without_bytes_cannot_offer_dumps(lastmod_only, seed):
    assert not registry.get("lastmod-only").gives_bytes
    assert registry.get("bitstreams").gives_bytes and registry.get("metadata").gives_bytes
    values = {"name": "S", "slug": "s", "source": "lastmod-only", "lookups": "{}", "position": 0}
    form = ResourceSetForm(data={**values, "capabilities": ALL})
    assert not form.is_valid()
    error = str(form.errors["capabilities"])
    assert "gives no bytes" in error and "Resource Dump, Change Dump" in error
    assert ResourceSetForm(data={**values, "capabilities": ["resourcelist", "changelist"]}).is_valid()
    # A set configured so before (or behind the form's back): a warning, and no empty dump.
    ResourceSet.objects.filter(pk=lastmod_only.pk).update(capabilities=ALL)
    lastmod_only.refresh_from_db()
    (warning,) = [e for e in checks.run_checks(databases=["default"]) if e.id == "resourcesync.W008"]
    assert "lastmod-only" in warning.msg and "resourcedump, changedump" in warning.msg
    built = rebuild_set(lastmod_only)
    assert {build.capability for build in built} == {"resourcelist"}
    assert not Build.objects.filter(resource_set=lastmod_only, capability__in=["resourcedump", "changedump"]).exists()


def test_lists_and_packages_closed_in_the_middle_of_a_batch_have_strict_boundaries(
    seed, metadata, committing, documents_storage, settings
):
    """A Destination that goes on from a closed list (or package) with what comes after its
    ``until`` misses nothing: no event of the next one is at that instant."""
    from django_resourcesync import tracking
    from django_resourcesync.builders import changedump
    from django_resourcesync.models import ChangeDumpPackage, ChangeEvent, ChangeList

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 3}
    metadata.capabilities = ["resourcelist", "changelist", "changedump"]
    metadata.save()
    with committing():
        seed(5)
    rebuild_set(metadata)
    first = Item.objects.filter(pk=Item.objects.order_by("pk").first().pk)
    with committing():
        first.update(title="First")
        tracking.changed(first)
    assert changedump.package_changes(metadata).entries == 1  # packages no longer line up with lists
    with committing():
        Item.objects.update(title="One batch")  # no signals: the bulk API records them at once
        assert tracking.changed(Item.objects.all()) > 0
    lists = list(ChangeList.objects.filter(resource_set=metadata).order_by("number"))
    assert len(lists) >= 2
    for closed, following in zip(lists, lists[1:]):
        assert following.from_time == closed.until
        assert all(event.datetime <= closed.until for event in closed.changes.all())
        assert all(event.datetime > closed.until for event in following.changes.all()), "an event at until in the next list"
    while changedump.package_changes(metadata) is not None:
        pass
    packages = list(ChangeDumpPackage.objects.filter(resource_set=metadata).order_by("number"))
    assert sum(package.entries for package in packages) == ChangeEvent.objects.filter(resource_set=metadata).count() == 6
    for package, following in zip(packages, packages[1:]):
        assert following.from_time == package.until
        events = ChangeEvent.objects.filter(resource_set=metadata)
        assert all(e.datetime <= package.until for e in events.filter(id__gte=package.first_event, id__lte=package.last_event))
        assert all(e.datetime > package.until for e in events.filter(id__gte=following.first_event, id__lte=following.last_event))
    status, body, _ = fetch("/resourcesync/metadata/changelist.xml")
    check_document(body, "changelist")


def test_every_document_stays_within_max_document_bytes(seed, bitstreams, committing, documents_storage, settings):
    """Change Lists and the manifests of both dumps are split (or packages cut) before they
    pass the byte limit, as Resource Lists are."""
    from django_resourcesync import tracking
    from django_resourcesync.builders import changedump
    from django_resourcesync.models import ChangeList, Document
    from example_project.repository.models import ItemFile

    from .test_dumps import unpack

    limit = 10_000  # the smallest limit the settings check accepts; a file's entry is about 600 bytes
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_DOCUMENT_BYTES": limit}
    bitstreams.capabilities = ALL
    bitstreams.save()
    with committing():
        seed(15)
    rebuild_set(bitstreams)
    files = ItemFile.objects.all()
    with committing():
        files.update(media_type="application/x-renamed")  # no signals: one batch of updates
        assert tracking.changed(files) >= 20
    lists = ChangeList.objects.filter(resource_set=bitstreams).order_by("number")
    assert lists.count() >= 2, "the updates do not fit one list of 10,000 bytes"
    for changelist in lists:
        status, body, _ = fetch(f"/resourcesync/bitstreams/changelist/{changelist.number}.xml")
        assert status == 200 and len(body) <= limit, (changelist, len(body))
        check_document(body, "changelist")
    while changedump.package_changes(bitstreams) is not None:
        pass
    for capability in ("resourcedump", "changedump"):
        packages = unpack(bitstreams, capability)
        assert len(packages) >= 2, capability
    manifests = Document.objects.filter(resource_set=bitstreams, name__endswith="manifest.xml")
    assert manifests.exists() and all(document.size <= limit for document in manifests)
    package_manifests = bitstreams.changedump_packages.values_list("manifest_size", flat=True)
    assert len(package_manifests) >= 2 and max(package_manifests) <= limit


def test_a_source_without_bytes_gets_no_change_dump_package_and_lists_no_dump(lastmod_only, committing):
    from django_resourcesync.builders import capabilitylist, changedump
    from django_resourcesync.tasks import package_changes_task

    ResourceSet.objects.filter(pk=lastmod_only.pk).update(capabilities=ALL)
    lastmod_only.refresh_from_db()
    item = Item.objects.order_by("pk").first()
    with committing():
        item.title = "Changed"
        item.save()
    assert changedump.package_changes(lastmod_only) is None
    package_changes_task.delay(lastmod_only.pk)
    assert not lastmod_only.changedump_packages.exists()
    listed = [name for name, _changed in capabilitylist.published_capabilities(lastmod_only)]
    assert listed == ["resourcelist", "changelist"]


def test_a_change_after_a_list_closed_by_its_period_is_after_its_until_whatever_the_clock(
    seed, metadata, committing, documents_storage, monkeypatch
):
    import datetime

    from django.utils import timezone

    from django_resourcesync.models import ChangeList
    from django_resourcesync.tracking.changelog import close_due, period_end

    metadata.capabilities = ["resourcelist", "changelist"]
    metadata.save()
    with committing():
        seed(2)
    rebuild_set(metadata)
    first, second = Item.objects.order_by("pk")[:2]
    with committing():
        first.title = "Before the boundary"
        first.save()
    boundary = period_end(ChangeList.objects.get(resource_set=metadata, until__isnull=True).last_datetime)
    close_due(metadata, now=boundary + datetime.timedelta(hours=1))
    closed = ChangeList.objects.get(resource_set=metadata, until__isnull=False)
    assert closed.until == boundary
    monkeypatch.setattr(timezone, "now", lambda: boundary - datetime.timedelta(milliseconds=5))  # a clock behind
    with committing():
        second.title = "After the boundary, by a slow clock"
        second.save()
    (event,) = ChangeList.objects.get(resource_set=metadata, until__isnull=True).changes.all()
    assert event.datetime > closed.until
