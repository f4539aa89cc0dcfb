"""The writer and the publishing API never produce an invalid document, whatever the input."""

import datetime
import io
import os

import pytest
from hypothesis import example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from django_resourcesync import sources
from django_resourcesync.sources import (
    AlreadyRegistered,
    ResourceSource,
    UnpublishableResource,
    absolute_uri,
    clean_link,
    normalise_media_type,
)
from django_resourcesync.xml.writer import DocumentWriter, url_element, w3c_datetime

from .xmlcheck import SM, check_document, entries, md

UTC = datetime.timezone.utc


def write(entry_texts, **md_values):
    writer = DocumentWriter()
    for text in entry_texts:
        writer.add(text)
    out = io.BytesIO()
    writer.finish(out, md={"capability": "resourcelist", "at": "2026-01-01T00:00:00Z", **md_values}, links=[{"rel": "up", "href": "http://testserver/cl.xml"}])
    assert writer.size == len(out.getvalue())
    return out.getvalue()


@hsettings(max_examples=200, deadline=None)
@given(path=st.text(max_size=60), link_href=st.text(max_size=40), encoding=st.text(max_size=20))
@example(path="%zz[]{}|\\^`\x00\ud800", link_href="#a#b?c?d", encoding="\x01<&>\"")
def test_any_text_gives_a_valid_document(path, link_href, encoding):
    try:
        uri = absolute_uri("/x/" + path)
    except UnpublishableResource:
        return
    links = [link for link in [clean_link({"rel": "alternate", "href": "/y/" + link_href, "encoding": encoding})] if link]
    body = write([url_element(uri, lastmod=datetime.datetime(2026, 1, 2, tzinfo=UTC), md={"length": 3}, links=links)])
    (entry,) = entries(check_document(body, "resourcelist"))
    assert entry.find(f"{{{SM}}}loc").text == uri


def test_w3c_datetimes_are_utc_with_z():
    cet = datetime.timezone(datetime.timedelta(hours=1))
    assert w3c_datetime(datetime.datetime(2026, 1, 1, 1, 0, tzinfo=cet)) == "2026-01-01T00:00:00Z"
    assert w3c_datetime(datetime.datetime(2026, 1, 1, 0, 0, 0, 5000, tzinfo=UTC)) == "2026-01-01T00:00:00.005000Z"
    with pytest.raises(ValueError):
        w3c_datetime(datetime.datetime(2026, 1, 1))


@pytest.mark.parametrize(
    "location, expected",
    [
        ("/a b/ü", "http://testserver/a%20b/%C3%BC"),
        ("relative", "http://testserver/relative"),
        ("https://other.example/x?q=1&r=2", "https://other.example/x?q=1&r=2"),
        ("/ctl\x01\x7f", "http://testserver/ctl%01%7F"),
        ("/already%20encoded", "http://testserver/already%20encoded"),
        ("/stray%zz%", "http://testserver/stray%25zz%25"),
        ("/a[b]{c}|d", "http://testserver/a%5Bb%5D%7Bc%7D%7Cd"),
        ("http://bücher.example/ü?ä=1#ö", "http://xn--bcher-kva.example/%C3%BC?%C3%A4=1#%C3%B6"),
    ],
)
def test_absolute_uri(location, expected):
    assert absolute_uri(location) == expected


def test_overlong_uri_is_refused():
    with pytest.raises(UnpublishableResource):
        absolute_uri("/" + "x" * 3000)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("text/html; charset=utf-8", "text/html"),
        ("Application/PDF", "application/pdf"),
        ("image/svg+xml", "image/svg+xml"),
        ("application/vnd.ms-excel", None),
        ("nonsense", None),
        ("", None),
        (None, None),
    ],
)
def test_media_types_the_schema_can_carry(value, expected):
    assert normalise_media_type(value) == expected


def test_links_keep_only_valid_attributes():
    link = clean_link({
        "rel": "duplicate", "href": "/mirror/a", "pri": 0, "length": "12", "type": "text/plain",
        "modified": datetime.datetime(2026, 1, 1, tzinfo=UTC), "bogus": 1
    })
    assert link == {
        "rel": "duplicate", "href": "http://testserver/mirror/a", "length": 12, "type": "text/plain",
        "modified": "2026-01-01T00:00:00Z"
    }
    assert clean_link({"rel": "Not A Rel", "href": "/x"}) is None
    assert clean_link({"rel": "http://www.openarchives.org/rs/terms/patch", "href": "/x"})["rel"].startswith("http://")
    assert clean_link({"rel": "alternate"}) is None
    body = write([url_element("http://testserver/a", links=[link])])
    check_document(body, "resourcelist")


def test_double_registration_is_an_error():
    registry = sources.SourceRegistry()

    class One(ResourceSource):
        name = "one"

    registry.register(One)
    with pytest.raises(AlreadyRegistered):
        registry.register(One)
    with pytest.raises(sources.NotRegistered):
        registry.get("two")


def test_sitemap_hooks_may_be_attributes_or_methods():
    class Thing:
        pk = 1

        def get_absolute_url(self):
            return "/things/1"

    class AttributeSource(ResourceSource):
        changefreq = "daily"
        media_type = "text/plain"

        def content(self, obj):
            return "héllo"

    entry = AttributeSource().entry(Thing())
    assert (entry.uri, entry.changefreq, entry.media_type, entry.length) == (
        "http://testserver/things/1", "daily", "text/plain", 6
    )
    body = write([url_element(entry.uri, changefreq=entry.changefreq, md={"length": entry.length, "type": entry.media_type})])
    assert md(entries(check_document(body, "resourcelist"))[0])["type"] == "text/plain"


def test_a_missing_file_cannot_be_published(tmp_path):
    from django.core.files.storage import FileSystemStorage
    from django.db.models.fields.files import FieldFile, FileField

    class Thing:
        pk = 1

        def get_absolute_url(self):
            return "/things/1"

    field = FileField(storage=FileSystemStorage(location=str(tmp_path)))
    field.name = "file"

    class FileSource(ResourceSource):
        def file(self, obj):
            return FieldFile(obj, field, "missing.pdf")

    with pytest.raises(UnpublishableResource, match="missing.pdf"):
        FileSource().entry(Thing())

    class NoBytesSource(ResourceSource):
        pass

    entry = NoBytesSource().entry(Thing())
    assert (entry.uri, entry.md5, entry.length) == ("http://testserver/things/1", "", None)


def test_prefetching_many_files_fails_on_nothing_and_leaves_no_file_open(tmp_path, monkeypatch):
    # Asking the operating system for a batch's files ahead (several at a time) must not fail
    # the batch whatever its objects are: a missing file, a source that raises, a file on disk.
    from django.core.files.storage import FileSystemStorage
    from django.db.models.fields.files import FieldFile, FileField

    field = FileField(storage=FileSystemStorage(location=str(tmp_path)))
    field.name = "file"
    for number in range(0, 200, 2):
        (tmp_path / f"{number}.txt").write_bytes(b"x" * number)

    class Thing:
        def __init__(self, pk):
            self.pk = pk

    class FileSource(ResourceSource):
        def file(self, obj):
            if obj.pk == 7:
                raise ValueError("a file the site cannot name")
            return FieldFile(obj, field, f"{obj.pk}.txt")  # odd numbers: missing

    things = [Thing(pk) for pk in range(200)]
    before = len(os.listdir("/proc/self/fd"))
    FileSource().prefetch(things)
    assert len(os.listdir("/proc/self/fd")) == before
    assert FileSource().representation(things[4]).length == 4

    # Files found in memory are asked for one after the other, in this thread; once they take
    # the disk's time, the rest in threads. Either way every file is asked for once.
    import threading
    import time

    from django_resourcesync import sources

    def advising(delay):
        asked = []

        def advise(path):
            asked.append((path, threading.current_thread().name))
            time.sleep(delay)
            real(path)

        monkeypatch.setattr(sources, "_advise", advise)
        FileSource().prefetch([thing for thing in things if thing.pk != 7])
        assert sorted(path for path, _thread in asked) == expected
        return {thread.startswith("resourcesync-prefetch") for _path, thread in asked}

    real = sources._advise
    monkeypatch.setattr(sources, "PREFETCH_SLOW_SECONDS", 0.001)  # a busy machine's pauses are not a disk
    expected = sorted(str(tmp_path / f"{pk}.txt") for pk in range(200) if pk != 7)
    assert advising(0) == {False}, "warm: no thread"
    assert advising(0.003) == {False, True}, "the first few alone, then the rest in threads"
