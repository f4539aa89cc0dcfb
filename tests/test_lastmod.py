"""A Resource List's ``<lastmod>`` and the Change List agree: a resource's listed ``lastmod``
moves only with an ``updated`` (or ``created``) change that carries it, so a Destination that
follows the Change List ends with the Resource List's state, and the reference client's audit
says IN SYNC after a save that changed nothing a Destination fetches, and a rebuild."""

import datetime
import logging
from contextlib import nullcontext

import pytest
from django.db import transaction
from resync.client import Client

from django_resourcesync import tracking
from django_resourcesync.models import ChangeEvent, Resource
from django_resourcesync.tracking import outbox
from example_project.repository.models import Item, ItemFile

from .conftest import demo_set
from .helpers import build, resource_list_entries
from .xmlcheck import SM, md

#: When the seeded objects were last modified, far from the time of the test's saves (the
#: reference client takes two times within a second of each other for the same).
LONG_AGO = datetime.datetime(2020, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)


def published(seed, committing=nullcontext, items=3):
    """The example's files and records, with Resource and Change Lists, ``items`` items last
    modified ``LONG_AGO``, published once. ``committing``: as the fixture, where transactions
    do not commit."""
    sets = []
    for slug in ("bitstreams", "metadata"):
        resource_set = demo_set(slug)
        resource_set.capabilities = ["resourcelist", "changelist"]
        resource_set.save()
        sets.append(resource_set)
    with committing():
        seed(items)
    outbox.dispatcher.flush()
    with tracking.paused():
        Item.objects.update(modified=LONG_AGO)
        ItemFile.objects.update(modified=LONG_AGO)
    for resource_set in sets:
        build(resource_set)
    return sets


def listed(resource_set):
    """``{uri: lastmod}`` of the set's Resource List, as served."""
    return {entry.findtext(f"{{{SM}}}loc"): entry.findtext(f"{{{SM}}}lastmod") for entry in resource_list_entries(resource_set)}


def replayed(before, resource_set):
    """``{uri: lastmod}``: the Resource List ``before`` with the set's change events since
    applied, as a Destination that follows the Change List has it."""
    state = dict(before)
    for event in ChangeEvent.objects.filter(resource_set=resource_set).order_by("id"):
        if event.change == "deleted":
            state.pop(event.uri, None)
        else:
            state[event.uri] = event.lastmod.isoformat().replace("+00:00", "Z") if event.lastmod else None
    return state


@pytest.mark.django_db
def test_a_save_that_changes_nothing_published_keeps_the_listed_lastmod(seed, committing):
    bitstreams, metadata = published(seed, committing)
    before = {resource_set: listed(resource_set) for resource_set in (bitstreams, metadata)}
    assert all(lastmod.startswith("2020-01-02T03:04:05") for lists in before.values() for lastmod in lists.values())
    item = Item.objects.order_by("pk").first()
    f = ItemFile.objects.order_by("pk").first()
    with committing():
        item.save()  # auto_now: "modified" moves, the record shows none of it
        f.save()  # the same file, the same type: only "modified" moves
    assert item.modified > LONG_AGO and f.modified > LONG_AGO
    # And one behind the app's back, which the rebuild's reconcile finds.
    last = ItemFile.objects.order_by("pk").last()
    ItemFile.objects.filter(pk=last.pk).update(modified=f.modified)
    assert not ChangeEvent.objects.filter(resource_set__in=[bitstreams, metadata]).exists()
    for resource_set in (bitstreams, metadata):
        build(resource_set)
        assert listed(resource_set) == before[resource_set], "no change published: the same lastmod"
    assert not ChangeEvent.objects.filter(resource_set__in=[bitstreams, metadata]).exists()
    # The record keeps the fingerprint of the saves: the next reconcile, either way it compares,
    # finds nothing to describe again.
    for in_database in (True, False):
        counts = tracking.reconcile(bitstreams, in_database=in_database)
        assert (counts.updated, counts.unchanged) == (0, bitstreams.resources.count())


@pytest.mark.django_db
def test_every_lastmod_the_resource_list_moves_comes_with_a_change_that_carries_it(seed, committing):
    bitstreams, metadata = published(seed, committing)
    before = {resource_set: listed(resource_set) for resource_set in (bitstreams, metadata)}
    first, second = Item.objects.order_by("pk")[:2]
    f = ItemFile.objects.filter(item=second).order_by("pk").first()
    with committing():
        first.save()  # nothing the record shows
        second.title = "A new title"  # the record's bytes change
        second.save()
        f.media_type = "text/csv"  # how the bytes are served changes
        f.save()
    assert list(ChangeEvent.objects.filter(resource_set=metadata).values_list("uri", "change")) == [
        (f"http://testserver{second.get_metadata_url()}", "updated")
    ]
    assert list(ChangeEvent.objects.filter(resource_set=bitstreams).values_list("uri", "change")) == [
        (f"http://testserver{f.get_absolute_url()}", "updated")
    ]
    for resource_set in (bitstreams, metadata):
        build(resource_set)
        after = listed(resource_set)
        assert after == replayed(before[resource_set], resource_set)
        moved = {uri for uri in after if after[uri] != before[resource_set][uri]}
        assert moved == set(ChangeEvent.objects.filter(resource_set=resource_set).values_list("uri", flat=True))


@pytest.mark.django_db
def test_links_that_change_with_the_same_bytes_are_listed_and_the_lastmod_stays(seed, committing, monkeypatch):
    """A change of the entry's links alone is no change a Destination fetches: no event, and
    the Resource List shows the new links with the lastmod it had."""
    bitstreams, metadata = published(seed, committing)
    before = listed(metadata)
    source = metadata.get_source()
    links = type(source).links
    monkeypatch.setattr(type(source), "links", lambda self, obj: [*links(self, obj), {"rel": "license", "href": "/licence/"}])
    item = Item.objects.order_by("pk").first()
    with committing():
        item.save()
    assert not ChangeEvent.objects.filter(resource_set=metadata).exists()
    build(metadata)
    assert listed(metadata) == before
    uri = f"http://testserver{item.get_metadata_url()}"
    (entry,) = [entry for entry in resource_list_entries(metadata) if entry.findtext(f"{{{SM}}}loc") == uri]
    assert "http://testserver/licence/" in [ln.get("href") for ln in entry.findall("{http://www.openarchives.org/rs/terms/}ln")]
    assert "hash" in md(entry)
    record = Resource.objects.get(resource_set=metadata, object_pk=str(item.pk))
    assert record.lastmod == LONG_AGO


@pytest.fixture
def live_source(live_server, settings, transactional_db):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BASE_URL": live_server.url}
    return live_server.url


def audited(client, caplog):
    """The reference client's audit of its copy: its status line."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="resync.client"):
        client.baseline_or_audit(audit_only=True)
    (status,) = [record.getMessage() for record in caplog.records if record.getMessage().startswith("Status:")]
    return status


def test_resync_audits_in_sync_after_an_unchanged_save_and_a_rebuild(live_source, seed, tmp_path, monkeypatch, caplog):
    """The reference client syncs a baseline, follows the Change List after a save that changed
    no bytes (and one that did), and audits its copy against the rebuilt Resource List."""
    monkeypatch.chdir(tmp_path)  # the client keeps its state file in the working directory
    sets = published(seed)
    clients = {}
    for resource_set in sets:
        client = Client(hashes=["md5", "sha-256"])
        client.set_mappings([f"{live_source}/", str(tmp_path / resource_set.slug)])
        client.sitemap_name = f"{live_source}/resourcesync/{resource_set.slug}/resourcelist.xml"
        client.baseline_or_audit()
        clients[resource_set.slug] = client
        assert "IN SYNC" in audited(client, caplog)
    first, second = Item.objects.order_by("pk")[:2]
    with transaction.atomic():
        first.save()  # no byte of its record or its files changes: only "modified"
        for f in ItemFile.objects.filter(item=first):
            f.save()
        second.title = "Retitled"  # its record's bytes change
        second.save()
    outbox.dispatcher.flush()
    tracking.process_pending()
    for resource_set in sets:
        client = clients[resource_set.slug]
        client.incremental(allow_deletion=True, change_list_uri=f"{live_source}/resourcesync/{resource_set.slug}/changelist.xml")
        build(resource_set)
        status = audited(client, caplog)
        assert "NOT IN SYNC" not in status and "IN SYNC" in status, (resource_set.slug, status)

