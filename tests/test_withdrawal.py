"""A resource that leaves a set leaves every list and dump of it in the same processing round,
and the Resource Dump still covers the Resource List (specification section 9)."""

import hashlib
import io
import zipfile

import pytest
from django.core.files.base import ContentFile

from django_resourcesync.models import Build
from django_resourcesync.rebuild import rebuild_set
from example_project.repository.models import Item

from .helpers import fetch, path_of
from .test_s3 import s3_documents, s3_endpoint  # noqa: F401  (fixtures)
from .xmlcheck import SM, check_document, entries, md

pytestmark = pytest.mark.django_db

CAPABILITIES = ["resourcelist", "changelist", "resourcedump", "changedump", "resourcelist-archive", "resourcedump-archive"]


@pytest.fixture(params=["files", "s3"])
def storage(request):
    """The documents on the filesystem, or in S3."""
    if request.param == "s3":
        request.getfixturevalue("s3_documents")
    return request.param


@pytest.fixture
def published(storage, seed, bitstreams, committing, settings):
    # Documents name a stylesheet, as the example project's do.
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "STYLESHEET": True}
    bitstreams.capabilities = CAPABILITIES
    bitstreams.save()
    with committing():
        seed(8)
    rebuild_set(bitstreams)
    return bitstreams


def _document(path, capability):
    status, body, _ = fetch(path)
    assert status == 200, f"{path} answers {status}"
    return check_document(body, capability)


def _locs(root):
    return [entry.find(f"{{{SM}}}loc").text for entry in entries(root)]


def resource_list(resource_set, path=None):
    """``{loc: (sha256, length)}`` of the set's Resource List (its parts too, for an index)."""
    root = _document(path or f"/resourcesync/{resource_set.slug}/resourcelist.xml", "resourcelist")
    if root.tag == f"{{{SM}}}sitemapindex":
        found = {}
        for part in _locs(root):
            found.update(resource_list(resource_set, path_of(part)))
        return found
    return {_loc(e): (md(e)["hash"].split("sha-256:")[1], int(md(e)["length"])) for e in entries(root)}


def _loc(entry):
    return entry.find(f"{{{SM}}}loc").text


def dump(resource_set, path=None):
    """``{loc: bytes}`` of every bitstream in the set's Resource Dump (an index's parts too),
    each package checked against the dump's hash and length and its manifest's copy."""
    root = _document(path or f"/resourcesync/{resource_set.slug}/resourcedump.xml", "resourcedump")
    found = {}
    if root.tag == f"{{{SM}}}sitemapindex":
        for part in _locs(root):
            found.update(dump(resource_set, path_of(part)))
        return found
    for entry in entries(root):
        status, package, _ = fetch(path_of(_loc(entry)))
        assert status == 200, f"{_loc(entry)} is listed but answers {status}"
        assert f"sha-256:{hashlib.sha256(package).hexdigest()}" == md(entry)["hash"]
        assert len(package) == int(md(entry)["length"])
        archive = zipfile.ZipFile(io.BytesIO(package))
        (contents,) = [link.get("href") for link in entry.findall("{http://www.openarchives.org/rs/terms/}ln")]
        assert fetch(path_of(contents))[1] == archive.read("manifest.xml"), "the published manifest is the packed one"
        manifest = check_document(archive.read("manifest.xml"), "resourcedump-manifest")
        for item in entries(manifest):
            found[_loc(item)] = archive.read(md(item)["path"][1:])
    return found


def assert_the_dump_covers_the_list(resource_set):
    listed, packed = resource_list(resource_set), dump(resource_set)
    assert listed, "the set lists resources"
    assert set(packed) == set(listed)
    for loc, (sha256, length) in listed.items():
        assert (hashlib.sha256(packed[loc]).hexdigest(), len(packed[loc])) == (sha256, length), loc
    current = Build.objects.filter(resource_set=resource_set, status=Build.Status.PUBLISHED)
    assert {build.capability: build.entries for build in current if build.capability in ("resourcelist", "resourcedump")} == {
        "resourcelist": len(listed), "resourcedump": len(packed)
    }, "what the admin and the audit read of the builds is what they hold"


def file_uris(item):
    return {"http://testserver" + f.get_absolute_url() for f in item.files.all()}


@pytest.mark.parametrize("limit", [None, 3], ids=["one-package", "packages-and-index"])
def test_an_item_made_private_leaves_the_list_and_the_dump_which_still_covers_the_list(published, committing, settings, limit):
    if limit:
        settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": limit}
        rebuild_set(published)
    assert_the_dump_covers_the_list(published)
    before = fetch(f"/resourcesync/{published.slug}/resourcedump.xml")[1]
    packages_before = [path_of(loc) for loc in _locs(check_document(before, "resourcedump"))] if not limit else []
    hidden = Item.objects.order_by("pk")[2]
    hidden_uris = file_uris(hidden)
    at_before = md(_document(f"/resourcesync/{published.slug}/resourcelist.xml", "resourcelist"))["at"]
    with committing():
        hidden.is_public = False
        hidden.save()

    listed = resource_list(published)
    assert not hidden_uris & set(listed), "a private item's URI leaves the Resource List with its deletion"
    assert md(_document(f"/resourcesync/{published.slug}/resourcelist.xml", "resourcelist"))["at"] == at_before
    for loc in listed:
        assert fetch(path_of(loc))[0] == 200, f"{loc} is listed"
    assert_the_dump_covers_the_list(published)
    for path in packages_before:
        assert fetch(path)[0] == 410, "the package that held its bytes is gone"


def test_the_archives_keep_no_list_or_dump_of_what_left_the_set(published, committing):
    with committing():
        Item.objects.order_by("pk")[0].files.first().file.save("v2.txt", ContentFile(b"a second build"), save=True)
    rebuild_set(published)  # a second build of each: the first is kept for the archives
    hidden = Item.objects.order_by("pk")[4]
    hidden_uris = file_uris(hidden)

    def archived(capability):
        root = _document(f"/resourcesync/{published.slug}/{capability}-archive.xml", f"{capability}-archive")
        return [path_of(loc) for loc in _locs(root)]

    assert len(archived("resourcelist")) == len(archived("resourcedump")) == 2
    with committing():
        hidden.delete()
    for path in archived("resourcelist"):
        assert not hidden_uris & set(resource_list(published, path)), path
    dumps = archived("resourcedump")
    assert len(dumps) == 1, "the retired dump that held its bytes left the archive; the current one was packed again"
    for path in dumps:
        assert not hidden_uris & set(dump(published, path))


def test_a_resource_list_being_built_leaves_out_what_left_the_set_meanwhile(published, committing, monkeypatch):
    from django_resourcesync import tracking
    from django_resourcesync.builders import resourcelist

    hidden = Item.objects.order_by("pk")[3]
    hidden_uris = file_uris(hidden)
    real = resourcelist._render_single

    def render_then_change(context, *args):
        rendered = real(context, *args)
        with committing():  # made private after its entry was written, before publication
            Item.objects.filter(pk=hidden.pk).update(is_public=False)
            tracking.changed(model=Item, pks=[hidden.pk])
        return rendered

    monkeypatch.setattr(resourcelist, "_render_single", render_then_change)
    rebuild_set(published, only=["resourcelist"])
    listed = resource_list(published)
    assert listed and not hidden_uris & set(listed)
    build = Build.objects.filter(resource_set=published, capability="resourcelist", status=Build.Status.PUBLISHED).get()
    assert build.entries == len(listed)


@pytest.fixture
def live_source(live_server, settings, transactional_db):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BASE_URL": live_server.url}
    return live_server.url


def test_a_destination_starting_a_baseline_after_a_withdrawal_ends_in_sync(live_source, seed, bitstreams, tmp_path,
                                                                           monkeypatch, caplog):
    """The reference client, over real HTTP, a moment after an item was made private: every
    resource the Resource List gives is fetched (none answers 404), and its audit is IN SYNC."""
    import logging

    from django.db import transaction
    from resync.client import Client

    from django_resourcesync.models import Resource

    monkeypatch.chdir(tmp_path)  # the client keeps its state file in the working directory
    bitstreams.capabilities = ["resourcelist", "changelist", "resourcedump"]
    bitstreams.save()
    seed(6)
    rebuild_set(bitstreams)
    hidden = Item.objects.order_by("pk")[1]
    with transaction.atomic():
        hidden.is_public = False
        hidden.save()
    client = Client(hashes=["md5", "sha-256"])
    client.set_mappings([f"{live_source}/", str(tmp_path / "mirror")])
    client.sitemap_name = f"{live_source}/resourcesync/bitstreams/resourcelist.xml"
    listed = Resource.objects.filter(resource_set=bitstreams).count()

    def status(**options):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="resync.client"):
            client.baseline_or_audit(**options)
        return [r.getMessage().split()[1:] for r in caplog.records if r.getMessage().startswith("Status:")][-1]

    assert status() == ["SYNCED", "(same=0,", f"created={listed},", "updated=0,", "deleted=0)"]
    assert status(audit_only=True)[:2] == ["IN", "SYNC"]
    mirrored = {path.name for path in (tmp_path / "mirror").rglob("*") if path.is_file()}
    assert mirrored and not {f.file.name.rsplit("/", 1)[-1] for f in hidden.files.all()} & mirrored


def test_a_file_renamed_leaves_its_old_uri_out_of_the_list_and_the_dump(published, committing):
    """A resource that moves is, to a Destination, one deleted and one created: its old URI
    would answer 404, so the lists and the dump stop giving it with the change."""
    renamed = Item.objects.order_by("pk")[1].files.first()
    old_uri = "http://testserver" + renamed.get_absolute_url()
    assert old_uri in resource_list(published)
    with committing():
        renamed.name = "renamed.txt"
        renamed.save()
    new_uri = "http://testserver" + renamed.get_absolute_url()
    assert new_uri != old_uri
    listed = resource_list(published)
    assert old_uri not in listed and new_uri not in listed, "the list at its at, less what left since"
    assert_the_dump_covers_the_list(published)


def test_a_change_dump_package_cut_while_a_resource_leaves_is_withdrawn_and_packed_again(published, committing,
                                                                                      monkeypatch):
    from django_resourcesync import tracking
    from django_resourcesync.builders import changedump
    from django_resourcesync.models import ChangeDumpPackage

    item = Item.objects.order_by("pk")[5]
    with committing():
        item.files.first().file.save("v2.txt", ContentFile(b"changed, then made private"), save=True)
    real = changedump.Packer.finish

    def finish_then_leave(self, *args, **kwargs):
        real(self, *args, **kwargs)
        with committing():  # made private while its bytes were being packed
            Item.objects.filter(pk=item.pk).update(is_public=False)
            tracking.changed(model=Item, pks=[item.pk])

    monkeypatch.setattr(changedump.Packer, "finish", finish_then_leave)
    package = changedump.package_changes(published)
    monkeypatch.undo()
    package.refresh_from_db()
    assert package.withdrawn is not None
    changedump.package_changes(published)
    assert not ChangeDumpPackage.objects.filter(resource_set=published, withdrawn__isnull=False).exists()
