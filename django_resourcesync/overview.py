"""What a set publishes, at a glance: the state of each capability, the change activity, what
waits to be processed. Read by the admin (and anything else that shows a manager the Source);
it only reads the app's own tables, a few indexed queries a set.
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
    return [
        _state(resource_set, capability) for capability in capabilities.TABLE
        if resource_set.has_capability(capability.name) and (only is None or capability.name in only)
    ]


def _state(resource_set, capability):
    uri = uris.document_uri(resource_set, capability.document)
    if capability.name in (capabilities.RESOURCELIST, capabilities.RESOURCEDUMP):
        return _built(resource_set, capability, uri)
    if capability.name == capabilities.CHANGELIST:
        return _changelist(resource_set, capability, uri)
    if capability.name == capabilities.CHANGEDUMP:
        return _changedump(resource_set, capability, uri)
    # Archives and channels: served while their builder says they are published (an archive
    # is not while the set does not offer what it archives).
    served = capability.builder.published(resource_set) is not None
    note = capability.builder.describe(resource_set) if served else None
    return CapabilityState(capability, PUBLISHED if served else NOT_BUILT, uri, note=note)


def _built(resource_set, capability, uri):
    builds = Build.objects.filter(resource_set=resource_set, capability=capability.name)
    published = builds.filter(status=Build.Status.PUBLISHED).order_by("-pk").first()
    newest = builds.exclude(status=Build.Status.RETIRED).order_by("-pk").first()
    since = builds.filter(pk__gt=published.pk) if published else builds
    failure = since.filter(status=Build.Status.FAILED).order_by("-pk").first()
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
    size = Document.objects.filter(build=published, withdrawn__isnull=True).aggregate(n=Sum("size"))["n"] or 0
    return CapabilityState(
        capability, state, uri, published=published.finished or published.at, entries=published.entries, bytes=size,
        failure=failure,
    )


def _changelist(resource_set, capability, uri):
    lists = ChangeList.objects.filter(resource_set=resource_set, archived__isnull=True)
    totals = lists.aggregate(
        lists=Count("pk"), entries=Sum("entries"), size=Sum("size"), newest=Max("last_datetime"), opened=Max("from_time")
    )
    if not totals["lists"]:
        return CapabilityState(capability, NOT_BUILT, uri)
    return CapabilityState(
        capability, PUBLISHED, uri, published=totals["newest"] or totals["opened"], entries=totals["entries"] or 0,
        # The open list is served live: only the closed lists have a size.
        bytes=totals["size"] or 0,
    )


def _changedump(resource_set, capability, uri):
    packages = ChangeDumpPackage.objects.filter(resource_set=resource_set, archived__isnull=True)
    if not packages.exists():
        return CapabilityState(capability, NOT_BUILT, uri)
    # Served from its first package on, if empty once every package is withdrawn.
    totals = packages.filter(withdrawn__isnull=True).aggregate(
        entries=Sum("entries"), size=Sum("size"), manifests=Sum("manifest_size"), newest=Max("written")
    )
    return CapabilityState(
        capability, PUBLISHED, uri, published=totals["newest"] or capability.builder.published(resource_set),
        entries=totals["entries"] or 0, bytes=(totals["size"] or 0) + (totals["manifests"] or 0),
    )


def pending_changes(resource_set):
    """Rows of the outbox the set has still to process: its source's, but those kept for another set."""
    return PendingChange.objects.filter(source=resource_set.source).filter(
        Q(resource_set__isnull=True) | Q(resource_set=resource_set)
    )


def activity(resource_set, *, now=None):
    """The set's changes per day and kind over the last :data:`ACTIVITY_DAYS` days (today
    included), and in the last day and week. Only the lists that overlap the window are read:
    a change's datetime lies within its list's ``from``/``until``."""
    now = now or timezone.now()
    today = timezone.localtime(now).date()
    days = [today - datetime.timedelta(days=back) for back in range(ACTIVITY_DAYS - 1, -1, -1)]
    start = timezone.make_aware(datetime.datetime.combine(days[0], datetime.time.min))
    lists = ChangeList.objects.filter(resource_set=resource_set).filter(Q(until__isnull=True) | Q(until__gte=start))
    events = ChangeEvent.objects.filter(resource_set=resource_set, changelist__in=lists, datetime__gte=start)
    result = Activity(days=days)
    rows = (
        events.annotate(day=TruncDate("datetime", tzinfo=timezone.get_current_timezone()))
        .values("day", "change")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for row in rows:
        result.counts.setdefault(row["day"], {})[row["change"]] = row["n"]
    recent = events.aggregate(
        day=Count("pk", filter=Q(datetime__gte=now - datetime.timedelta(days=1))),
        week=Count("pk", filter=Q(datetime__gte=now - datetime.timedelta(days=7))),
    )
    result.last_day, result.last_week = recent["day"], recent["week"]
    return result
