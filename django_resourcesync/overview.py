"""What a set publishes, at a glance: the state of each capability, the change activity, what
waits to be processed. Read by the admin (and anything else that shows a manager the Source);
it only reads the app's own tables, and reads them for a list of sets at once (:func:`states_of`,
:func:`activities`, :func:`pending_counts`): as many queries for 20 sets as for one.
"""

import datetime
from dataclasses import dataclass, field

from django.db.models import Count, Max, Q, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from . import capabilities, uris
from .models import Build, ChangeDumpPackage, ChangeEvent, ChangeList, Document, PendingChange

PUBLISHED = "published"
BUILDING = "building"
FAILED = "failed"
NOT_BUILT = "not built yet"

#: Days the change activity covers.
ACTIVITY_DAYS = 30


@dataclass
class CapabilityState:
    """One capability of a set as a Destination finds it now."""

    capability: capabilities.Capability
    state: str
    uri: str
    #: When what is served was made (the published build, the newest change, the newest package).
    published: datetime.datetime | None = None
    entries: int | None = None
    bytes: int | None = None
    #: The newest failed build since the one published (its ``error`` says why), or ``None``.
    failure: Build | None = None
    #: A line on what it holds, for the capabilities without builds (archives, channels).
    note: str | None = None

    @property
    def served(self):
        """Whether its document answers now (a failed or running build may stand beside one
        published before)."""
        return self.state == PUBLISHED or self.published is not None

    @property
    def reason(self):
        """The failure's one-line reason: the last line of its traceback."""
        return one_line(self.failure.error) if self.failure is not None else ""


@dataclass
class Activity:
    """Changes of one set per day (the site's days) over :data:`ACTIVITY_DAYS` days."""

    days: list  # of datetime.date, oldest first, the last one today
    counts: dict = field(default_factory=dict)  # date -> {"created": n, "updated": n, "deleted": n}
    last_day: int = 0  # changes in the last 24 hours
    last_week: int = 0  # in the last 7 days

    def of(self, day):
        return self.counts.get(day, {})

    @property
    def total(self):
        return sum(sum(counts.values()) for counts in self.counts.values())


def one_line(error):
    """The line of a traceback that says what went wrong (its last non-empty line)."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def capability_states(resource_set, only=None):
    """A :class:`CapabilityState` for each capability the set offers (among ``only``, if
    given), in the table's order."""
    return states_of([resource_set], only)[resource_set.pk]


def states_of(sets, only=None):
    """:func:`capability_states` of each of ``sets``, by key, read for all of them at once: as
    many queries for 20 sets as for one (a set fetched by ``with_published()`` asks nothing more
    for the dates of the capabilities without builds)."""
    wanted = {
        resource_set.pk: [
            capability for capability in capabilities.TABLE
            if resource_set.has_capability(capability.name) and (only is None or capability.name in only)
        ]
        for resource_set in sets
    }

    def offering(*names):
        return [pk for pk, offered in wanted.items() if any(capability.name in names for capability in offered)]

    read = {
        **_builds(offering(*BUILT), BUILT),
        **_changelists(offering(capabilities.CHANGELIST)),
        **_changedumps(offering(capabilities.CHANGEDUMP)),
    }
    return {
        resource_set.pk: [_state(resource_set, capability, read) for capability in wanted[resource_set.pk]]
        for resource_set in sets
    }


#: The capabilities whose documents are builds.
BUILT = (capabilities.RESOURCELIST, capabilities.RESOURCEDUMP)


def _state(resource_set, capability, read):
    uri = uris.document_uri(resource_set, capability.document)
    key = (resource_set.pk, capability.name)
    if capability.name in BUILT:
        return _built(capability, uri, *read.get(key, (None, None, None, 0)))
    if capability.name == capabilities.CHANGELIST:
        return _changelist(capability, uri, read.get(key))
    if capability.name == capabilities.CHANGEDUMP:
        return _changedump(resource_set, capability, uri, read.get(key))
    # Archives and channels: served while their builder says they are published (an archive
    # is not while the set does not offer what it archives).
    served = capability.builder.published(resource_set) is not None
    note = capability.builder.describe(resource_set) if served else None
    return CapabilityState(capability, PUBLISHED if served else NOT_BUILT, uri, note=note)


def _builds(pks, names):
    """``{(set key, capability): (published, newest, failure, size)}`` for the builds of
    ``names`` of the sets ``pks``: the newest published build, the newest not retired, the newest
    failed since the one published, and the size of the published build's documents not
    withdrawn. Three queries whatever the number of sets."""
    if not pks:
        return {}
    newest = (
        Build.objects.filter(resource_set__in=pks, capability__in=names)
        .values("resource_set", "capability")
        .annotate(
            published=Max("pk", filter=Q(status=Build.Status.PUBLISHED)),
            newest=Max("pk", filter=~Q(status=Build.Status.RETIRED)),
            failed=Max("pk", filter=Q(status=Build.Status.FAILED)),
        )
        .order_by()
    )
    found = {}
    for row in newest:
        failed = row["failed"] if row["failed"] and (row["published"] is None or row["failed"] > row["published"]) else None
        found[row["resource_set"], row["capability"]] = (row["published"], row["newest"], failed)
    builds = Build.objects.in_bulk([pk for keys in found.values() for pk in keys if pk is not None])
    published = [keys[0] for keys in found.values() if keys[0] is not None]
    sizes = dict(
        Document.objects.filter(build__in=published, withdrawn__isnull=True)
        .values("build").annotate(n=Sum("size")).order_by().values_list("build", "n")
    ) if published else {}
    return {
        key: (*(builds.get(pk) for pk in keys), sizes.get(keys[0]) or 0)
        for key, keys in found.items()
    }


def _built(capability, uri, published, newest, failure, size):
    if newest is not None and newest.status == Build.Status.RUNNING:
        state = BUILDING
    elif failure is not None and newest == failure:
        state = FAILED
    elif published is not None:
        state = PUBLISHED
    else:
        state = NOT_BUILT
    if published is None:
        return CapabilityState(capability, state, uri, failure=failure)
    return CapabilityState(
        capability, state, uri, published=published.finished or published.at, entries=published.entries, bytes=size,
        failure=failure,
    )


def _changelists(pks):
    """``{(set key, changelist): totals}`` of the sets' Change Lists not archived, in one query."""
    if not pks:
        return {}
    rows = (
        ChangeList.objects.filter(resource_set__in=pks, archived__isnull=True)
        .values("resource_set")
        .annotate(entries=Sum("entries"), size=Sum("size"), newest=Max("last_datetime"), opened=Max("from_time"))
        .order_by()
    )
    return {(row["resource_set"], capabilities.CHANGELIST): row for row in rows}


def _changelist(capability, uri, totals):
    if totals is None:
        return CapabilityState(capability, NOT_BUILT, uri)
    return CapabilityState(
        capability, PUBLISHED, uri, published=totals["newest"] or totals["opened"], entries=totals["entries"] or 0,
        # The open list is served live: only the closed lists have a size.
        bytes=totals["size"] or 0,
    )


def _changedumps(pks):
    """``{(set key, changedump): totals}`` of the sets' Change Dump packages not archived (the
    sums of those not withdrawn), in one query."""
    if not pks:
        return {}
    kept = Q(withdrawn__isnull=True)
    rows = (
        ChangeDumpPackage.objects.filter(resource_set__in=pks, archived__isnull=True)
        .values("resource_set")
        .annotate(
            entries=Sum("entries", filter=kept), size=Sum("size", filter=kept),
            manifests=Sum("manifest_size", filter=kept), newest=Max("written", filter=kept),
        )
        .order_by()
    )
    return {(row["resource_set"], capabilities.CHANGEDUMP): row for row in rows}


def _changedump(resource_set, capability, uri, totals):
    if totals is None:
        return CapabilityState(capability, NOT_BUILT, uri)
    # Served from its first package on, if empty once every package is withdrawn.
    return CapabilityState(
        capability, PUBLISHED, uri, published=totals["newest"] or capability.builder.published(resource_set),
        entries=totals["entries"] or 0, bytes=(totals["size"] or 0) + (totals["manifests"] or 0),
    )


def pending_changes(resource_set):
    """Rows of the outbox the set has still to process: its source's, but those kept for another set."""
    return PendingChange.objects.filter(source=resource_set.source).filter(
        Q(resource_set__isnull=True) | Q(resource_set=resource_set)
    )


def pending_counts(sets):
    """The number of :func:`pending_changes` of each of ``sets``, by key, in one query."""
    rows = (
        PendingChange.objects.filter(source__in={resource_set.source for resource_set in sets})
        .values_list("source", "resource_set").annotate(n=Count("pk")).order_by()
    )
    counts = {}
    for source, kept_for, n in rows:
        counts[source, kept_for] = n
    return {
        resource_set.pk: counts.get((resource_set.source, None), 0) + counts.get((resource_set.source, resource_set.pk), 0)
        for resource_set in sets
    }


def activity(resource_set, *, now=None):
    """The set's changes per day and kind over the last :data:`ACTIVITY_DAYS` days (today
    included), and in the last day and week."""
    return activities([resource_set], now=now)[resource_set.pk]


def activities(sets, *, now=None):
    """The :func:`activity` of each of ``sets``, by key, in one query whatever their number.
    Only the lists that overlap the window are read: a change's datetime lies within its list's
    ``from``/``until``."""
    now = now or timezone.now()
    today = timezone.localtime(now).date()
    days = [today - datetime.timedelta(days=back) for back in range(ACTIVITY_DAYS - 1, -1, -1)]
    start = timezone.make_aware(datetime.datetime.combine(days[0], datetime.time.min))
    pks = [resource_set.pk for resource_set in sets]
    lists = ChangeList.objects.filter(resource_set__in=pks).filter(Q(until__isnull=True) | Q(until__gte=start))
    events = ChangeEvent.objects.filter(resource_set__in=pks, changelist__in=lists, datetime__gte=start)
    result = {pk: Activity(days=list(days)) for pk in pks}
    # One pass over the changes: per set, day and kind, with how many of them are of the last
    # day and week (summed over the set's rows).
    rows = (
        events.annotate(day=TruncDate("datetime", tzinfo=timezone.get_current_timezone()))
        .values("resource_set", "day", "change")
        .annotate(
            n=Count("pk"),
            last_day=Count("pk", filter=Q(datetime__gte=now - datetime.timedelta(days=1))),
            last_week=Count("pk", filter=Q(datetime__gte=now - datetime.timedelta(days=7))),
        )
        .order_by()
    )
    for row in rows:
        found = result[row["resource_set"]]
        found.counts.setdefault(row["day"], {})[row["change"]] = row["n"]
        found.last_day += row["last_day"]
        found.last_week += row["last_week"]
    return result
