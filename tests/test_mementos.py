"""Prior versions (core 1.1 section 14.6, Memento): each change links its memento, which serves
the exact bytes of that version; the TimeMap lists them; the TimeGate picks one by datetime."""

import email.utils
import hashlib
import re
import time

import pytest
from django.core.files.base import ContentFile

from django_resourcesync.rebuild import rebuild_set
from example_project.repository.models import Item, ItemFile

from .conftest import demo_set, publish_versions
from .helpers import fetch, path_of, resource_list_entries
from .xmlcheck import SM, check_document, entries, link, links, md

VERSIONS = [b"the first version\n" * 100, b"the second version, longer\n" * 300]


@pytest.fixture
def rewritten(seed, committing, documents_storage):
    """The files' set publishing prior versions; one file rewritten twice, a second apart."""
    resource_set = publish_versions(seed, committing, 2)
    upload = ItemFile.objects.filter(item__is_public=True).order_by("pk").first()
    for number, content in enumerate(VERSIONS):
        if number:
            time.sleep(1.1)  # HTTP dates count whole seconds
        with committing():
            upload.file.save(f"version-{number}.txt", ContentFile(content))
    return resource_set, upload


def change_entries(resource_set, uri):
    status, body, _ = fetch(f"/resourcesync/{resource_set.slug}/changelist.xml")
    assert status == 200
    return [e for e in entries(check_document(body, "changelist")) if e.find(f"{{{SM}}}loc").text == uri]


def test_each_change_links_a_memento_serving_the_exact_bytes_of_its_version(rewritten):
    resource_set, upload = rewritten
    uri = resource_set.resources.get(object_pk=str(upload.pk)).uri
    found = change_entries(resource_set, uri)
    assert [md(e)["change"] for e in found] == ["updated", "updated"]
    for entry, content in zip(found, VERSIONS, strict=True):
        meta = md(entry)
        [memento] = [ln for ln in links(entry) if ln["rel"] == "memento"]
        # Example 29: the version's hash, length and type are those of the entry.
        assert (memento["hash"], memento["length"], memento["type"]) == (meta["hash"], meta["length"], meta["type"])
        assert memento["modified"]
        assert link(entry, "timegate") and link(entry, "timemap")
        status, body, response = fetch(path_of(memento["href"]))
        assert status == 200 and body == content
        assert response["Content-Type"] == meta["type"]
        assert response["ETag"] == f'"{hashlib.sha256(content).hexdigest()}"'
        assert "immutable" in response["Cache-Control"]
        assert response["X-Content-Type-Options"] == "nosniff" and response["Content-Security-Policy"] == "sandbox"
        assert response["Memento-Datetime"]
        assert f'<{uri}>; rel="original"' in response["Link"]
        # Immutable: a conditional GET is answered 304 without the bytes.
        again = fetch(path_of(memento["href"]), **{"If-None-Match": response["ETag"]})
        assert again[0] == 304
    # The current file is the second version; the first is still served from the store.
    assert upload.file.read() == VERSIONS[1]


def test_the_timemap_lists_the_mementos_and_the_timegate_redirects_to_the_one_of_a_datetime(rewritten):
    resource_set, upload = rewritten
    uri = resource_set.resources.get(object_pk=str(upload.pk)).uri
    found = change_entries(resource_set, uri)
    hrefs = [next(ln["href"] for ln in links(e) if ln["rel"] == "memento") for e in found]
    status, body, response = fetch(path_of(link(found[0], "timemap")))
    assert status == 200 and response["Content-Type"] == "application/link-format"
    text = body.decode()
    assert f'<{uri}>;rel="original"' in text
    assert f'<{hrefs[0]}>;rel="first memento"' in text and f'<{hrefs[1]}>;rel="last memento"' in text
    dates = [fetch(path_of(href))[2]["Memento-Datetime"] for href in hrefs]
    assert dates[0] != dates[1]

    timegate = path_of(link(found[0], "timegate"))
    first, second = (email.utils.parsedate_to_datetime(date) for date in dates)
    for wanted, expected in ((first, 0), (second, 1), (first.replace(year=first.year - 1), 0), (None, 1)):
        headers = {} if wanted is None else {"Accept-Datetime": email.utils.format_datetime(wanted, usegmt=True)}
        status, _body, response = fetch(timegate, **headers)
        assert status == 302 and response["Location"] == hrefs[expected], (wanted, response["Location"])
        assert response["Vary"] == "accept-datetime"
    assert fetch(timegate, **{"Accept-Datetime": "yesterday at noon"})[0] == 400


def test_resource_list_entries_link_their_timegate_and_timemap(rewritten):
    resource_set, upload = rewritten
    rebuild_set(resource_set)
    listed = resource_list_entries(resource_set)
    assert listed and all(link(e, "timegate") and link(e, "timemap") for e in listed)
    # Every one of them answers, for the resources changed since the log started or not.
    for entry in listed:
        assert fetch(path_of(link(entry, "timemap")))[0] == 200, link(entry, "timemap")
        assert fetch(path_of(link(entry, "timegate")))[0] == 302, link(entry, "timegate")


def timemap_links(body):
    """``[(uri, rel)]`` of an application/link-format TimeMap, in order."""
    return re.findall(r'<([^>]*)>;rel="([^"]*)"', body.decode())


def test_a_resource_listed_but_not_changed_has_a_timemap_and_timegate_from_its_first_listing(
    seed, committing, documents_storage
):
    resource_set = publish_versions(seed, committing, 2)
    [entry, *_] = resource_list_entries(resource_set)
    uri = entry.find(f"{{{SM}}}loc").text
    timemap, timegate = path_of(link(entry, "timemap")), path_of(link(entry, "timegate"))

    # RFC 7089 section 5: the original resource, the TimeMap itself and the TimeGate; no
    # memento yet, so no "from" and "until" either.
    status, body, response = fetch(timemap)
    assert status == 200 and response["Content-Type"] == "application/link-format"
    assert timemap_links(body) == [(uri, "original"), (link(entry, "timemap"), "self"), (link(entry, "timegate"), "timegate")]
    assert "from=" not in body.decode() and "until=" not in body.decode()

    # The TimeGate answers for any datetime with the only state there is: the current one.
    for headers in ({}, {"Accept-Datetime": "Tue, 20 Jun 2023 18:02:59 GMT"}):
        status, _body, response = fetch(timegate, **headers)
        assert status == 302 and response["Location"] == uri
        assert response["Vary"] == "accept-datetime"
        assert f'<{uri}>; rel="original"' in response["Link"] and f'<{link(entry, "timemap")}>; rel="timemap"' in response["Link"]
        assert fetch(path_of(response["Location"]))[0] == 200
    assert fetch(timegate, **{"Accept-Datetime": "yesterday at noon"})[0] == 400

    # Its first change is its first memento, the current state's: the TimeMap lists it, and the
    # TimeGate sends there.
    upload = ItemFile.objects.get(pk=resource_set.resources.get(uri=uri).object_pk)
    with committing():
        upload.file.save("changed.txt", ContentFile(b"its first change"))
    [changed] = change_entries(resource_set, uri)
    memento = next(ln["href"] for ln in links(changed) if ln["rel"] == "memento")
    assert (memento, "first last memento") in timemap_links(fetch(timemap)[1])
    status, _body, response = fetch(timegate)
    assert status == 302 and response["Location"] == memento
    assert fetch(path_of(memento))[:2] == (200, b"its first change")


def test_no_timemap_or_timegate_for_what_the_set_does_not_list(seed, committing, documents_storage):
    from django_resourcesync import tracking

    resource_set = publish_versions(seed, committing, 2)
    [entry, *_] = resource_list_entries(resource_set)
    record = resource_set.resources.get(uri=entry.find(f"{{{SM}}}loc").text)
    item = ItemFile.objects.get(pk=record.object_pk).item_id
    with committing():  # made private, never changed before
        Item.objects.filter(pk=item).update(is_public=False)
        tracking.changed(Item.objects.filter(pk=item))
    assert not resource_set.resources.filter(object_pk=record.object_pk).exists()
    for path in (path_of(link(entry, "timemap")), path_of(link(entry, "timegate"))):
        assert fetch(path)[0] == 404, path
    for key in ("999999", "no such key"):  # never listed
        assert fetch(f"/resourcesync/{resource_set.slug}/timemap/{key}")[0] == 404
        assert fetch(f"/resourcesync/{resource_set.slug}/timegate/{key}")[0] == 404


def test_a_resource_made_private_has_no_memento_timemap_or_timegate_any_more(rewritten, committing):
    resource_set, upload = rewritten
    uri = resource_set.resources.get(object_pk=str(upload.pk)).uri
    [entry, _] = change_entries(resource_set, uri)
    memento = path_of(next(ln["href"] for ln in links(entry) if ln["rel"] == "memento"))
    assert fetch(memento)[0] == 200
    with committing():
        Item.objects.filter(pk=upload.item_id).update(is_public=False)
        from django_resourcesync import tracking

        tracking.changed(Item.objects.filter(pk=upload.item_id))
    for path in (memento, path_of(link(entry, "timemap")), path_of(link(entry, "timegate"))):
        assert fetch(path)[0] == 404, path


def test_a_set_that_does_not_publish_prior_versions_links_none(seed, committing, documents_storage):
    resource_set = demo_set("bitstreams")
    with committing():
        seed(1)
    rebuild_set(resource_set)
    upload = ItemFile.objects.order_by("pk").first()
    with committing():
        upload.file.save("again.txt", ContentFile(b"again"))
    [entry] = change_entries(resource_set, resource_set.resources.get(object_pk=str(upload.pk)).uri)
    assert link(entry, "memento") is None and link(entry, "timemap") is None
    assert fetch(f"/resourcesync/{resource_set.slug}/timemap/{upload.pk}")[0] == 404


def test_a_set_asked_for_prior_versions_it_cannot_publish_is_a_warning_with_a_hint(db, settings):
    from django_resourcesync.checks import check_sets

    resource_set = demo_set("bitstreams")
    resource_set.prior_versions = True
    resource_set.save()
    assert not [e for e in check_sets(databases=["default"]) if e.id == "resourcesync.W009"]
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "KEEP_VERSIONS": False}
    [warning] = [e for e in check_sets(databases=["default"]) if e.id == "resourcesync.W009"]
    assert "KEEP_VERSIONS" in warning.msg and warning.hint


def test_the_admin_says_what_the_version_store_holds_for_the_set(rewritten, admin_client):
    resource_set, _upload = rewritten
    page = admin_client.get(f"/admin/resourcesync/resourceset/{resource_set.pk}/change/").content.decode()
    assert "Version store: 2 versions" in page and "of 2 changes." in page


def test_mementos_from_before_a_resource_left_the_set_are_not_those_of_it_back(seed, committing, documents_storage):
    from django_resourcesync import tracking

    resource_set = publish_versions(seed, committing, 2)
    subject, other = list(ItemFile.objects.order_by("pk")[:2])
    for upload in (subject, other):  # the same bytes: kept while the other file is listed
        with committing():
            upload.file.save("shared.txt", ContentFile(b"bytes both files had"))
    uri = resource_set.resources.get(object_pk=str(subject.pk)).uri
    [before] = change_entries(resource_set, uri)
    old = path_of(next(ln["href"] for ln in links(before) if ln["rel"] == "memento"))
    assert fetch(old)[0] == 200
    for public in (False, True):  # it leaves the set, then comes back (the same key)
        with committing():
            Item.objects.filter(pk=subject.item_id).update(is_public=public)
            tracking.changed(Item.objects.filter(pk=subject.item_id))
    assert resource_set.resources.filter(object_pk=str(subject.pk)).exists()
    assert fetch(old)[0] == 404  # a memento of the resource before it left
    status, body, _ = fetch(path_of(link(before, "timemap")))
    assert old.split("/memento/")[1] not in body.decode()


def test_bytes_shared_by_two_resources_are_forgotten_once_neither_is_listed(seed, committing, documents_storage):
    from django_resourcesync import tracking
    from django_resourcesync.models import Version

    publish_versions(seed, committing, 2)
    uploads = list(ItemFile.objects.order_by("pk")[:2])
    assert uploads[0].item_id != uploads[1].item_id
    for upload in uploads:
        with committing():
            upload.file.save("same.txt", ContentFile(b"the same bytes in two files"))
    digest = hashlib.sha256(b"the same bytes in two files").hexdigest()
    assert Version.objects.filter(sha256=digest).exists()
    for upload in uploads:  # one item after the other leaves the set
        with committing():
            Item.objects.filter(pk=upload.item_id).update(is_public=False)
            tracking.changed(Item.objects.filter(pk=upload.item_id))
        assert Version.objects.filter(sha256=digest).exists() == (upload is uploads[0])


def test_bytes_a_leaving_resource_had_stay_kept_for_another_saved_with_them_in_the_same_round(
    seed, committing, documents_storage
):
    from django_resourcesync import tracking

    resource_set = publish_versions(seed, committing, 2)
    leaving, staying = list(ItemFile.objects.order_by("pk")[:2])
    with committing():
        leaving.file.save("x.txt", ContentFile(b"bytes X"))
    with committing():  # one transaction: one processing round for both
        Item.objects.filter(pk=leaving.item_id).update(is_public=False)
        tracking.changed(Item.objects.filter(pk=leaving.item_id))
        staying.file.save("also-x.txt", ContentFile(b"bytes X"))
    [entry] = change_entries(resource_set, resource_set.resources.get(object_pk=str(staying.pk)).uri)
    memento = path_of(next(ln["href"] for ln in links(entry) if ln["rel"] == "memento"))
    assert fetch(memento)[:2] == (200, b"bytes X")


@pytest.mark.parametrize("key", ["1", "a b", "ü/x", "k;y=1", "50%", "a?b#c"])
def test_the_links_of_many_resources_are_those_url_reversal_gives(db, key):
    from django.urls import reverse

    from django_resourcesync import mementos

    resource_set = demo_set("bitstreams")
    links = mementos.resource_links_for(resource_set)(key)
    for link_, name in zip(links, ("timegate", "timemap"), strict=True):
        assert link_["href"] == "http://testserver" + reverse(f"resourcesync:{name}", kwargs={"slug": "bitstreams", "key": key})
