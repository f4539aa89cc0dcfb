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


def publish(resource_set, seed, committing, capabilities=("resourcelist", "changelist"), items=2):
    """Give the set these capabilities, add ``items`` items and publish the set."""
    resource_set.capabilities = list(capabilities)
    resource_set.save()
    with committing():
        seed(items)
    rebuild_set(resource_set)


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
    publish(metadata, seed, committing)
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

    publish(metadata, seed, committing)
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


# -- one event per committed change, each with its own bytes ----------------------------------


def _manifest_changes(package):
    """[(change, loc, md, bitstream bytes or None)] of a Change Dump package, in order."""
    import io
    import zipfile

    from django_resourcesync import storage

    with storage.get_storage().open(package.storage_name, "rb") as handle:
        archive = zipfile.ZipFile(io.BytesIO(handle.read()))
    manifest = check_document(archive.read("manifest.xml"), "changedump-manifest")
    found = []
    for entry in entries(manifest):
        meta = md(entry)
        path = meta.get("path")
        found.append((meta["change"], entry.find(f"{{{SM}}}loc").text, meta, archive.read(path[1:]) if path else None))
    return found


@pytest.fixture
def outage(monkeypatch):
    """The workers are down: committed changes wait in the outbox, nobody processes them."""
    from django_resourcesync.tracking import outbox

    monkeypatch.setattr(outbox, "send", lambda task, sources: None)


def _timed(committing, action):
    """Run ``action`` in a transaction of its own; returns the moments before and after it."""
    from django.utils import timezone

    before = timezone.now()
    with committing():
        action()
    return before, timezone.now()


def test_saves_processed_late_are_one_event_each_at_their_time_with_their_own_bytes(
    seed, bitstreams, metadata, committing, documents_storage, monkeypatch
):
    """A worker outage while the site goes on saving: each committed save is one event, dated
    when it was made, in order; a file written v1, v2, v3 meanwhile is packed three times, each
    bitstream the bytes of its change, with the Change List's hashes."""
    import hashlib

    from django.core.files.base import ContentFile

    from django_resourcesync import tracking
    from django_resourcesync.builders import changedump
    from django_resourcesync.tracking import outbox
    from example_project.repository.models import ItemFile

    for resource_set in (bitstreams, metadata):
        resource_set.capabilities = ALL
        resource_set.save()
    with committing():
        seed(2)
    rebuild_set(bitstreams)
    rebuild_set(metadata)
    item = Item.objects.order_by("pk").first()
    upload = ItemFile.objects.filter(item=item).order_by("pk").first()
    real_send = outbox.send
    monkeypatch.setattr(outbox, "send", lambda task, sources: None)  # the workers are down
    windows, versions = [], [b"version one " * 100, b"version two " * 200, b"version three " * 300]
    for number, content in enumerate(versions, start=1):
        def save(number=number, content=content):
            item.title = f"Title {number}"
            item.save()
            upload.file.save("paper.txt", ContentFile(content))
        windows.append(_timed(committing, save))
    monkeypatch.setattr(outbox, "send", real_send)
    assert changes(metadata) == [] and changes(bitstreams) == [], "nothing is processed during the outage"
    tracking.process_pending()

    record_changes = changes(metadata)
    assert [change for change, _loc, _md in record_changes] == ["updated"] * 3
    file_changes = changes(bitstreams)
    uri = "http://testserver" + upload.get_absolute_url()
    assert [(change, loc) for change, loc, _md in file_changes] == [("updated", uri)] * 3
    for listed in (record_changes, file_changes):
        stamps = [parse_datetime(meta["datetime"]) for _change, _loc, meta in listed]
        assert stamps == sorted(stamps) and len(set(stamps)) == 3, "in the order they were made"
        for stamp, (before, after) in zip(stamps, windows):
            assert before <= stamp <= after, "dated when the change was made, not when it was processed"
    expected = [f"sha-256:{hashlib.sha256(content).hexdigest()}" for content in versions]
    assert [meta["hash"].split()[-1] for _change, _loc, meta in file_changes] == expected
    # The metadata record's overtaken states are gone: no hash rather than a wrong one.
    assert ["hash" in meta for _change, _loc, meta in record_changes] == [False, False, True]

    package = changedump.package_changes(bitstreams)
    packed = _manifest_changes(package)
    assert [(change, loc) for change, loc, _md, _bytes in packed] == [(c, loc) for c, loc, _md in file_changes]
    assert [body for _change, _loc, _md, body in packed] == versions
    assert [meta["hash"] for _c, _l, meta, _b in packed] == [meta["hash"] for _c, _l, meta in file_changes]
    assert [meta["datetime"] for _c, _l, meta, _b in packed] == [meta["datetime"] for _c, _l, meta in file_changes]
    # The record's last state is packed; its overtaken ones, without bytes, cannot be.
    (record_package,) = [changedump.package_changes(metadata)]
    assert [change for change, *_rest in _manifest_changes(record_package)] == ["updated"]


def parse_datetime(value):
    from django.utils.dateparse import parse_datetime as parse

    return parse(value)


def test_saves_in_one_transaction_are_one_change(seed, metadata, committing, documents_storage):
    publish(metadata, seed, committing)
    item = Item.objects.order_by("pk").first()
    with committing():
        for number in range(3):  # nobody ever saw the first two
            item.title = f"Draft {number}"
            item.save()
    [(change, _loc, meta)] = changes(metadata)
    assert change == "updated" and "hash" in meta


def test_a_change_of_a_related_object_is_no_change_of_resources_it_does_not_alter(
    seed, bitstreams, committing, documents_storage, outage
):
    """Items retitled three times during an outage: their files' entries show nothing of the
    title, so the files have no change (their item's saves are not theirs)."""
    from django_resourcesync import tracking

    bitstreams.capabilities = ["resourcelist", "changelist"]
    bitstreams.save()
    with committing():
        seed(2)
    rebuild_set(bitstreams)
    item = Item.objects.order_by("pk").first()
    for number in range(3):
        with committing():
            item.title = f"Title {number}"
            item.save()
    tracking.process_pending()
    assert changes(bitstreams) == []
    with committing():
        item.is_public = False
        item.save()
    tracking.process_pending()
    assert {change for change, _loc, _md in changes(bitstreams)} == {"deleted"}


def test_a_list_does_not_close_while_a_change_made_before_its_until_waits(
    seed, metadata, committing, documents_storage, outage
):
    import datetime

    from django_resourcesync import tracking
    from django_resourcesync.models import ChangeList
    from django_resourcesync.tracking.changelog import close_due, period_end

    publish(metadata, seed, committing)
    first, second = Item.objects.order_by("pk")[:2]
    with committing():
        first.title = "Processed"
        first.save()
    tracking.process_pending()
    with committing():
        second.title = "Waiting for a worker"
        second.save()
    boundary = period_end(ChangeList.objects.get(resource_set=metadata, until__isnull=True).last_datetime)
    later = boundary + datetime.timedelta(hours=1)
    close_due(metadata, now=later)
    assert not ChangeList.objects.filter(resource_set=metadata, until__isnull=False).exists(), "closed with a change missing"
    tracking.process_pending()
    close_due(metadata, now=later)
    closed = ChangeList.objects.get(resource_set=metadata, until__isnull=False)
    assert closed.entries == 2 and closed.until == boundary


def test_a_change_processed_after_a_snapshot_is_dated_after_its_at(seed, metadata, committing, documents_storage, outage):
    """A Resource List's ``at`` says every change before it is shown: a change it could not
    show (still waiting when the snapshot was taken) is dated after it."""
    from django_resourcesync import tracking
    from django_resourcesync.models import ChangeEvent

    publish(metadata, seed, committing)
    item = Item.objects.order_by("pk").first()
    with committing():
        item.title = "Made before the snapshot, processed after it"
        item.save()
    # A snapshot that did not process it (a transaction still open when it was taken, say).
    (build,) = rebuild_set(metadata, refresh=False, only=["resourcelist"])
    tracking.process_pending()
    (event,) = ChangeEvent.objects.filter(resource_set=metadata)
    assert event.datetime > build.at


def test_bytes_are_kept_once_whatever_the_number_of_changes_and_collected_once_unused(
    seed, bitstreams, committing, documents_storage, outage
):
    from django.core.files.base import ContentFile

    from django_resourcesync import sweep, tracking, versions
    from django_resourcesync.models import ChangeEvent, Version
    from example_project.repository.models import ItemFile

    bitstreams.capabilities = ALL
    bitstreams.save()
    with committing():
        seed(3)
    rebuild_set(bitstreams)
    uploads = list(ItemFile.objects.order_by("pk")[:3])
    for upload in uploads:
        with committing():
            upload.file.save("same.txt", ContentFile(b"the same bytes everywhere"))
    tracking.process_pending()
    digests = set(ChangeEvent.objects.filter(resource_set=bitstreams).values_list("sha256", flat=True))
    assert len(digests) == 1 and Version.objects.count() == 1
    (version,) = Version.objects.all()
    kept = documents_storage / version.storage_name
    assert kept.read_bytes() == b"the same bytes everywhere"
    # A copy: the site's file written over in place (behind the app's back) leaves it alone.
    with open(uploads[0].file.path, "wb") as handle:
        handle.write(b"written over in place")
    assert kept.read_bytes() == b"the same bytes everywhere"
    assert sweep.sweep(grace=0).deleted == 0, "the sweep leaves kept bytes alone"
    assert versions.collect(grace=0) == 0, "an event refers to them"
    ChangeEvent.objects.filter(resource_set=bitstreams).delete()  # past retention
    with committing():  # the files go once the collection commits
        assert versions.collect(grace=0) == 1
    assert not Version.objects.exists() and not (documents_storage / version.storage_name).exists()


def test_a_store_that_cannot_be_written_loses_no_change(seed, bitstreams, committing, documents_storage, monkeypatch):
    """A full disk under the version store: the changes wait (nothing is left out or deleted),
    and are written once there is room."""
    import errno
    import tempfile

    from django.core.files.base import ContentFile

    from django_resourcesync import tracking
    from django_resourcesync.models import LeftOut, PendingChange
    from django_resourcesync.tracking import outbox
    from example_project.repository.models import ItemFile

    bitstreams.capabilities = ALL
    bitstreams.save()
    with committing():
        seed(2)
    rebuild_set(bitstreams)
    real = tempfile.NamedTemporaryFile

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", full)
    real_send = outbox.send
    monkeypatch.setattr(outbox, "send", lambda task, sources: None)
    upload = ItemFile.objects.order_by("pk").first()
    with committing():
        upload.file.save("new.txt", ContentFile(b"new bytes"))
    counts = tracking.process_pending()
    assert counts.failed_sets == 1 and PendingChange.objects.exists()
    assert changes(bitstreams) == [] and not LeftOut.objects.exists()
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", real)
    monkeypatch.setattr(outbox, "send", real_send)
    tracking.process_pending()
    assert [change for change, _loc, _md in changes(bitstreams)] == ["updated"]
    assert not PendingChange.objects.exists()


def test_a_set_that_failed_is_caught_up_alone_without_repeating_the_others(
    seed, bitstreams, metadata, committing, documents_storage, outage, monkeypatch
):
    from django_resourcesync import tracking
    from django_resourcesync.tracking import processing

    for resource_set in (bitstreams, metadata):
        resource_set.capabilities = ["resourcelist", "changelist"]
        resource_set.save()
    with committing():
        seed(2)
    rebuild_set(bitstreams)
    rebuild_set(metadata)
    pages = ResourceSet.objects.filter(source="pages")
    pages.update(enabled=False)
    real = processing._apply

    def failing(resource_set, *args):
        if resource_set.slug == "bitstreams":
            raise RuntimeError("broken today")
        return real(resource_set, *args)

    monkeypatch.setattr(processing, "_apply", failing)
    item = Item.objects.order_by("pk").first()
    for number in range(2):
        with committing():
            item.title = f"Title {number}"
            item.save()
    assert tracking.process_pending().failed_sets == 1
    assert [change for change, *_ in changes(metadata)] == ["updated", "updated"]
    monkeypatch.setattr(processing, "_apply", real)
    tracking.process_pending()
    assert [change for change, *_ in changes(metadata)] == ["updated", "updated"], "the metadata set is not told twice"


def test_a_file_replaced_while_its_item_was_private_is_never_published(seed, bitstreams, committing, documents_storage, outage):
    """During an outage, an item is made private, its file replaced, the item made public and
    the file replaced again: the bytes the file had while private appear nowhere."""
    import hashlib

    from django.core.files.base import ContentFile

    from django_resourcesync import tracking
    from django_resourcesync.builders import changedump
    from django_resourcesync.models import ChangeEvent, Version
    from example_project.repository.models import ItemFile

    publish(bitstreams, seed, committing, ALL)
    item = Item.objects.order_by("pk").first()
    upload = ItemFile.objects.filter(item=item).order_by("pk").first()
    secret, public = b"only while the item was private", b"the item is public again"

    def visibility(shown):
        item.is_public = shown
        item.save()

    for step in (lambda: visibility(False), lambda: upload.file.save("secret.txt", ContentFile(secret)),
                 lambda: visibility(True), lambda: upload.file.save("public.txt", ContentFile(public))):
        with committing():
            step()
    tracking.process_pending()
    digest = hashlib.sha256(secret).hexdigest()
    assert not ChangeEvent.objects.filter(sha256=digest).exists() and not Version.objects.filter(sha256=digest).exists()
    assert [meta["hash"].split()[-1] for _c, loc, meta in changes(bitstreams) if loc.endswith(upload.name)] == [
        f"sha-256:{hashlib.sha256(public).hexdigest()}"
    ]
    packed = _manifest_changes(changedump.package_changes(bitstreams))
    assert secret not in [body for *_rest, body in packed] and public in [body for *_rest, body in packed]


def test_without_the_store_a_package_holds_only_changes_whose_bytes_are_still_current(
    seed, bitstreams, committing, documents_storage, outage, settings
):
    """``KEEP_VERSIONS`` off: nothing is kept, and a package packs a change only if the
    resource's current bytes are that change's (never other bytes under its hash)."""
    from django.core.files.base import ContentFile

    from django_resourcesync import tracking
    from django_resourcesync.builders import changedump
    from django_resourcesync.models import Version
    from example_project.repository.models import ItemFile

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "KEEP_VERSIONS": False}
    publish(bitstreams, seed, committing, ALL)
    upload = ItemFile.objects.order_by("pk").first()
    for content in (b"first", b"second", b"third"):
        with committing():
            upload.file.save("v.txt", ContentFile(content))
    tracking.process_pending()
    listed = [meta["hash"] for _c, loc, meta in changes(bitstreams) if loc.endswith(upload.name)]
    assert len(listed) == 3 and not Version.objects.exists()
    packed = _manifest_changes(changedump.package_changes(bitstreams))
    assert [(meta["hash"], body) for _c, _l, meta, body in packed] == [(listed[-1], b"third")]


def test_an_objects_saves_are_not_cut_apart_by_batches(seed, bitstreams, committing, documents_storage, outage):
    """A backlog larger than a batch: the saves of one object that fall across the batch's end
    are each an event with their own bytes, not one event with the last one's."""
    import hashlib

    from django.core.files.base import ContentFile

    from django_resourcesync import tracking
    from example_project.repository.models import ItemFile

    publish(bitstreams, seed, committing, ALL, items=3)
    first, second = ItemFile.objects.order_by("pk")[:2]
    contents = [b"first, one", b"second, one", b"first, two"]
    for upload, content in zip((first, second, first), contents):
        with committing():
            upload.file.save("x.txt", ContentFile(content))
    tracking.process_pending(batch_size=1)
    first_uri = "http://testserver" + first.get_absolute_url()
    listed = [(loc == first_uri, meta["hash"].split()[-1]) for _c, loc, meta in changes(bitstreams)]
    assert sorted(listed) == sorted((upload is first, f"sha-256:{hashlib.sha256(content).hexdigest()}")
                                    for upload, content in zip((first, second, first), contents))


def test_saves_made_while_a_resource_was_not_public_are_not_published(seed, metadata, committing, documents_storage, outage):
    """During an outage, an item is made private, edited, made public and edited again: the
    edit made while it was private is no event (not even one without bytes)."""
    from django_resourcesync import tracking

    publish(metadata, seed, committing)
    item = Item.objects.order_by("pk").first()
    windows = []
    for field, value in (("is_public", False), ("title", "Edited while private"), ("is_public", True), ("title", "Public")):
        def save(field=field, value=value):
            setattr(item, field, value)
            item.save()
        windows.append(_timed(committing, save))
    tracking.process_pending()
    stamps = [parse_datetime(meta["datetime"]) for _change, _loc, meta in changes(metadata)]
    assert len(stamps) == 2
    assert [any(before <= stamp <= after for stamp in stamps) for before, after in windows] == [False, False, True, True]


def test_sets_noted_after_the_objects_next_change_are_not_trusted(seed, bitstreams, committing, documents_storage, outage):
    """Which sets listed an object is noted just after its save commits; if the object changed
    again first (its item made private at once, say), what was noted may tell of that change:
    the overtaken save is then no event."""
    from django.core.files.base import ContentFile

    from django_resourcesync import tracking
    from django_resourcesync.models import PendingChange
    from example_project.repository.models import ItemFile

    publish(bitstreams, seed, committing, ["resourcelist", "changelist"])
    upload = ItemFile.objects.order_by("pk").first()
    for content in (b"first", b"second"):
        with committing():
            upload.file.save("v.txt", ContentFile(content))
    first, second = PendingChange.objects.filter(source="bitstreams").order_by("pk")
    assert first.sets == [bitstreams.pk] and first.noted > first.recorded
    PendingChange.objects.filter(pk=first.pk).update(noted=second.recorded)  # noted too late
    tracking.process_pending()
    assert [change for change, *_ in changes(bitstreams)] == ["updated"]


def test_the_bytes_kept_of_a_resource_that_leaves_the_set_are_forgotten(seed, bitstreams, committing, documents_storage):
    from django.core.files.base import ContentFile

    from django_resourcesync.models import Version
    from example_project.repository.models import ItemFile

    publish(bitstreams, seed, committing, ALL)
    first, second = ItemFile.objects.order_by("pk")[:2]
    assert first.item_id != second.item_id
    for upload, content in ((first, b"only the first file's"), (second, b"shared bytes"), (first, b"shared bytes")):
        with committing():
            upload.file.save("v.txt", ContentFile(content))
    kept = {version.sha256: documents_storage / version.storage_name for version in Version.objects.all()}
    assert len(kept) == 2 and all(path.exists() for path in kept.values())
    with committing():
        first.item.is_public = False
        first.item.save()
    left = {version.sha256 for version in Version.objects.all()}
    assert len(left) == 1 and kept[left.pop()].read_bytes() == b"shared bytes", "another public file has these"
    assert sum(path.exists() for path in kept.values()) == 1


def test_a_version_whose_file_was_lost_is_whole_again_once_the_bytes_are_kept_again(documents_storage, db):
    from django_resourcesync import versions

    representation = versions.keep(iter([b"some bytes"]))
    versions.record({representation.sha256: representation.length})
    path = documents_storage / versions.name_of(representation.sha256)
    path.unlink()
    assert versions.open_bytes(representation.sha256) is None
    versions.keep(iter([b"some bytes"]))
    assert path.read_bytes() == b"some bytes"


def test_an_earlier_state_that_the_storage_refuses_to_give_has_no_hash(seed, bitstreams, committing, documents_storage, outage,
                                                                       monkeypatch):
    from django.core.files.base import ContentFile

    from django_resourcesync import tracking
    from example_project.repository.models import ItemFile

    publish(bitstreams, seed, committing, ALL)
    upload = ItemFile.objects.order_by("pk").first()
    for content in (b"first", b"second"):
        with committing():
            upload.file.save("v.txt", ContentFile(content))

    def refused(self, obj, state):
        raise RuntimeError("403 Forbidden")  # what an object store may answer for a missing key

    monkeypatch.setattr(type(bitstreams.get_source()), "state_bitstream", refused)
    assert tracking.process_pending().failed_sets == 0
    assert [("hash" in meta) for _c, _l, meta in changes(bitstreams)] == [False, True]


def test_a_sources_own_affected_by_is_what_processing_asks(seed, bitstreams, committing, documents_storage, monkeypatch):
    """``affected_by`` is a documented hook (a site's faster way to find the objects a related
    change affects): processing calls the site's own."""
    publish(bitstreams, seed, committing, ["resourcelist", "changelist"])
    source = bitstreams.get_source()
    asked = []

    def affected_by(self, model, pks):
        asked.append((model, list(pks)))
        return [key for pk in pks for key in model.objects.get(pk=pk).files.values_list("pk", flat=True)]

    monkeypatch.setattr(type(source), "affected_by", affected_by)
    item = Item.objects.order_by("pk").first()
    with committing():
        item.is_public = False
        item.save()
    assert asked == [(Item, [str(item.pk)])]
    assert {change for change, _loc, _md in changes(bitstreams)} == {"deleted"}
