"""The self-audit over real HTTP: none on a healthy Source, exactly the problems injected on a
broken one, a set for partners with its token, and a Source written by another implementation
(the resync library), served by a plain file server."""

import functools
import hashlib
import http.server
import io
import threading
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from django_resourcesync import access, discovery, storage
from django_resourcesync.audit import audit, rules
from django_resourcesync.models import AuditReport, Build, Document, Resource
from django_resourcesync.rebuild import rebuild_set
from example_project.repository.models import ItemFile

from .conftest import demo_set
from .helpers import build, free_port


@pytest.fixture
def source(live_server, settings, seed, transactional_db):
    """The example Source running at a live server: its files and records, with Resource and
    Change Lists and Resource Dumps, 6 items."""
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BASE_URL": live_server.url}
    seed(6)
    sets = {}
    for slug in ("bitstreams", "metadata"):
        resource_set = demo_set(slug)
        resource_set.capabilities = ["resourcelist", "changelist", "resourcedump"]
        resource_set.save()
        rebuild_set(resource_set)
        sets[slug] = resource_set
    return sets


def run(*args):
    """``resourcesync_audit`` with ``args``: ``(exit code, lines)``. Without ``--schemas``, it
    validates against the schemas the app ships."""
    out = io.StringIO()
    try:
        call_command("resourcesync_audit", *args, stdout=out)
        code = 0
    except SystemExit as exit:
        code = exit.code
    return code, out.getvalue().splitlines()


def problems(lines):
    return [line for line in lines if line.startswith("PROBLEM ")]


def test_a_healthy_source_has_no_problem(source):
    code, lines = run("--all")
    assert code == 0 and problems(lines) == [], lines
    assert lines[-1].startswith("OK: ")
    documents, resources, packages = (int(word) for word in lines[-1].replace(",", "").split() if word.isdigit())
    assert resources == 6 * 2 - 0 + 2  # 8 files (every third item has two) and 6 records
    assert packages == 2 and documents > 6
    reports = {report.resource_set.slug: report for report in AuditReport.objects.all()}
    assert set(reports) == {"bitstreams", "metadata"} and not any(report.problems for report in reports.values())


def test_a_file_changed_in_place_with_the_same_size_is_reported_and_nothing_else(source):
    changed = ItemFile.objects.order_by("pk").first()
    path = Path(changed.file.path)
    data = path.read_bytes()
    path.write_bytes(bytes(reversed(data)) if data != bytes(reversed(data)) else b"x" * len(data))
    code, lines = run("--all")
    found = problems(lines)
    uri = Resource.objects.get(resource_set=source["bitstreams"], object_pk=str(changed.pk)).uri
    assert code == 1 and found and all(line.startswith(f"PROBLEM {uri}: listed with ") for line in found), found
    assert {line.split()[4] for line in found} == {"md5", "sha-256"}
    report = AuditReport.objects.filter(resource_set=source["bitstreams"]).first()
    assert len(report.problems) == 2 and not AuditReport.objects.filter(resource_set=source["metadata"]).first().problems


def test_what_changed_since_the_resource_list_is_checked_against_the_change_list(source):
    """A Destination takes the Resource List, then the Change List's entries after it: an item
    edited or made private since the last rebuild is no problem; bytes changed behind both are."""
    from example_project.repository.models import Item

    edited, hidden = Item.objects.filter(is_public=True).order_by("pk")[:2]
    edited.title = "Edited after the rebuild"
    edited.save()
    hidden.is_public = False
    hidden.save()
    code, lines = run("--all")
    assert code == 0 and problems(lines) == [], lines
    changed = ItemFile.objects.filter(item=edited).order_by("pk").first()
    path = Path(changed.file.path)
    path.write_bytes(b"y" + path.read_bytes())
    ItemFile.objects.filter(pk=changed.pk).update(name=changed.name)  # no signal: the Change List says nothing
    code, lines = run("--all")
    uri = Resource.objects.get(resource_set=source["bitstreams"], object_pk=str(changed.pk)).uri
    assert code == 1 and problems(lines) and all(line.startswith(f"PROBLEM {uri}: ") for line in problems(lines)), lines


def test_a_document_edited_behind_the_apps_back_is_reported(source):
    document = Document.objects.get(
        resource_set=source["metadata"], name="resourcelist.xml", build__status=Build.Status.PUBLISHED
    )
    store = storage.get_storage()
    with store.open(document.storage_name, "rb") as handle:
        body = handle.read()
    start = body.index(b"<lastmod>") + len(b"<lastmod>")
    edited = body[:start] + b"1999" + body[start + 4:]  # the same size, valid, but not what was published
    with store.open(document.storage_name, "wb") as handle:
        handle.write(edited)
    code, lines = run("--set", "metadata", "--all")
    assert code == 1
    assert problems(lines) == [
        f"PROBLEM {source['metadata'].resources.first().uri.split('/items/')[0]}/resourcesync/metadata/resourcelist.xml: "
        "the bytes served are not those the Source published (changed behind its back, or a stale copy from a cache or "
        "proxy in front of it)"
    ]


def test_a_hash_wrong_in_the_record_is_reported(source):
    record = Resource.objects.filter(resource_set=source["metadata"]).order_by("pk").first()
    wrong = "0" * 32
    Resource.objects.filter(pk=record.pk).update(md5=wrong, entry_xml=record.entry_xml.replace(record.md5, wrong))
    build(source["metadata"], refresh=False, only=["resourcelist"])
    code, lines = run("--set", "metadata", "--all")
    assert code == 1
    assert problems(lines) == [f"PROBLEM {record.uri}: listed with md5 {wrong}, the bytes served have {record.md5}"]


def test_resources_that_lose_their_link_header_on_the_way_are_reported(source, monkeypatch):
    monkeypatch.setattr(discovery, "add_link_header", lambda response, targets: response)  # a proxy that strips them
    code, lines = run("--set", "metadata", "--sample", "3")
    found = problems(lines)
    assert code == 1 and len(found) == 3 and all('rel="resourcesync" header' in line for line in found), found
    monkeypatch.undo()
    assert run("--set", "metadata", "--sample", "3")[0] == 0


def test_a_set_for_partners_is_audited_with_a_token_and_refused_without(source):
    partners = demo_set("all-records")
    rebuild_set(partners)
    code, lines = run("--set", "all-records")
    assert code == 1 and "answered 401" in problems(lines)[0]
    token = access.issue("Auditor", [partners])[1]
    code, lines = run("--set", "all-records", "--all", "--token", token)
    assert code == 0, lines


def test_the_periodic_audit_keeps_a_report_per_set_and_reads_a_set_for_partners_with_a_token_of_its_own(source):
    from django_resourcesync.models import AccessToken
    from django_resourcesync.tasks import audit_task

    partners = demo_set("all-records")
    rebuild_set(partners)
    found = audit_task.delay(sample=3).get()
    assert found == {"bitstreams": 0, "metadata": 0, "all-records": 0}
    assert AuditReport.objects.filter(resource_set=partners, problems=[]).exists()
    assert not AccessToken.objects.exists()  # its own token went with it


def test_the_admin_shows_each_sets_last_audit(source, admin_client):
    Path(ItemFile.objects.order_by("pk").first().file.path).write_bytes(b"???")  # another length
    assert run("--all")[0] == 1
    page = admin_client.get("/admin/resourcesync/resourceset/").content.decode()
    assert "3 problems" in page and "OK" in page  # the files' set (length, md5, sha-256); the records'
    detail = admin_client.get(f"/admin/resourcesync/resourceset/{source['bitstreams'].pk}/change/").content.decode()
    assert "served 3 bytes" in detail


# --- a Source written by another implementation -------------------------------------------------


@pytest.fixture
def foreign_source(tmp_path):
    """A Source whose documents the resync library wrote, served as static files."""
    from resync.capability_list import CapabilityList
    from resync.resource import Resource as ResyncResource
    from resync.resource_list import ResourceList
    from resync.source_description import SourceDescription

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    files = tmp_path / "files"
    files.mkdir()
    listing = ResourceList()
    listing.up = f"{base}/capabilitylist.xml"
    for number in range(5):
        data = f"bitstream {number}\n".encode() * (number + 1)
        (files / f"f{number}.txt").write_bytes(data)
        listing.add(ResyncResource(uri=f"{base}/files/f{number}.txt", lastmod="2024-01-01T00:00:00Z", length=len(data),
                                   md5=hashlib.md5(data).hexdigest(), sha256=hashlib.sha256(data).hexdigest()))
    listing.md_at = "2024-01-02T00:00:00Z"
    (tmp_path / "resourcelist.xml").write_text(listing.as_xml())
    capability_list = CapabilityList()
    capability_list.up = f"{base}/.well-known/resourcesync"
    capability_list.add_capability(uri=f"{base}/resourcelist.xml", name="resourcelist")
    (tmp_path / "capabilitylist.xml").write_text(capability_list.as_xml())
    description = SourceDescription()
    description.add_capability_list(f"{base}/capabilitylist.xml")
    (tmp_path / ".well-known").mkdir()
    (tmp_path / ".well-known" / "resourcesync").write_text(description.as_xml())

    handler = functools.partial(_Quiet, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield base, tmp_path
    server.shutdown()
    server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_a_source_written_by_resync_is_audited_with_no_problem_then_with_exactly_the_one_injected(foreign_source, db):
    base, folder = foreign_source
    report = audit(base, sample=None)
    assert report.ok, report.lines()
    assert (report.documents, report.resources) == (3, 5)
    (folder / "files" / "f2.txt").write_bytes(b"changed behind the Source's back\n")
    report = audit(base, sample=None)
    assert {uri for uri, _what in report.problems} == {f"{base}/files/f2.txt"}
    assert any("length" in what for _uri, what in report.problems)


def test_the_rules_find_what_a_careless_writer_gets_wrong():
    doc = rules.read(
        b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">'
        b'<rs:md capability="changelist" at="2024-01-01T00:00:00+01:00"/>'
        b'<url><loc>http://example.org/b</loc><rs:md change="updated" datetime="2024-01-02T00:00:00Z" hash="MD5:AB"/></url>'
        b'<url><loc>http://example.org/a</loc><rs:md change="moved" datetime="2024-01-01T00:00:00Z"/></url>'
        b"</urlset>"
    )
    found = rules.problems(doc, "changelist")
    assert any("never at or completed" in p for p in found)  # a Change List with at, without from
    assert any("complete UTC datetime" in p for p in found)
    assert any("rel=\"up\"" in p for p in found)
    assert any("hash token 'MD5:AB'" in p for p in found)
    assert any("'moved' is not created" in p for p in found)
    assert any("oldest first" in p for p in found)


# --- the official schemas the app ships -----------------------------------------------------------


def test_without_schemas_given_the_audit_validates_against_those_the_app_ships(foreign_source, db, settings):
    """A Resource List with a value the sitemaps.org schema refuses, and no rule of the spec's
    would: the audit run as it comes (no --schemas, no setting) reports it; turned off, not."""
    base, folder = foreign_source
    listing = folder / "resourcelist.xml"
    listing.write_text(listing.read_text().replace("</lastmod>", "</lastmod><changefreq>sometimes</changefreq>", 1))
    code, lines = run("--base", base, "--all")
    found = problems(lines)
    assert code == 1 and found, lines
    assert all(line.startswith(f"PROBLEM {base}/resourcelist.xml: the schema refuses it: ") for line in found), found
    assert any("sometimes" in line for line in found), found

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "AUDIT_SCHEMAS": False}
    code, lines = run("--base", base, "--all")
    assert code == 0 and "the documents were not checked against the official schemas (turned off)" in "\n".join(lines)


def test_a_schemas_folder_given_is_used_instead_of_the_apps(foreign_source, db, tmp_path):
    base, _folder = foreign_source
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("resourcesync.xsd", "siteindex.xsd"):
        (mine / name).write_bytes((rules.SCHEMAS / name).read_bytes())
    with pytest.raises(CommandError) as refused:
        run("--base", base, "--schemas", str(mine))
    assert str(refused.value) == f"--schemas: {mine} lacks sitemap.xsd."
    # A sitemap schema that wants a priority in every entry: resync writes none.
    strict = (rules.SCHEMAS / "sitemap.xsd").read_text().replace(
        '<xsd:element name="priority" type="tPriority" minOccurs="0"/>', '<xsd:element name="priority" type="tPriority"/>'
    )
    assert strict != (rules.SCHEMAS / "sitemap.xsd").read_text()
    (mine / "sitemap.xsd").write_text(strict)
    code, lines = run("--base", base, "--schemas", str(mine))
    assert code == 1 and all("the schema refuses it" in line for line in problems(lines)), lines
    assert run("--base", base)[0] == 0


def test_the_schemas_the_app_ships_refuse_an_invalid_document_and_accept_a_valid_one():
    resource_list = (
        b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">'
        b'<rs:ln rel="up" href="http://example.org/capabilitylist.xml"/>'
        b'<rs:md capability="resourcelist" at="2024-05-01T12:00:00Z"/>'
        b'<url><loc>http://example.org/a</loc><lastmod>2024-04-30T08:00:00Z</lastmod>'
        b'<rs:md hash="md5:0cc175b9c0f1b6a831c399e269772661" length="1" type="text/plain"/></url>'
        b"</urlset>"
    )
    assert rules.schema_problems(rules.read(resource_list), rules.SCHEMAS) == []
    for wrong in (
        resource_list.replace(b' length="1"', b' size="1"'),  # an attribute rs:md does not have
        resource_list.replace(b'at="2024-05-01T12:00:00Z"', b'at="yesterday"'),  # no dateTime
        resource_list.replace(b"<rs:ln ", b"<rs:link "),  # no such element
    ):
        found = rules.schema_problems(rules.read(wrong), rules.SCHEMAS)
        assert found and all(p.startswith("the schema refuses it: ") for p in found), wrong
    index = (
        b'<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">'
        b'<rs:md capability="resourcelist" at="2024-05-01T12:00:00Z"/>'
        b"<sitemap><loc>http://example.org/resourcelist-1.xml</loc></sitemap>"
        b"</sitemapindex>"
    )
    assert rules.schema_problems(rules.read(index), rules.SCHEMAS) == []
    found = rules.schema_problems(rules.read(index.replace(b"<sitemap>", b"<url>").replace(b"</sitemap>", b"</url>")),
                                  rules.SCHEMAS)
    assert found and "url" in found[0]


def test_changes_since_a_resource_list_are_read_with_any_w3c_datetime():
    """Another Source may date with a day alone or no offset (UTC), and list its changes in
    any order: the latest of each resource after the Resource List's ``at`` counts."""
    from django_resourcesync.audit import _since

    changed = {
        "http://example.org/a": {"change": "updated", "datetime": "2024-01-02"},
        "http://example.org/b": {"change": "updated", "datetime": "2023-12-31T10:00:00"},
        "http://example.org/c": {"change": "deleted", "datetime": "2024-01-01T00:00:01+01:00"},
    }
    assert set(_since(changed, "2024-01-01T00:00:00Z")) == {"http://example.org/a"}
    assert set(_since(changed, None)) == set(changed)


def test_a_resource_dump_that_leaves_out_a_listed_resource_is_reported(source):
    """Section 9: a resource in the Resource List must be in a Resource Dump. A dump whose
    package was withdrawn without being packed again (as this app once did) no longer is."""
    from django.utils import timezone

    from django_resourcesync.builders import resourcedump

    bitstreams = source["bitstreams"]
    build = Build.objects.get(resource_set=bitstreams, capability="resourcedump", status=Build.Status.PUBLISHED)
    Document.objects.filter(build=build, name__endswith=".zip").update(withdrawn=timezone.now())
    resourcedump.rewrite_dump(build)
    code, lines = run("--set", "bitstreams", "--all")
    listed = Resource.objects.filter(resource_set=bitstreams).count()
    found = problems(lines)
    assert code == 1 and len(found) == listed == 8, found  # up to ten are named, each
    assert all("in no package of the Resource Dump (section 9)" in line for line in found)


def test_a_manifest_copy_that_is_not_the_packed_manifest_is_reported(source):
    manifest = Document.objects.get(resource_set=source["metadata"], name__endswith="-manifest.xml",
                                    build__status=Build.Status.PUBLISHED)
    with storage.get_storage().open(manifest.storage_name, "rb") as stored:
        body = stored.read()
    storage.get_storage().delete(manifest.storage_name)
    storage.get_storage().save(manifest.storage_name, io.BytesIO(body.replace(b"?>\n", b"?>\n<!-- edited -->\n", 1)))
    code, lines = run("--set", "metadata", "--all")
    (found,) = problems(lines)
    assert code == 1 and "not the manifest.xml packed in" in found and "section 13.1" in found
