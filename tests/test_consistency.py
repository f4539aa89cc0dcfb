"""A Resource List at ``at=T`` plus every change after ``T`` is exactly the current state.

Hypothesis draws random sequences of what a site does (saves, deletes, items made private or
public, bulk updates, renamed collections, new and changed files), with a Resource List built
somewhere in the middle, and checks the property for both demo sets. Changes are processed after
each operation, or late (a worker outage: only where the sequence says, and the Resource List
snapshot taken while some still wait).
"""

import pytest
from django.core.files.base import ContentFile
from django.db import transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from django_resourcesync import tracking
from django_resourcesync.builders.resourcelist import build_resourcelist
from django_resourcesync.models import ChangeEvent
from django_resourcesync.tracking import outbox
from example_project.repository.models import Collection, Item, ItemFile

from .conftest import demo_set
from .helpers import resource_list_entries
from .xmlcheck import SM, md

pytestmark = pytest.mark.django_db

# What a database can store in a text column (PostgreSQL refuses NUL).
texts = st.text(alphabet=st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=12)

operations = st.lists(
    st.one_of(
        st.tuples(st.just("title"), st.integers(0, 9), texts),
        st.tuples(st.just("delete"), st.integers(0, 9)),
        st.tuples(st.just("private"), st.integers(0, 9), st.booleans()),
        st.tuples(st.just("bulk_title"), st.sampled_from(["theses", "articles", "datasets"]), texts),
        st.tuples(st.just("rename_collection"), st.sampled_from(["theses", "articles", "datasets"]), texts.filter(bool)),
        st.tuples(st.just("add_file"), st.integers(0, 9), st.binary(max_size=64)),
        st.tuples(st.just("change_file"), st.integers(0, 20), st.binary(max_size=64)),
        st.tuples(st.just("delete_file"), st.integers(0, 20)),
        st.tuples(st.just("new_item"), texts),
        st.tuples(st.just("process")),  # the workers catch up (with late processing)
    ),
    max_size=12,
)


def pick(queryset, index):
    objects = list(queryset.order_by("pk"))
    return objects[index % len(objects)] if objects else None


def perform(operation, *, late=False):
    kind, *args = operation
    if kind == "title" and (item := pick(Item.objects, args[0])):
        item.title = args[1]
        item.save()
    elif kind == "delete" and (item := pick(Item.objects, args[0])):
        item.delete()
    elif kind == "private" and (item := pick(Item.objects, args[0])):
        item.is_public = args[1]
        item.save()
    elif kind == "bulk_title":
        Item.objects.filter(collection__slug=args[0]).update(title=args[1])
        tracking.changed(Item.objects.filter(collection__slug=args[0]))
    elif kind == "rename_collection":
        collection = Collection.objects.get(slug=args[0])
        collection.name = args[1]
        collection.save()
    elif kind == "add_file" and (item := pick(Item.objects, args[0])):
        row = ItemFile(item=item, name=f"added-{ItemFile.objects.count()}.bin", media_type="application/octet-stream")
        row.file.save("added.bin", ContentFile(args[1]), save=True)
    elif kind == "change_file" and (row := pick(ItemFile.objects, args[0])):
        row.file.save("changed.bin", ContentFile(args[1]), save=True)
    elif kind == "delete_file" and (row := pick(ItemFile.objects, args[0])):
        row.delete()
    elif kind == "new_item":
        Item.objects.create(collection=Collection.objects.first(), title=args[0])
    # The operation's transaction is over: the next one is another (its saves another change).
    # Its commit notes which sets list the objects saved; their processing waits (late) or
    # comes now.
    connection = transaction.get_connection()
    for _sids, callback, _robust in connection.run_on_commit:
        if isinstance(callback, outbox._OnCommit):
            outbox.stamp_transactions(callback.using, {callback.token: callback.saved})
    connection.run_on_commit = [entry for entry in connection.run_on_commit if not isinstance(entry[1], outbox._OnCommit)]
    if not late or kind == "process":
        tracking.process_pending()  # what the commit would queue


def current_state(resource_set):
    source = resource_set.get_source()
    return {entry.uri: entry.sha256 for entry in (source.entry(obj) for obj in source.queryset(resource_set.lookups))}


@hsettings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(before=operations, after=operations, late=st.booleans())
def test_resource_list_plus_later_changes_is_the_current_state(seed, before, after, late):
    with transaction.atomic():
        seed(5, file_size=40)
        sets = [demo_set("bitstreams"), demo_set("metadata")]
        for resource_set in sets:
            tracking.reconcile(resource_set)  # starts the change log
        for operation in before:
            perform(operation, late=late)
        snapshots = {}
        for resource_set in sets:
            build = build_resourcelist(resource_set, refresh=False)
            listed = {e.find(f"{{{SM}}}loc").text: md(e)["hash"].split()[1][8:] for e in resource_list_entries(resource_set)}
            snapshots[resource_set.pk] = (build.at, listed)
        for operation in after:
            perform(operation, late=late)
        tracking.process_pending()  # the workers are back
        for resource_set in sets:
            at, state = snapshots[resource_set.pk]
            for event in ChangeEvent.objects.filter(resource_set=resource_set, datetime__gte=at).order_by("id"):
                if event.change == "deleted":
                    state.pop(event.uri, None)
                else:
                    state[event.uri] = event.sha256
            assert state == current_state(resource_set)
        transaction.set_rollback(True)
