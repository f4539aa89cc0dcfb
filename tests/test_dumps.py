"""Resource Dumps and Change Dumps: unzip every package and check every byte."""

import hashlib
import io
import os
import shutil
import subprocess
import tempfile
import types
import zipfile

import pytest
from django.core.files.base import ContentFile

from django_resourcesync import tracking
from django_resourcesync.builders.changedump import package_changes
from django_resourcesync.models import Build, ChangeEvent, Document
from django_resourcesync.rebuild import rebuild_set
from example_project.repository.models import Collection, Item, ItemFile

from .helpers import fetch, path_of, resource_list_entries
from .xmlcheck import SM, check_document, entries, link, md

pytestmark = pytest.mark.django_db

RS_LN = "{http://www.openarchives.org/rs/terms/}ln"


@pytest.fixture
def dumping(bitstreams, metadata, django_capture_on_commit_callbacks):
    for resource_set in (bitstreams, metadata):
        resource_set.capabilities = ["resourcelist", "changelist", "resourcedump", "changedump"]
        resource_set.save()
    return bitstreams


def info_zip_test(package):
    """Info-ZIP's ``unzip -t`` must accept the package too, where it is installed."""
    if shutil.which("unzip"):
        with tempfile.NamedTemporaryFile(suffix=".zip") as handle:
            handle.write(package)
            handle.flush()
            done = subprocess.run(["unzip", "-tqq", handle.name], capture_output=True, text=True)
            assert done.returncode == 0, done.stdout + done.stderr


def loc(entry):
    return entry.find(f"{{{SM}}}loc").text


def unpack(resource_set, capability):
    """[(manifest root, {loc: (md, bytes)})] for every package of a dump, every check made."""
    status, body, _ = fetch(f"/resourcesync/{resource_set.slug}/{capability}.xml")
    assert status == 200
    dump = check_document(body, capability)
    assert link(dump, "up") == f"http://testserver/resourcesync/{resource_set.slug}/capabilitylist.xml"
    packages = []
    for entry in entries(dump):
        meta = md(entry)
        status, package, response = fetch(path_of(loc(entry)))
        assert status == 200 and response["Content-Type"] == "application/zip"
        assert int(meta["length"]) == len(package) and meta["type"] == "application/zip"
        assert meta["hash"] == f"sha-256:{hashlib.sha256(package).hexdigest()}"
        (contents,) = [ln.attrib for ln in entry.findall(RS_LN)]
        assert contents["rel"] == "contents" and contents["type"] == "application/xml"
        status, manifest_copy, _ = fetch(path_of(contents["href"]))
        archive = zipfile.ZipFile(io.BytesIO(package))
        assert archive.testzip() is None
        info_zip_test(package)
        names = archive.namelist()
        assert "manifest.xml" in names
        assert archive.read("manifest.xml") == manifest_copy, "the published manifest is the packaged one"
        manifest = check_document(manifest_copy, f"{capability}-manifest")
        for name in names:
            assert not name.startswith("/") and ".." not in name.split("/") and "\\" not in name
            assert name.isprintable() and name == name.strip()
        assert len(names) == len(set(names))
        listed = {}
        members = {"manifest.xml"}
        for item in entries(manifest):
            item_md = md(item)
            if item_md.get("change") == "deleted":
                assert "path" not in item_md
                listed.setdefault(loc(item), []).append((item_md, None))
                continue
            assert item_md["path"].startswith("/") and not item_md["path"].endswith("/")
            data = archive.read(item_md["path"][1:])
            members.add(item_md["path"][1:])
            assert int(item_md["length"]) == len(data)
            assert item_md["hash"] == f"md5:{hashlib.md5(data).hexdigest()} sha-256:{hashlib.sha256(data).hexdigest()}"
            listed.setdefault(loc(item), []).append((item_md, data))
        assert members == set(names), "every member is in the manifest and every path is a member"
        packages.append((manifest, meta, listed))
    return dump, packages


def test_resource_dump_contains_what_the_resource_list_lists(seed, dumping):
    seed(9)
    builds = rebuild_set(dumping)
    assert [b.capability for b in builds] == ["resourcelist", "resourcedump"]
    dump, packages = unpack(dumping, "resourcedump")
    assert md(dump)["at"] <= md(dump)["completed"]
    ((manifest, meta, listed),) = packages
    assert {"at", "completed"} <= set(meta)
    in_list = {loc(e): md(e)["hash"] for e in resource_list_entries(dumping)}
    assert {uri: versions[0][0]["hash"] for uri, versions in listed.items()} == in_list
    for uri, versions in listed.items():
        status, body, _ = fetch(path_of(uri))
        assert versions[0][1] == body, "the packed bytes are the served bytes"


def test_packages_split_by_size_and_count(seed, dumping, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "DUMP_PACKAGE_BYTES": 5000}
    seed(6, file_size=2048)  # 8 files of 2048 bytes: two fit in 5000
    rebuild_set(dumping)
    _, packages = unpack(dumping, "resourcedump")
    assert [len(listed) for _m, _meta, listed in packages] == [2, 2, 2, 2]
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "DUMP_PACKAGE_BYTES": 10**9, "MAX_ENTRIES_PER_DOCUMENT": 3}
    rebuild_set(dumping)
    status, body, _ = fetch("/resourcesync/bitstreams/resourcedump.xml")
    assert check_document(body, "resourcedump").tag == f"{{{SM}}}urlset"
    _, packages = unpack(dumping, "resourcedump")
    assert [len(listed) for _m, _meta, listed in packages] == [3, 3, 2]


def test_resource_dump_index_past_the_entry_limit(seed, dumping, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 2}
    seed(5, file_size=100)  # 6 files: 3 packages of 2, an index of 2 dump documents
    rebuild_set(dumping)
    status, body, _ = fetch("/resourcesync/bitstreams/resourcedump.xml")
    index = check_document(body, "resourcedump")
    assert index.tag == f"{{{SM}}}sitemapindex"
    total = 0
    for part in entries(index):
        status, body, _ = fetch(path_of(loc(part)))
        doc = check_document(body, "resourcedump", max_entries=2)
        assert link(doc, "index") == "http://testserver/resourcesync/bitstreams/resourcedump.xml"
        total += len(entries(doc))
    assert total == 3


def test_hostile_file_names_give_safe_unique_members(dumping):
    collection = Collection.objects.create(name="C", slug="c")
    item = Item.objects.create(collection=collection, title="x")
    names = ["../../etc/passwd", "..", "a\\b\\c.txt", "ctl\x01\x1f.txt", "C:\\Windows\\x.txt", "same.txt", "same.txt",
             "SAME.txt", "manifest.xml", "q?a=1&b=2", " spaced .txt", "ünï cödé.txt", "x" * 250]
    for name in names:
        row = ItemFile(item=item, name=name, media_type="text/plain")
        row.file.save("f.txt", ContentFile(name.encode("utf-8", "surrogatepass")), save=False)
        row.save()
    rebuild_set(dumping)
    _, packages = unpack(dumping, "resourcedump")  # asserts the names are safe and unique
    # Names with a ".." segment cannot be published at all (see test_uris.py): left out.
    assert sum(len(listed) for _m, _meta, listed in packages) == len(names) - 2


def test_zero_byte_file_and_private_items(seed, dumping):
    seed(3)
    empty = ItemFile.objects.order_by("pk")[0]
    empty.file.save("empty.txt", ContentFile(b""), save=True)
    secret = Item.objects.order_by("pk")[1]
    secret.is_public = False
    secret.save()
    rebuild_set(dumping)
    _, packages = unpack(dumping, "resourcedump")
    listed = packages[0][2]
    assert listed["http://testserver" + empty.get_absolute_url()][0][1] == b""
    assert not [uri for uri in listed if f"/items/{secret.pk}/" in uri]


def test_a_missing_file_is_left_out_and_a_changed_one_rehashed(seed, dumping, monkeypatch):
    seed(4)
    rebuild_set(dumping)
    missing, changed = ItemFile.objects.order_by("pk")[:2]
    # Both after the record was made: one file vanishes, one changes bytes but not name or size.
    from django_resourcesync.builders.resourcedump import build_resourcedump

    os.remove(missing.file.path)
    data = open(changed.file.path, "rb").read()
    open(changed.file.path, "wb").write(data.upper())
    build = build_resourcedump(dumping, refresh=False)
    assert build.report == {"changed_since_hashed": 1, "unreadable": 1, "gone": 0}
    _, packages = unpack(dumping, "resourcedump")
    listed = packages[0][2]
    assert "http://testserver" + missing.get_absolute_url() not in listed
    assert listed["http://testserver" + changed.get_absolute_url()][0][1] == data.upper()
    # Both were handed to change tracking: the log and the lists catch up.
    tracking.process_pending()
    assert {(e.change, e.object_pk) for e in ChangeEvent.objects.all()} == {
        ("updated", str(changed.pk)), ("deleted", str(missing.pk))
    }


def test_an_interrupted_dump_leaves_the_previous_one_published(seed, dumping, monkeypatch, documents_storage):
    seed(4)
    rebuild_set(dumping)
    _, before, _ = fetch("/resourcesync/bitstreams/resourcedump.xml")
    from django_resourcesync import packaging

    calls = {"n": 0}
    real = packaging.PackageWriter.add

    def failing(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("connection to storage lost")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(packaging.PackageWriter, "add", failing)
    from django_resourcesync.builders.resourcedump import build_resourcedump

    with pytest.raises(OSError):
        build_resourcedump(dumping, refresh=False)
    failed = Build.objects.filter(capability="resourcedump").order_by("-pk").first()
    assert failed.status == Build.Status.FAILED
    assert not (documents_storage / "documents" / "bitstreams" / str(failed.pk)).exists() or not any(
        (documents_storage / "documents" / "bitstreams" / str(failed.pk)).iterdir()
    )
    status, after, _ = fetch("/resourcesync/bitstreams/resourcedump.xml")
    assert status == 200 and after == before
    unpack(dumping, "resourcedump")


def test_change_dump_packages_changes_oldest_first(seed, dumping, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        seed(4)
    rebuild_set(dumping)  # baseline: starts the log
    assert fetch("/resourcesync/bitstreams/changedump.xml")[0] == 404, "no package yet"
    first, second, third = ItemFile.objects.order_by("pk")[:3]
    with django_capture_on_commit_callbacks(execute=True):
        first.file.save("v2.txt", ContentFile(b"version 2"), save=True)
    with django_capture_on_commit_callbacks(execute=True):
        first.file.save("v3.txt", ContentFile(b"version 3"), save=True)
    with django_capture_on_commit_callbacks(execute=True):
        second.delete()
    with django_capture_on_commit_callbacks(execute=True):
        seed(1)
    package = package_changes(dumping)
    assert package.number == 1
    dump, packages = unpack(dumping, "changedump")
    assert "until" not in md(dump), "the Change Dump is still being extended"
    ((manifest, meta, listed),) = packages
    top = md(manifest)
    assert top["from"] == meta["from"] and top["until"] == meta["until"] and top["from"] <= top["until"]
    changes = [(md(e)["change"], loc(e), md(e)["datetime"]) for e in entries(manifest)]
    assert [c for c, _l, _d in changes] == ["updated", "updated", "deleted", "created"]
    assert [d for _c, _l, d in changes] == sorted(d for _c, _l, d in changes)
    assert all(top["from"] <= d <= top["until"] for _c, _l, d in changes)
    versions = listed["http://testserver" + first.get_absolute_url()]
    assert len(versions) == 2, "a resource changed twice is in the package twice"
    assert versions[-1][1] == b"version 3"
    assert package_changes(dumping) is None, "nothing new to package"
    with django_capture_on_commit_callbacks(execute=True):
        third.file.save("v2.txt", ContentFile(b"third, changed"), save=True)
    second_package = package_changes(dumping)
    assert second_package.from_time == package.until
    dump, packages = unpack(dumping, "changedump")
    assert [md(e)["from"] for e in entries(dump)][1] == [md(e)["until"] for e in entries(dump)][0]
    _, body, _ = fetch("/resourcesync/bitstreams/capabilitylist.xml")
    assert [md(e)["capability"] for e in entries(check_document(body, "capabilitylist"))] == [
        "resourcelist", "changelist", "resourcedump", "changedump"]


def test_range_requests_on_packages(seed, dumping):
    seed(2)
    rebuild_set(dumping)
    _, body, _ = fetch("/resourcesync/bitstreams/resourcedump.xml")
    package_path = path_of(loc(entries(check_document(body, "resourcedump"))[0]))
    _, whole, response = fetch(package_path)
    assert response["Accept-Ranges"] == "bytes"
    status, part, response = fetch(package_path, Range="bytes=10-99")
    assert status == 206 and part == whole[10:100] and response["Content-Range"] == f"bytes 10-99/{len(whole)}"
    status, tail, _ = fetch(package_path, Range="bytes=-10")
    assert status == 206 and tail == whole[-10:]
    assert fetch(package_path, Range=f"bytes={len(whole)}-")[0] == 416
    assert fetch(package_path, Range="bytes=0-9", **{"If-Range": '"stale"'})[0] == 200
    assert fetch(package_path, Range="bytes=50-10")[0] == 200, "a malformed range is ignored"


@pytest.mark.slow
def test_a_file_past_4_gib_is_packed_with_zip64(dumping, tmp_path):
    collection = Collection.objects.create(name="C", slug="big")
    item = Item.objects.create(collection=collection, title="big")
    row = ItemFile(item=item, name="big.bin", media_type="application/octet-stream")
    row.file.save("big.bin", ContentFile(b""), save=False)
    size = 4 * 1024**3 + 12345
    with open(row.file.path, "r+b") as handle:  # sparse: cheap to make, 4 GiB to read
        handle.truncate(size)
        handle.seek(size - 5)
        handle.write(b"tail!")
    row.save()
    rebuild_set(dumping)
    (document,) = Document.objects.filter(media_type="application/zip", build__status="published")
    from django_resourcesync.storage import get_storage

    if shutil.which("unzip"):
        done = subprocess.run(["unzip", "-tqq", get_storage().path(document.storage_name)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    with get_storage().open(document.storage_name, "rb") as handle:
        archive = zipfile.ZipFile(handle)
        (member,) = [info for info in archive.infolist() if info.filename != "manifest.xml"]
        assert member.file_size == size
        digest = hashlib.sha256()
        with archive.open(member) as data:
            for chunk in iter(lambda: data.read(8 * 1024 * 1024), b""):
                digest.update(chunk)
        manifest = check_document(archive.read("manifest.xml"), "resourcedump-manifest")
    assert md(entries(manifest)[0])["hash"].endswith(digest.hexdigest())
    assert md(entries(manifest)[0])["length"] == str(size)


def test_member_names_never_put_a_file_where_a_folder_must_go(tmp_path):
    from django_resourcesync.packaging import MemberNames

    names = MemberNames()
    uris = ["http://h.example/about", "http://h.example/about/team", "http://h.example/about/", "http://h.example/",
            "http://h.example", "http://h.example/about/team/x", "http://h.example/a/../../b", "http://h.example/about"]
    made = [names.name(uri) for uri in uris]
    assert len(set(made)) == len(made)
    package = tmp_path / "p.zip"
    with zipfile.ZipFile(package, "w") as archive:
        for name in made:
            archive.writestr(name, name)
    zipfile.ZipFile(package).extractall(tmp_path / "out")  # a file/folder clash would fail here
    for name in made:
        assert (tmp_path / "out" / name).read_text() == name
    if shutil.which("unzip"):
        done = subprocess.run(["unzip", "-qq", str(package), "-d", str(tmp_path / "info-zip")], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_change_dump_index_past_the_entry_limit(seed, dumping, settings, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        seed(3)
    rebuild_set(dumping)
    first = ItemFile.objects.order_by("pk")[0]
    for n in range(5):
        with django_capture_on_commit_callbacks(execute=True):
            first.file.save(f"v{n}.txt", ContentFile(f"version {n}".encode()), save=True)
        assert package_changes(dumping).number == n + 1
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "MAX_ENTRIES_PER_DOCUMENT": 2}
    status, body, _ = fetch("/resourcesync/bitstreams/changedump.xml")
    index = check_document(body, "changedump")
    assert index.tag == f"{{{SM}}}sitemapindex" and "until" not in md(index)
    parts = entries(index)
    assert len(parts) == 3 and "until" in md(parts[0]) and "until" not in md(parts[-1])
    seen = []
    for number, sitemap in enumerate(parts, start=1):
        status, part, _ = fetch(path_of(loc(sitemap)))
        doc = check_document(part, "changedump", max_entries=2)
        assert link(doc, "index") == "http://testserver/resourcesync/bitstreams/changedump.xml"
        assert ("until" in md(doc)) == (number < len(parts))
        seen += [loc(e) for e in entries(doc)]
    assert len(seen) == 5 and seen == sorted(seen, key=lambda uri: int(uri.rsplit("/", 1)[1].split(".")[0]))


def test_the_progress_of_a_dump_in_packages_counts_bytes_and_files(seed, dumping, settings):
    from django_resourcesync.progress import ProgressBar

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "DUMP_PACKAGE_BYTES": 5000}
    seed(6, file_size=2048)  # 8 files, 4 packages: each packed as a part of its own
    rebuild_set(dumping, only=["resourcedump"])
    seen = []
    build = rebuild_set(dumping, only=["resourcedump"], progress=lambda *args, **kwargs: seen.append((args, kwargs)))[0]
    assert build.parts.count() == 4
    dumped = [(args[1:], kwargs) for args, kwargs in seen if args[0] == "resourcedump"]
    amounts = [amount for (amount, _total), _kwargs in dumped]
    assert amounts == sorted(amounts), "the parts' bytes add up as they are packed"
    assert dumped[-1] == ((8 * 2048, 8 * 2048), {"unit": "B", "note": "8 files"})
    bar = ProgressBar(stream=io.StringIO())
    rebuild_set(dumping, only=["resourcedump"], progress=bar)
    bar.end()
    assert "resourcedump   [##############################] 0.0 MB/0.0 MB" in bar.stream.getvalue()
    assert "(8 files)" in bar.stream.getvalue()


def test_the_progress_bar_shows_counts_and_rates_whole(monkeypatch):
    """A rate is a count a second: shown whole with thousands separated, never as a raw float."""
    from django_resourcesync import progress

    clock = iter([100.0, 102.5, 105.0])
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    bar = progress.ProgressBar(stream=io.StringIO(), interval=0)
    bar("reconcile", 0, 1_000_000)
    bar("reconcile", 250_000, 1_000_000)
    bar("reconcile", 1_000_000, 1_000_000)
    bar.end()
    shown = bar.stream.getvalue()
    assert "250,000/1,000,000 100,000/s ETA 8s" in shown
    assert "1,000,000/1,000,000 200,000/s" in shown


def test_the_changes_of_a_resource_that_left_the_set_are_left_out_of_the_package_and_counted(
    seed, dumping, caplog, django_capture_on_commit_callbacks
):
    """Not listed without a bitstream: section 13.2 wants a path on every entry but a deletion's.
    A Destination tells them from the Change List, where each is followed by the deletion."""
    import logging

    with django_capture_on_commit_callbacks(execute=True):
        seed(3)
    rebuild_set(dumping)  # baseline: starts the log
    kept, leaving = ItemFile.objects.order_by("pk")[:2]
    assert kept.item_id != leaving.item_id
    with django_capture_on_commit_callbacks(execute=True):
        leaving.file.save("v2.txt", ContentFile(b"bytes that are not public any more"), save=True)
    with django_capture_on_commit_callbacks(execute=True):
        kept.file.save("v2.txt", ContentFile(b"bytes that stay public"), save=True)
    with django_capture_on_commit_callbacks(execute=True):
        item = leaving.item
        item.is_public = False
        item.save()
    caplog.set_level(logging.INFO, logger="django_resourcesync.builders.changedump")
    package_changes(dumping)
    _, ((manifest, meta, listed),) = unpack(dumping, "changedump")
    gone, stays = "http://testserver" + leaving.get_absolute_url(), "http://testserver" + kept.get_absolute_url()
    assert [item_md["change"] for item_md, _data in listed[gone]] == ["deleted"]
    assert [data for _md, data in listed[stays]] == [b"bytes that stay public"]
    # The Change List has both changes of the resource that left, in the package's interval.
    changes = [md(e) for e in entries(check_document(fetch("/resourcesync/bitstreams/changelist.xml")[1], "changelist"))
               if loc(e) == gone]
    assert [c["change"] for c in changes] == ["updated", "deleted"]
    assert all(meta["from"] <= c["datetime"] <= meta["until"] for c in changes)
    assert "bitstreams Change Dump package 1: 1 change(s) of resources that have left the set are left out" in caplog.text
