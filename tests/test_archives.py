"""Archives of snapshots: the Resource List Archive and the Resource Dump Archive list every
build the set keeps, oldest first; each archived document is served as it was published; what
leaves the archive leaves storage."""

import pytest

from django_resourcesync.models import Build, Document
from django_resourcesync.rebuild import rebuild_set
from example_project.repository.models import Item

from .conftest import demo_set, publish_versions
from .helpers import fetch, path_of
from .xmlcheck import SM, check_document, entries, md


def w3c(moment):
    from django_resourcesync.xml.writer import w3c_datetime

    return w3c_datetime(moment)


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


def age_the_log(resource_set, days, closing=True):
    """Close the open list now (if ``closing``), then run the hourly task as if ``days`` had passed."""
    from datetime import timedelta

    from django.utils import timezone

    from django_resourcesync import tracking
    from django_resourcesync.tracking.changelog import close, close_due

    with tracking.locked(resource_set):
        open_list = resource_set.changelists.filter(until__isnull=True).first()
        if closing and open_list is not None and open_list.entries:
            close(open_list, timezone.now())
        close_due(resource_set, now=timezone.now() + timedelta(days=days))


def metadata_with_changelist_archive(seed, committing, settings):
    """The metadata set with a Change List Archive, Change Lists kept 30 days, two items, built."""
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "CHANGELIST_RETENTION": 30 * 86400}
    resource_set = demo_set("metadata")
    resource_set.capabilities = ["resourcelist", "changelist", "changelist-archive"]
    resource_set.save()
    with committing():
        seed(2)
    rebuild_set(resource_set)
    return resource_set


def test_the_change_list_archive_keeps_lists_that_left_the_index_and_serves_them_as_they_were(
    seed, committing, documents_storage, settings
):
    resource_set = metadata_with_changelist_archive(seed, committing, settings)
    retitle(Item.objects.order_by("pk").first(), "A change of the first list", committing)
    with committing():
        age_the_log(resource_set, days=0)
    first = resource_set.changelists.get(number=1)
    before = fetch(f"/resourcesync/{resource_set.slug}/changelist/1.xml")[1]
    check_document(before, "changelist")
    retitle(Item.objects.order_by("pk").last(), "A change of the second list", committing)
    with committing():
        # A month on, both lists are past retention (the second closed at its period's end):
        # the log goes on in a third, open and empty.
        age_the_log(resource_set, days=31, closing=False)
    first.refresh_from_db()
    assert first.archived is not None and first.changes.exists()  # its events stay while it is archived
    # It left the Change List Index, it is in the archive, and it is served as it was.
    status, body, _ = fetch(f"/resourcesync/{resource_set.slug}/changelist.xml")
    assert status == 200
    live = check_document(body, "changelist")  # the open list alone: no index
    third = resource_set.changelists.get(until__isnull=True)
    assert live.tag == f"{{{SM}}}urlset" and md(live)["from"] == w3c(third.from_time)
    assert resource_set.changelists.filter(archived__isnull=False).count() == 2
    listed = archive(resource_set, "changelist")
    # The open list, alone in the log, is changelist.xml there and here.
    assert [loc.rsplit("/", 1)[1] for loc, _meta in listed] == ["1.xml", "2.xml", "changelist.xml"]
    assert third.number == 3 and listed[2][1]["from"] == w3c(third.from_time)
    assert listed[0][1]["until"] and listed[0][1]["from"] <= listed[0][1]["until"]
    assert fetch(path_of(listed[0][0]))[1] == before
    # Past the archive's own retention, it goes, with its file.
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "ARCHIVE_RETENTION": {"changelist": {"count": None, "age": 86400}}}
    with committing():
        age_the_log(resource_set, days=400)
    assert not resource_set.changelists.filter(number=1).exists()
    assert not (documents_storage / first.storage_name).exists()
    assert fetch(f"/resourcesync/{resource_set.slug}/changelist/1.xml")[0] == 404


def test_the_change_dump_archive_keeps_packages_past_retention_until_they_hold_what_is_no_longer_public(
    seed, committing, documents_storage, settings
):
    from django_resourcesync.builders import changedump

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "CHANGELIST_RETENTION": 30 * 86400}
    resource_set = demo_set("metadata")
    resource_set.capabilities = ["resourcelist", "changelist", "changedump", "changedump-archive"]
    resource_set.save()
    with committing():
        seed(2)
    rebuild_set(resource_set)
    item = Item.objects.filter(is_public=True).order_by("pk").first()
    retitle(item, "Packed, then archived", committing)
    with committing():
        package = changedump.package_changes(resource_set)
    zipped = fetch(f"/resourcesync/{resource_set.slug}/{changedump.package_name(package.number)}")[1]
    with committing():
        age_the_log(resource_set, days=31)
    package.refresh_from_db()
    assert package.archived is not None and package.keys == [str(item.pk)]
    assert fetch(f"/resourcesync/{resource_set.slug}/changedump.xml")[0] == 404  # no live package left
    [(loc, meta)] = archive(resource_set, "changedump")
    assert meta["from"] and meta["until"]
    # A Change Dump of its own, listing the package.
    [entry] = entries(check_document(fetch(path_of(loc))[1], "changedump"))
    assert fetch(path_of(entry.find(f"{{{SM}}}loc").text))[1] == zipped
    # Its item is made private: the package is withdrawn, from the archive too.
    with committing():
        item.is_public = False
        item.save()
    assert fetch(path_of(loc))[0] == 410
    assert fetch(f"/resourcesync/{resource_set.slug}/changedump-archive.xml")[0] == 404


def test_without_an_archive_the_lists_past_retention_go_as_before(seed, committing, documents_storage, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "CHANGELIST_RETENTION": 30 * 86400}
    resource_set = demo_set("metadata")
    with committing():
        seed(1)
    rebuild_set(resource_set)
    retitle(Item.objects.order_by("pk").first(), "Gone with its list", committing)
    with committing():
        age_the_log(resource_set, days=0)
        age_the_log(resource_set, days=31)
    assert not resource_set.changelists.filter(number=1).exists()


def test_a_version_a_listed_document_links_is_never_collected(seed, committing, documents_storage, settings):
    from django.core.files.base import ContentFile

    from django_resourcesync import sweep
    from django_resourcesync.models import Version
    from example_project.repository.models import ItemFile

    from .xmlcheck import links

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "CHANGELIST_RETENTION": 30 * 86400}
    resource_set = publish_versions(seed, committing, 1, capabilities=[
        "resourcelist", "changelist", "changelist-archive",
    ])
    upload = ItemFile.objects.order_by("pk").first()
    with committing():
        upload.file.save("kept.txt", ContentFile(b"the version an archived list links"))
    with committing():
        age_the_log(resource_set, days=0)
    [entry] = [e for e in entries(check_document(fetch(f"/resourcesync/{resource_set.slug}/changelist/1.xml")[1], "changelist"))
               if md(e)["change"] == "updated"]
    memento = path_of(next(ln["href"] for ln in links(entry) if ln["rel"] == "memento"))
    with committing():
        age_the_log(resource_set, days=31, closing=False)  # the list leaves the index for the archive
        sweep.sweep(grace=0)
    assert resource_set.changelists.get(number=1).archived is not None
    assert fetch(memento)[:2] == (200, b"the version an archived list links")
    # Once the list leaves the archive, nothing links the version: it is collected.
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "ARCHIVE_RETENTION": {"changelist": {"count": None, "age": 86400}}}
    with committing():
        age_the_log(resource_set, days=400, closing=False)
        sweep.sweep(grace=0)
    assert fetch(memento)[0] == 404
    assert not Version.objects.filter(sha256=md(entry)["hash"].split("sha-256:")[1]).exists()


def test_an_archive_past_the_entry_limit_is_an_index_of_parts(seed, committing, documents_storage, settings):
    resource_set = demo_set("metadata")
    resource_set.capabilities = ["resourcelist", "changelist", "resourcelist-archive"]
    resource_set.save()
    with committing():
        seed(1)
    for _ in range(3):
        rebuild_set(resource_set)
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 2}
    status, body, _ = fetch(f"/resourcesync/{resource_set.slug}/resourcelist-archive.xml")
    index = check_document(body, "resourcelist-archive")
    assert status == 200 and index.tag == f"{{{SM}}}sitemapindex"
    parts = [e.find(f"{{{SM}}}loc").text for e in entries(index)]
    assert [loc.rsplit("/", 1)[1] for loc in parts] == ["part-1.xml", "part-2.xml"]
    found = []
    for loc in parts:
        status, body, _ = fetch(path_of(loc))
        part = check_document(body, "resourcelist-archive")
        assert status == 200 and part.find("{http://www.openarchives.org/rs/terms/}ln[@rel='index']") is not None
        found += [md(e)["at"] for e in entries(part)]
    assert len(found) == 3 and found == sorted(found)


def test_an_archived_package_keeps_the_mementos_its_manifest_links(seed, committing, documents_storage, settings):
    import io
    import zipfile

    from django.core.files.base import ContentFile

    from django_resourcesync import sweep
    from django_resourcesync.builders import changedump
    from example_project.repository.models import ItemFile

    from .xmlcheck import links

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "CHANGELIST_RETENTION": 30 * 86400}
    resource_set = publish_versions(seed, committing, 1, capabilities=[
        "resourcelist", "changelist", "changedump", "changedump-archive",  # no Change List Archive
    ])
    upload = ItemFile.objects.order_by("pk").first()
    with committing():
        upload.file.save("packed.txt", ContentFile(b"bytes a manifest links"))
    with committing():
        package = changedump.package_changes(resource_set)
    with committing():
        age_the_log(resource_set, days=31)
        sweep.sweep(grace=0)
    package.refresh_from_db()
    assert package.archived is not None
    zipped = fetch(f"/resourcesync/{resource_set.slug}/{changedump.package_name(package.number)}")[1]
    manifest = check_document(zipfile.ZipFile(io.BytesIO(zipped)).read("manifest.xml"), "changedump-manifest")
    [entry] = [e for e in entries(manifest) if md(e)["change"] == "updated"]
    memento = path_of(next(ln["href"] for ln in links(entry) if ln["rel"] == "memento"))
    assert fetch(memento)[:2] == (200, b"bytes a manifest links")


def test_a_change_list_that_went_to_the_archive_is_served_when_no_list_is_left_in_the_log(seed, committing, settings):
    resource_set = metadata_with_changelist_archive(seed, committing, settings)
    retitle(Item.objects.order_by("pk").first(), "A change", committing)
    with committing():
        age_the_log(resource_set, days=31)
    assert not resource_set.changelists.filter(archived__isnull=True).exists(), "every list went to the archive"
    (loc, _meta), *_ = archive(resource_set, "changelist")
    status, body, _ = fetch(path_of(loc))
    assert status == 200
    check_document(body, "changelist")


def test_a_destination_merging_the_change_list_index_and_its_archive_reads_each_change_once(
    seed, committing, documents_storage, settings
):
    """The paper's Change List Archive gives "access to both the current and previous Change
    Lists": the current one is listed under the URI the Change List capability gives it."""
    resource_set = metadata_with_changelist_archive(seed, committing, settings)
    first, second = Item.objects.order_by("pk")[:2]
    main = f"http://testserver/resourcesync/{resource_set.slug}/changelist.xml"

    def merged():
        doc = check_document(fetch(path_of(main))[1], "changelist")
        indexed = [e.find(f"{{{SM}}}loc").text for e in entries(doc)] if doc.tag == f"{{{SM}}}sitemapindex" else [main]
        listed = [loc for loc, _meta in archive(resource_set, "changelist")]
        seen = []
        for uri in dict.fromkeys(indexed + listed):
            status, body, _ = fetch(path_of(uri))
            assert status == 200, uri
            seen += [(e.find(f"{{{SM}}}loc").text, md(e)["datetime"]) for e in entries(check_document(body, "changelist"))]
        return indexed, listed, seen

    retitle(first, "A change of the only list", committing)
    indexed, listed, seen = merged()
    assert listed == indexed == [main], "one list, the open one: one URI"
    assert len(seen) == len(set(seen)) == resource_set.changes.count()
    # A second list: changelist.xml is an index, and the archive names the lists as it does.
    with committing():
        age_the_log(resource_set, days=0)
    retitle(second, "A change of the second list", committing)
    indexed, listed, seen = merged()
    assert listed == indexed and len(indexed) == 2
    assert len(seen) == len(set(seen)) == resource_set.changes.count()


def test_the_change_dump_archive_lists_change_dumps_whose_every_link_resolves(
    seed, committing, documents_storage, settings
):
    """The paper's Change Dump Archive links to "Change Dumps that cover previous time periods":
    one Change Dump for each package that left changedump.xml, then changedump.xml itself."""
    import io
    import zipfile

    from django_resourcesync.builders import changedump

    from .xmlcheck import link

    resource_set = metadata_with_changelist_archive(seed, committing, settings)
    resource_set.capabilities = [*resource_set.capabilities, "changedump", "changedump-archive"]
    resource_set.save()
    first, second = Item.objects.filter(is_public=True).order_by("pk")[:2]
    retitle(first, "Packed, then archived", committing)
    with committing():
        changedump.package_changes(resource_set)
        age_the_log(resource_set, days=31)
    retitle(second, "Packed, still in the Change Dump", committing)
    with committing():
        changedump.package_changes(resource_set)
    base = f"http://testserver/resourcesync/{resource_set.slug}/"
    listed = archive(resource_set, "changedump")
    assert [loc for loc, _meta in listed] == [base + "changedump-archive/1.xml", base + "changedump.xml"]
    packages = []
    for uri, meta in listed:
        status, body, _ = fetch(path_of(uri))
        assert status == 200, uri
        dump = check_document(body, "changedump")
        assert {k: md(dump).get(k) for k in ("from", "until")} == {k: meta.get(k) for k in ("from", "until")}
        assert fetch(path_of(link(dump, "up")))[0] == 200
        for entry in entries(dump):
            package = entry.find(f"{{{SM}}}loc").text
            status, zipped, _ = fetch(path_of(package))
            assert status == 200, package
            status, manifest, _ = fetch(path_of(link(entry, "contents")))
            assert status == 200
            check_document(manifest, "changedump-manifest")
            check_document(zipfile.ZipFile(io.BytesIO(zipped)).read("manifest.xml"), "changedump-manifest")
            packages.append(package)
    # Merged with changedump.xml, every package is read once.
    assert packages == [base + "changedump/1.zip", base + "changedump/2.zip"]
    assert fetch(f"/resourcesync/{resource_set.slug}/changedump-archive/2.xml")[0] == 404, "2 is in changedump.xml"
    # Past the entry limit, an index of parts listing the same Change Dumps.
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 1}
    status, body, _ = fetch(f"/resourcesync/{resource_set.slug}/changedump-archive.xml")
    index = check_document(body, "changedump-archive")
    assert status == 200 and index.tag == f"{{{SM}}}sitemapindex"
    parts = [check_document(fetch(path_of(e.find(f"{{{SM}}}loc").text))[1], "changedump-archive") for e in entries(index)]
    assert [e.find(f"{{{SM}}}loc").text for part in parts for e in entries(part)] == [loc for loc, _meta in listed]
    # The admin's account of it.
    from django_resourcesync.builders.archive import changedump as changedump_archive

    assert changedump_archive.describe(resource_set).startswith("2 documents in the archive")


@pytest.mark.parametrize("name", [
    "resourcelist-archive/99999999999999999999999.xml", "resourcelist-archive/9223372036854775808.xml",
    "changedump-archive/99999999999999999999999.xml", "resourcelist-archive/part-" + "9" * 5000 + ".xml",
])
def test_an_archived_document_number_past_any_id_is_a_404(seed, committing, settings, name):
    from django.test import Client

    resource_set = demo_set("metadata")
    resource_set.capabilities = ["resourcelist", "changelist", "changedump", "resourcelist-archive", "changedump-archive"]
    resource_set.save()
    with committing():
        seed(1)
    rebuild_set(resource_set)
    rebuild_set(resource_set)
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 1}  # an archive in parts
    assert Client(raise_request_exception=False).get(f"/resourcesync/{resource_set.slug}/{name}").status_code == 404
