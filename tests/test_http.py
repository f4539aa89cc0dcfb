"""HTTP as a hostile or hurried client speaks it: odd request headers never make a 500, and a
date validator never hides a change."""

import datetime

import pytest
from django.utils import timezone
from django.utils.http import http_date

from django_resourcesync import tracking
from django_resourcesync.models import Document
from example_project.repository.models import Item

from .helpers import build, fetch
from .xmlcheck import SM, check_document, entries

pytestmark = pytest.mark.django_db

STORED = "/resourcesync/bitstreams/resourcelist.xml"
LIVE_CHANGELIST = "/resourcesync/bitstreams/changelist.xml"
SOURCE_DESCRIPTION = "/.well-known/resourcesync"
HUGE = "9" * 5000  # past Python's 4300-digit limit for int()


@pytest.fixture
def published(seed, bitstreams):
    """A built Resource List (a stored file), an open Change List and a Source Description."""
    seed(2)
    build(bitstreams)
    _, whole, response = fetch(STORED)
    return whole, response["ETag"]


@pytest.mark.parametrize(
    "value, expected",
    [
        (f"bytes=0-{HUGE}", "all"),  # a last byte past the end means "to the end" (RFC 9110, 14.1.2)
        (f"bytes={HUGE}-", 416),
        (f"bytes={HUGE}-{HUGE}", 416),
        (f"bytes={'9' * 19}-", 416),
        (f"bytes=-{HUGE}", "all"),  # a suffix longer than the file is the whole file
        (f"bytes={'0' * 5000}5-9", (5, 9)),
        ("bytes=-0", 416),
        ("bytes=5-3", 200),
        ("bytes=0-1,3-4", 200),
        ("bytes=-", 200),
        ("bytes=abc", 200),
        ("pages=0-9", 200),
        ("bytes=\xe9\xff-\xb2", 200),
        ("bytes=\u0661-\u0669", 200),  # Arabic-Indic digits are not digits here
        ("bytes=0-9 ", (0, 9)),
    ],
)
def test_hostile_range_on_a_stored_document_is_ignored_or_unsatisfiable_never_a_500(published, value, expected):
    whole, _etag = published
    status, body, response = fetch(STORED, Range=value)
    if expected == 200:
        assert status == 200 and body == whole and "Content-Range" not in response
    elif expected == 416:
        assert status == 416 and response["Content-Range"] == f"bytes */{len(whole)}"
    else:
        start, end = (0, len(whole) - 1) if expected == "all" else expected
        assert status == 206 and body == whole[start : end + 1]
        assert response["Content-Range"] == f"bytes {start}-{end}/{len(whole)}"


ODD_HEADERS = [
    {"Range": f"bytes=0-{HUGE}"},
    {"Range": f"bytes=-{HUGE}"},
    {"Range": f"bytes={HUGE}-{HUGE}"},
    {"Range": "bytes=\xe9-"},
    {"Range": "bytes=0-9", "If-Range": "garbage"},
    {"Range": "bytes=0-9", "If-Range": "Sun, 06 Nov 1994 08:49:37 GMT"},
    {"Range": "bytes=0-9", "If-Range": 'W/"x"'},
    {"Range": "bytes=0-9", "If-Range": HUGE},
    {"If-Range": "\xe9\xff"},
    *(
        {name: value}
        for name in ("If-Modified-Since", "If-Unmodified-Since")
        for value in ("garbage", HUGE, f"Sun, 06 Nov {HUGE} 08:49:37 GMT", "Sun, 31 Feb 2026 99:99:99 GMT", "\xe9\xff", "")
    ),
    *(
        {name: value}
        for name in ("If-None-Match", "If-Match")
        for value in ("garbage", HUGE, f'"{HUGE}"', 'W/"', ",,,", '"a", *, "b', "\xe9\xff", "*")
    ),
]


@pytest.mark.parametrize("path", [STORED, LIVE_CHANGELIST, SOURCE_DESCRIPTION])
@pytest.mark.parametrize("headers", ODD_HEADERS, ids=lambda headers: repr(headers)[:60])
def test_odd_request_headers_never_make_a_server_error(published, path, headers):
    status, _body, _ = fetch(path, **headers)
    assert status in (200, 206, 304, 412, 416)


def test_a_range_is_served_only_while_if_range_names_the_current_etag(published):
    whole, etag = published
    assert fetch(STORED, Range="bytes=0-9", **{"If-Range": etag})[:2] == (206, whole[:10])
    assert fetch(STORED, Range="bytes=0-9", **{"If-Range": f"W/{etag}"})[:2] == (200, whole)


@pytest.fixture
def clock(monkeypatch):
    """``clock(seconds)`` pins ``timezone.now()`` that many seconds past a whole second."""
    base = timezone.now().replace(microsecond=0) + datetime.timedelta(seconds=10)

    def pin(seconds):
        moment = base + datetime.timedelta(seconds=seconds)
        monkeypatch.setattr(timezone, "now", lambda: moment)
        return moment

    return pin


def retitle(item, title):
    item.title = title
    item.save()
    tracking.process_pending()


def locs(body):
    return [e.find(f"{{{SM}}}loc").text for e in entries(check_document(body, "changelist"))]


def test_a_second_change_within_the_same_second_is_not_hidden_by_if_modified_since(seed, metadata, clock):
    seed(2)
    build(metadata)
    path = "/resourcesync/metadata/changelist.xml"
    first, second = Item.objects.order_by("pk")[:2]
    first_change = clock(0.1)
    retitle(first, "Changed once")
    clock(0.2)
    status, body, first_response = fetch(path)
    assert status == 200 and len(locs(body)) == 1
    since = http_date(int(first_change.timestamp()))  # what Last-Modified said before the fix
    clock(0.3)
    retitle(second, "Changed in the same second")
    clock(0.4)
    status, body, _ = fetch(path, **{"If-Modified-Since": since})
    assert status == 200 and len(locs(body)) == 2
    assert locs(body)[1].endswith(f"/items/{second.pk}/metadata.xml")
    # The first copy was made before its Last-Modified's second was over: it has none to send back.
    assert "Last-Modified" not in first_response


def test_if_modified_since_still_answers_304_once_the_second_is_over(seed, metadata, clock):
    seed(2)
    build(metadata)
    path = "/resourcesync/metadata/changelist.xml"
    changed = clock(0.5)
    retitle(Item.objects.order_by("pk")[0], "Changed")
    clock(1.2)
    status, _, response = fetch(path)
    assert status == 200 and response["Last-Modified"] == http_date(int(changed.timestamp()))
    assert fetch(path, **{"If-Modified-Since": response["Last-Modified"]})[0] == 304
    assert fetch(path, **{"If-Modified-Since": http_date(int(changed.timestamp()) - 1)})[0] == 200
    clock(60)
    assert fetch(path, **{"If-Modified-Since": response["Last-Modified"]})[0] == 304


@pytest.mark.parametrize("path", [SOURCE_DESCRIPTION, "/resourcesync/metadata/capabilitylist.xml"])
def test_live_documents_have_no_last_modified_until_their_second_is_over(seed, metadata, clock, path):
    seed(1)
    changed = clock(0.5)
    build(metadata)
    clock(0.9)
    _, _, response = fetch(path)
    assert "Last-Modified" not in response
    assert fetch(path, **{"If-Modified-Since": http_date(int(changed.timestamp()))})[0] == 200
    clock(1.0)
    _, _, response = fetch(path)
    assert response["Last-Modified"] == http_date(int(changed.timestamp()))
    assert fetch(path, **{"If-Modified-Since": response["Last-Modified"]})[0] == 304


def test_a_stored_document_keeps_its_last_modified_within_its_second(seed, bitstreams, monkeypatch):
    seed(1)
    build(bitstreams)
    written = Document.objects.get(resource_set=bitstreams, name="resourcelist.xml").written
    monkeypatch.setattr(timezone, "now", lambda: written)
    _, _, response = fetch(STORED)
    assert response["Last-Modified"] == http_date(int(written.timestamp()))
    assert fetch(STORED, **{"If-Modified-Since": response["Last-Modified"]})[0] == 304
