"""Archives of snapshots: the Resource List Archive and the Resource Dump Archive list every
build the set keeps, oldest first; each archived document is served as it was published; what
leaves the archive leaves storage."""

import pytest

from django_resourcesync.models import Build, Document
from django_resourcesync.rebuild import rebuild_set
from example_project.repository.models import Item

from .conftest import demo_set
from .helpers import fetch, path_of
from .xmlcheck import SM, check_document, entries, md


@pytest.fixture
def committing(django_capture_on_commit_callbacks):
    return lambda: django_capture_on_commit_callbacks(execute=True)


def archive(resource_set, capability):
    status, body, _ = fetch(f"/resourcesync/{resource_set.slug}/{capability}-archive.xml")
    assert status == 200
    doc = check_document(body, f"{capability}-archive")
    return [(e.find(f"{{{SM}}}loc").text, md(e)) for e in entries(doc)]


def retitle(item, title, committing):
    with committing():
        item.title = title
        item.save()


def test_the_resource_list_archive_lists_every_kept_list_and_serves_the_older_one_intact(seed, committing, documents_storage):
    resource_set = demo_set("metadata")
    resource_set.capabilities = ["resourcelist", "changelist", "resourcelist-archive"]
    resource_set.save()
    with committing():
        seed(3)
    rebuild_set(resource_set)
    first = fetch(f"/resourcesync/{resource_set.slug}/resourcelist.xml")[1]
    retitle(Item.objects.order_by("pk").first(), "Changed between the two lists", committing)
    rebuild_set(resource_set)
    second = fetch(f"/resourcesync/{resource_set.slug}/resourcelist.xml")[1]
    assert first != second

    listed = archive(resource_set, "resourcelist")
    builds = list(Build.objects.filter(resource_set=resource_set, capability="resourcelist").order_by("pk"))
    assert len(listed) == 2 == len(builds)
    assert [meta["at"] for _loc, meta in listed] == sorted(meta["at"] for _loc, meta in listed)  # oldest first
    assert [fetch(path_of(loc))[1] for loc, _meta in listed] == [first, second]  # byte for byte
    check_document(first, "resourcelist")
    # The Capability List advertises it.
    status, body, _ = fetch(f"/resourcesync/{resource_set.slug}/capabilitylist.xml")
    kinds = [md(e)["capability"] for e in entries(check_document(body, "capabilitylist"))]
    assert "resourcelist-archive" in kinds


def test_retention_removes_old_archive_entries_and_their_files(seed, committing, documents_storage, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "ARCHIVE_RETENTION": {"resourcelist": {"count": 2, "age": None}}}
    resource_set = demo_set("metadata")
    resource_set.capabilities = ["resourcelist", "changelist", "resourcelist-archive"]
    resource_set.save()
    with committing():
        seed(2)
    item = Item.objects.order_by("pk").first()
    oldest = None
    for number in range(3):
        retitle(item, f"Version {number}", committing)
        with committing():  # the files of what leaves go once that commits
            rebuild_set(resource_set)
        if oldest is None:
            oldest = Build.objects.get(resource_set=resource_set, capability="resourcelist")
            files = list(Document.objects.filter(build=oldest).values_list("storage_name", flat=True))
            assert files and all((documents_storage / name).exists() for name in files)
    listed = archive(resource_set, "resourcelist")
    assert len(listed) == 2
    assert not Build.objects.filter(pk=oldest.pk).exists()
    assert not any((documents_storage / name).exists() for name in files)
    assert fetch(f"/resourcesync/{resource_set.slug}/resourcelist-archive/{oldest.pk}.xml")[0] == 404
    # Without the archive, KEEP_BUILDS (1) rules again at the next publication.
    resource_set.capabilities = ["resourcelist", "changelist"]
    resource_set.save()
    rebuild_set(resource_set)
    assert Build.objects.filter(resource_set=resource_set, capability="resourcelist").count() == 2
    assert fetch(f"/resourcesync/{resource_set.slug}/resourcelist-archive.xml")[0] == 404


def test_the_resource_dump_archive_serves_older_dumps_until_they_hold_what_is_no_longer_public(
    seed, committing, documents_storage
):
    resource_set = demo_set("bitstreams")
    resource_set.capabilities = ["resourcelist", "resourcedump", "resourcedump-archive"]
    resource_set.save()
    with committing():
        seed(2)
    rebuild_set(resource_set)
    first = fetch(f"/resourcesync/{resource_set.slug}/resourcedump.xml")[1]
    rebuild_set(resource_set)
    listed = archive(resource_set, "resourcedump")
    assert len(listed) == 2
    status, body, _ = fetch(path_of(listed[0][0]))
    assert status == 200 and body == first
    for package in entries(check_document(body, "resourcedump")):
        assert fetch(path_of(package.find(f"{{{SM}}}loc").text))[0] == 200
    # An item is made private: every dump that held its bytes goes, from the archive too.
    with committing():
        item = Item.objects.filter(is_public=True, files__isnull=False).order_by("pk").first()
        item.is_public = False
        item.save()
    assert fetch(path_of(listed[0][0]))[0] in (404, 410)
    assert listed[0][0] not in [loc for loc, _meta in archive(resource_set, "resourcedump")]


@pytest.mark.parametrize("rules", [
    [], {"resourcelist": 3}, {"changes": {"count": 1}}, {"resourcelist": {"count": 0}}, {"resourcelist": {"age": "1d"}},
    {"resourcelist": {"count": 2, "keep": True}},
])
def test_a_malformed_archive_retention_is_a_system_check_error_with_a_hint(settings, rules):
    from django_resourcesync.checks import check_settings

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "ARCHIVE_RETENTION": rules}
    [error] = [e for e in check_settings() if e.id == "resourcesync.E025"]
    assert error.hint
