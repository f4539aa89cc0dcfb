from django.apps import apps
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import connections, models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .capabilities import CAPABILITY_CHOICES, RESOURCELIST, with_published


def validate_link_target(value):
    """A URL (http or https), or a path on this site (made absolute with ``BASE_URL``)."""
    if value.startswith("/") and not value.startswith("//"):
        return
    URLValidator(schemes=["http", "https"])(value)


def validate_lookups(value):
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise ValidationError(_('Enter a JSON object of queryset lookups, such as {"collection__slug": "theses"}.'))


#: Slugs a set may not take: ``/resourcesync/<slug>/`` would be shadowed by a route of the app
#: (``/resourcesync/api/`` is the REST API).
RESERVED_SLUGS = ("api",)


def validate_slug_not_reserved(value):
    if value in RESERVED_SLUGS:
        raise ValidationError(
            _("“%(slug)s” is reserved: /resourcesync/%(slug)s/ is a route of the app. Choose another slug."),
            code="reserved",
            params={"slug": value},
        )


def default_capabilities():
    return [RESOURCELIST]


def validate_capabilities(value):
    known = {choice for choice, _label in CAPABILITY_CHOICES}
    if not isinstance(value, list) or not set(value) <= known:
        raise ValidationError(_("Choose capabilities among: %(known)s.") % {"known": ", ".join(sorted(known))})


class ResourceSetQuerySet(models.QuerySet):
    def with_published(self):
        """The sets, each read with when each of its capabilities' documents last changed, in
        the one query (see :func:`.capabilities.with_published`)."""
        return with_published(self)

    def public(self):
        """The enabled sets anyone may read (not those for partners with a token)."""
        return self.filter(enabled=True).exclude(access="token")

    def lock(self, pk):
        """Take the row lock of set ``pk``, inside a transaction: one writer of a set's record
        and change log at a time. Where the database has it (PostgreSQL), the lock is
        ``FOR NO KEY UPDATE``, which other writers of the set wait for as they would for
        ``FOR UPDATE``, but which lets other processes insert rows that refer to the set
        meanwhile (the entries helpers prepare, the parts of a job): the foreign key check of
        such an insert takes a share lock of the set's key, which ``FOR UPDATE`` would hold
        back until the holder commits."""
        queryset = self.select_for_update()
        if connections[queryset.db].features.has_select_for_no_key_update:
            queryset = self.select_for_update(no_key=True)
        return queryset.filter(pk=pk).first()


class ResourceSet(models.Model):
    """A set of resources with its own Capability List (spec section 9)."""

    objects = ResourceSetQuerySet.as_manager()

    name = models.CharField(_("name"), max_length=200)
    slug = models.SlugField(
        _("slug"), unique=True, validators=[validate_slug_not_reserved],
        help_text=_("Part of the set's URIs: /resourcesync/<slug>/…")
    )
    source = models.CharField(_("source"), max_length=100, help_text=_("A registered resource source."))
    lookups = models.JSONField(
        _("filter"),
        default=dict,
        blank=True,
        validators=[validate_lookups],
        help_text=_('Queryset lookups narrowing the source\'s items, e.g. {"collection__slug": "theses"}.'),
    )
    describedby = models.CharField(
        _("description URL"), max_length=2048, blank=True, validators=[validate_link_target],
        help_text=_("A document describing this set (rs:ln rel=\"describedby\"): a URL, or a path on this site.")
    )
    capabilities = models.JSONField(
        _("capabilities"), default=default_capabilities, blank=True, validators=[validate_capabilities]
    )
    enabled = models.BooleanField(_("enabled"), default=True)
    access = models.CharField(
        _("access"), max_length=8, choices=[("public", _("public")), ("token", _("partners with a token"))],
        default="public",
        help_text=_("Public: anyone may read the set's documents. Partners with a token: only Destinations holding an "
                    "access token issued for this set (HTTP Authorization: Bearer); the public Source Description does "
                    "not list the set."),
    )
    prior_versions = models.BooleanField(
        _("prior versions"), default=False,
        help_text=_("Keep the bytes of every change (the version store) and publish them as prior versions: "
                    "each change links its memento, each resource its TimeMap and TimeGate (Memento)."),
    )
    position = models.PositiveIntegerField(_("position"), default=0, help_text=_("Order in the Source Description."))
    base_url = models.CharField(
        _("base URL of the record"), max_length=2048, blank=True, editable=False,
        help_text=_("RESOURCESYNC['BASE_URL'] when the set's record was written; a change re-renders every entry."),
    )
    created = models.DateTimeField(_("created"), auto_now_add=True)
    modified = models.DateTimeField(_("modified"), auto_now=True)

    class Meta:
        ordering = ["position", "slug"]
        verbose_name = _("resource set")
        verbose_name_plural = _("resource sets")

    def __str__(self):
        return self.name

    def get_source(self):
        """The registered source this set publishes from (the app's registry, set up when the
        app is ready: the sources module sits above the models)."""
        return apps.get_app_config("resourcesync").sources.get(self.source)

    def has_capability(self, capability):
        return capability in (self.capabilities or [])

    @property
    def is_public(self):
        """Whether anyone may read the set's documents (else only holders of a token for it)."""
        return self.access != "token"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            before = ResourceSet.objects.filter(pk=self.pk).values_list("access", flat=True).first()
            if before is not None and before != self.access:
                # The set enters or leaves the public Source Description: its date moves.
                SourceState.touch()
        super().save(*args, **kwargs)


class Resource(models.Model):
    """The app's own record of one published resource of a set: what its entry says."""

    # Indexed first in the constraints and indexes below: no index of its own.
    resource_set = models.ForeignKey(ResourceSet, on_delete=models.CASCADE, related_name="resources", db_index=False)
    object_pk = models.CharField(max_length=64)
    uri = models.CharField(max_length=2048)
    lastmod = models.DateTimeField(null=True, blank=True)
    changefreq = models.CharField(max_length=8, blank=True)
    md5 = models.CharField(max_length=32, blank=True)
    sha256 = models.CharField(max_length=64, blank=True)
    length = models.BigIntegerField(null=True, blank=True)
    media_type = models.CharField(max_length=255, blank=True)
    encoding = models.CharField(max_length=64, blank=True, help_text=_("Content encoding as served (rs:md encoding)."))
    links = models.JSONField(default=list, blank=True)
    fingerprint = models.CharField(max_length=512, blank=True)
    entry_xml = models.TextField(
        blank=True, help_text=_("The <url> element this resource contributes to a Resource List, rendered when it changes.")
    )
    recorded = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["resource_set", "object_pk"], name="resourcesync_resource_object"),
            models.UniqueConstraint(fields=["resource_set", "uri"], name="resourcesync_resource_uri"),
        ]
        # The parts of a build are ranges of a set's rows by key: planned and read from this index.
        indexes = [
            models.Index(fields=["resource_set", "id"], name="resourcesync_resource_key"),
            # A reconcile compares each object's fingerprint with its record's: read from this
            # index alone, not from the rows (a few hundred bytes each, the entry's text among them).
            models.Index(fields=["resource_set", "object_pk", "fingerprint"], name="resourcesync_resource_compared"),
            # None of the URIs alone: discovery finds the sets that list a URI on the index of
            # the (set, URI) constraint, a probe a set; one more index for every change to write.
        ]
        verbose_name = _("resource")
        verbose_name_plural = _("resources")

    def __str__(self):
        return self.uri


class PendingChange(models.Model):
    """An object of a source that may have changed, written in the transaction of the change.

    The outbox of change tracking: signal handlers and the bulk API insert one row per affected
    object, in the same transaction as the save or delete, so a rolled-back transaction leaves
    none. After the commit, :func:`django_resourcesync.tracking.process_pending` compares each
    object with the set's record and writes the change events; rows are deleted once processed.
    """

    source = models.CharField(max_length=100)
    object_pk = models.CharField(max_length=64)
    #: Empty when ``object_pk`` is one of the source's items; else the label of the related model
    #: (one of the source's ``related_models``) it belongs to: the items that its change affects
    #: are looked up when the row is processed, not in the saving request.
    related = models.CharField(max_length=100, blank=True, default="")
    #: When the change was made: the save (in autocommit, just after its commit). The datetime of
    #: its change event, unless an event already in the log is later.
    recorded = models.DateTimeField(default=timezone.now)
    #: The saving transaction's token: rows of one transaction and object are one change.
    #: ``None``: a transaction of its own.
    transaction = models.BigIntegerField(null=True, blank=True)
    #: What the save left of the object that processing needs if it has changed again since
    #: (:meth:`~django_resourcesync.sources.ResourceSource.saved_state`: a file's storage name).
    #: ``None`` for a row that only asks for the object to be looked at again (a deletion, the
    #: bulk API, a related object).
    state = models.JSONField(null=True, blank=True)
    #: Of a save: the keys of the sets its object was in when it committed (noted just after);
    #: ``None`` while not known. A save a later one overtook is published only by those sets.
    sets = models.JSONField(null=True, blank=True)
    #: When ``sets`` was noted: it tells of the save only if the object's next change came later.
    noted = models.DateTimeField(null=True, blank=True)
    #: Set on a row kept for one set only, after that set failed to apply it (the others did).
    resource_set = models.ForeignKey(
        "ResourceSet", null=True, blank=True, on_delete=models.CASCADE, related_name="+", db_index=False
    )

    class Meta:
        indexes = [
            models.Index(fields=["source", "id"]),
            # The saves of a committed transaction, found to note their sets.
            models.Index(fields=["transaction"], condition=models.Q(transaction__isnull=False),
                         name="resourcesync_pending_txn"),
        ]
        verbose_name = _("pending change")
        verbose_name_plural = _("pending changes")


class ChangeList(models.Model):
    """One Change List of a set: open (``until`` unset, served live) or closed (a file in storage)."""

    resource_set = models.ForeignKey(ResourceSet, on_delete=models.CASCADE, related_name="changelists")
    number = models.PositiveIntegerField()
    from_time = models.DateTimeField(_("from"))
    until = models.DateTimeField(_("until"), null=True, blank=True)
    entries = models.PositiveIntegerField(default=0)
    last_datetime = models.DateTimeField(null=True, blank=True, help_text=_("Datetime of its newest change event."))
    storage_name = models.CharField(max_length=1024, blank=True)
    size = models.PositiveBigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    archived = models.DateTimeField(
        null=True, blank=True,
        help_text=_("When it left the Change List Index (past CHANGELIST_RETENTION), kept for the Change List Archive "
                    "with its change events."),
    )

    class Meta:
        ordering = ["resource_set", "number"]
        constraints = [
            models.UniqueConstraint(fields=["resource_set", "number"], name="resourcesync_changelist_number"),
            models.UniqueConstraint(
                fields=["resource_set"], condition=models.Q(until__isnull=True), name="resourcesync_one_open_changelist"
            ),
        ]
        verbose_name = _("change list")
        verbose_name_plural = _("change lists")

    def __str__(self):
        return f"{self.resource_set.slug} change list {self.number}" + ("" if self.until else " (open)")

    @property
    def is_open(self):
        return self.until is None


class ChangeEvent(models.Model):
    """One entry of the append-only change log; ``id`` is the sequence that orders the log."""

    class Change(models.TextChoices):
        CREATED = "created", _("created")
        UPDATED = "updated", _("updated")
        DELETED = "deleted", _("deleted")

    # Both indexed first in the indexes below: no index of their own (fewer to keep up per event).
    resource_set = models.ForeignKey(ResourceSet, on_delete=models.CASCADE, related_name="changes", db_index=False)
    changelist = models.ForeignKey(ChangeList, on_delete=models.CASCADE, related_name="changes", db_index=False)
    object_pk = models.CharField(max_length=64)
    uri = models.CharField(max_length=2048)
    change = models.CharField(max_length=8, choices=Change.choices)
    datetime = models.DateTimeField()
    lastmod = models.DateTimeField(null=True, blank=True)
    md5 = models.CharField(max_length=32, blank=True)
    sha256 = models.CharField(max_length=64, blank=True)
    length = models.BigIntegerField(null=True, blank=True)
    media_type = models.CharField(max_length=255, blank=True)
    encoding = models.CharField(max_length=64, blank=True, help_text=_("Content encoding as served (rs:md encoding)."))
    entry_xml = models.TextField(help_text=_("The <url> element of this change in a Change List."))

    class Meta:
        indexes = [
            models.Index(fields=["changelist", "id"]),
            models.Index(fields=["resource_set", "id"]),
            models.Index(fields=["resource_set", "object_pk", "id"]),
            # The version store keeps bytes while an event refers to them (versions.collect).
            models.Index(fields=["sha256"], name="resourcesync_event_sha256"),
        ]
        verbose_name = _("change event")
        verbose_name_plural = _("change events")

    def __str__(self):
        return f"{self.change} {self.uri}"


class Build(models.Model):
    """One rendering of a capability document (and its parts) for a set."""

    class Status(models.TextChoices):
        RUNNING = "running", _("running")
        PUBLISHED = "published", _("published")
        RETIRED = "retired", _("retired")
        FAILED = "failed", _("failed")

    resource_set = models.ForeignKey(ResourceSet, on_delete=models.CASCADE, related_name="builds")
    capability = models.CharField(max_length=32)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    at = models.DateTimeField(_("snapshot started"))
    completed = models.DateTimeField(_("snapshot completed"), null=True, blank=True)
    entries = models.PositiveBigIntegerField(default=0)
    documents = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    report = models.JSONField(
        default=dict, blank=True, help_text=_("What the build noticed: files changed since hashed, missing, …")
    )
    parts_planned = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("How many parts the build has, once they are all planned; empty while planning.")
    )
    started = models.DateTimeField(default=timezone.now)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-pk"]
        indexes = [models.Index(fields=["resource_set", "capability", "status"])]
        verbose_name = _("build")
        verbose_name_plural = _("builds")

    def __str__(self):
        return f"{self.resource_set.slug} {self.capability} #{self.pk} ({self.status})"


class Document(models.Model):
    """A file in storage that is served at ``/resourcesync/<set>/<name>``."""

    build = models.ForeignKey(Build, on_delete=models.CASCADE, related_name="files")
    resource_set = models.ForeignKey(ResourceSet, on_delete=models.CASCADE, related_name="documents")
    name = models.CharField(max_length=255, help_text=_("Path under the set's URL prefix."))
    storage_name = models.CharField(max_length=1024)
    media_type = models.CharField(max_length=100, default="application/xml")
    is_index = models.BooleanField(default=False)
    entries = models.PositiveIntegerField(default=0)
    size = models.PositiveBigIntegerField(default=0)
    sha256 = models.CharField(max_length=64)
    at = models.DateTimeField(null=True, blank=True)
    completed = models.DateTimeField(null=True, blank=True)
    written = models.DateTimeField(default=timezone.now)
    withdrawn = models.DateTimeField(
        null=True, blank=True,
        help_text=_("When its file was withdrawn (it held the bytes of an object that is no longer public).")
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["build", "name"], name="resourcesync_document_name")]
        indexes = [models.Index(fields=["resource_set", "name"])]
        verbose_name = _("document")
        verbose_name_plural = _("documents")

    def __str__(self):
        return f"{self.resource_set.slug}/{self.name}"


class ChangeDumpPackage(models.Model):
    """One ZIP package of a set's Change Dump: the bitstreams of the changes in an interval."""

    resource_set = models.ForeignKey(ResourceSet, on_delete=models.CASCADE, related_name="changedump_packages")
    number = models.PositiveIntegerField()
    from_time = models.DateTimeField(_("from"))
    until = models.DateTimeField(_("until"))
    first_event = models.BigIntegerField(help_text=_("Sequence of the first change event it covers."))
    last_event = models.BigIntegerField(help_text=_("Sequence of the last change event it covers."))
    entries = models.PositiveIntegerField(default=0)
    storage_name = models.CharField(max_length=1024)
    size = models.PositiveBigIntegerField(default=0)
    sha256 = models.CharField(max_length=64)
    manifest_storage_name = models.CharField(max_length=1024)
    manifest_size = models.PositiveBigIntegerField(default=0)
    manifest_sha256 = models.CharField(max_length=64)
    written = models.DateTimeField(default=timezone.now)
    withdrawn = models.DateTimeField(
        null=True, blank=True,
        help_text=_("When its files were withdrawn (they held the bytes of an object that is no longer public); "
                    "it is packed again."),
    )
    archived = models.DateTimeField(
        null=True, blank=True,
        help_text=_("When it left the Change Dump (its changes are past CHANGELIST_RETENTION), kept for the Change Dump "
                    "Archive."),
    )
    keys = models.JSONField(
        default=list, blank=True,
        help_text=_("Of an archived package: the objects whose bytes it holds (its change events may be gone), so that "
                    "it is withdrawn when one of them leaves the set."),
    )

    class Meta:
        ordering = ["resource_set", "number"]
        constraints = [models.UniqueConstraint(fields=["resource_set", "number"], name="resourcesync_changedump_number")]
        verbose_name = _("change dump package")
        verbose_name_plural = _("change dump packages")

    def __str__(self):
        return f"{self.resource_set.slug} change dump package {self.number}"


class BuildLock(models.Model):
    """At most one build of a set's capability at a time, across every process and machine.

    A lock whose holder died expires at ``expires`` and may then be taken over.
    """

    resource_set = models.ForeignKey(ResourceSet, on_delete=models.CASCADE, related_name="+")
    capability = models.CharField(max_length=32)
    holder = models.CharField(max_length=64)
    expires = models.DateTimeField()
    host = models.CharField(max_length=255, blank=True, help_text=_("The machine of the process that holds it."))
    pid = models.PositiveIntegerField(null=True, blank=True, help_text=_("The process that holds it, while a process does."))

    class Meta:
        constraints = [models.UniqueConstraint(fields=["resource_set", "capability"], name="resourcesync_one_build_lock")]
        verbose_name = _("build lock")
        verbose_name_plural = _("build locks")


class BuildPart(models.Model):
    """One part of a build: the set's Resource rows with ``after_pk < pk <= last_pk``.

    A build past one document's limits is planned as parts before any is rendered, so that each
    part is the same rows whoever renders it, and however often: a Celery task each when the
    build runs on workers (see :mod:`django_resourcesync.builders.parts`). ``done`` is set, in
    the transaction that records its documents, when the part is complete.
    """

    build = models.ForeignKey(Build, on_delete=models.CASCADE, related_name="parts")
    number = models.PositiveIntegerField()
    after_pk = models.BigIntegerField()
    last_pk = models.BigIntegerField()
    documents = models.PositiveIntegerField(
        default=0, help_text=_("Documents rendered from its rows (more than one past the byte limit).")
    )
    entries = models.PositiveBigIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0, help_text=_("Times a task started rendering it."))
    done = models.DateTimeField(null=True, blank=True)
    report = models.JSONField(
        default=dict, blank=True, help_text=_("What rendering it noticed (a dump's part: files changed since hashed, …).")
    )

    class Meta:
        ordering = ["build", "number"]
        constraints = [models.UniqueConstraint(fields=["build", "number"], name="resourcesync_build_part_number")]
        verbose_name = _("build part")
        verbose_name_plural = _("build parts")

    def __str__(self):
        return f"{self.build} part {self.number}"


class SharedPart(models.Model):
    """A share of a job that any worker may take: a range of a source's keys to reconcile, say.

    The process that starts the job records its parts, sends a task per part to the workers, and
    takes parts itself while any is left, so the job ends whether or not another worker is free
    (see :mod:`django_resourcesync.sharing`). A part is claimed by one holder at a time; a holder
    that gives no sign of life for ``PART_TIMEOUT`` seconds (its worker killed) loses it to the
    next one that looks. The rows of a job are deleted when it ends.
    """

    job = models.CharField(max_length=32)
    kind = models.CharField(max_length=32)
    resource_set = models.ForeignKey(ResourceSet, on_delete=models.CASCADE, related_name="+")
    number = models.PositiveIntegerField()
    options = models.JSONField(default=dict, blank=True, help_text=_("What the part is: its key range, say."))
    holder = models.CharField(max_length=64, blank=True)
    heartbeat = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    done = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job", "number"]
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="resourcesync_shared_part_number")]
        verbose_name = _("shared part")
        verbose_name_plural = _("shared parts")

    def __str__(self):
        return f"{self.kind} {self.job} part {self.number}"


class PreparedEntry(models.Model):
    """The record of an object described ahead of the processing of its pending changes, by a
    worker that shared the rendering of a large batch of changes (see
    :func:`django_resourcesync.tracking.processing.prepare_in_parts`). It stands only for the
    fingerprint it was made from: processing uses it instead of describing the object again
    when the object's fingerprint (which covers its entry) is still that one."""

    resource_set = models.ForeignKey(ResourceSet, on_delete=models.CASCADE, related_name="+")
    object_pk = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=512)
    #: The record's values as JSON text: written once and read once, never queried into (as
    #: text PostgreSQL stores and returns it without parsing it, twice as fast as ``jsonb``).
    values = models.TextField()
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["resource_set", "object_pk"], name="resourcesync_prepared_key")]
        verbose_name = _("prepared entry")
        verbose_name_plural = _("prepared entries")


class LeftOut(models.Model):
    """An object among a set's items that could not be published: its entry could not be made
    (its URL cannot be reversed, its file is missing, its page does not answer 200, …). It is
    listed nowhere, reported in the builds and the admin, and removed once it publishes again
    or leaves the set."""

    resource_set = models.ForeignKey(ResourceSet, on_delete=models.CASCADE, related_name="left_out", db_index=False)
    object_pk = models.CharField(max_length=64)
    reason = models.TextField()
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["resource_set", "object_pk"]
        constraints = [models.UniqueConstraint(fields=["resource_set", "object_pk"], name="resourcesync_left_out_object")]
        verbose_name = _("left-out object")
        verbose_name_plural = _("left-out objects")

    def __str__(self):
        return f"{self.resource_set.slug} {self.object_pk}: {self.reason[:80]}"


class Withdrawal(models.Model):
    """A resource that left a set (deleted, made private, filtered out): every package that
    holds its bytes stops being served. ``resource_id`` is the key its record had, which the
    parts of Resource Dump builds are ranges of; builds running meanwhile check these rows
    before they publish."""

    resource_set = models.ForeignKey(ResourceSet, on_delete=models.CASCADE, related_name="+", db_index=False)
    object_pk = models.CharField(max_length=64)
    resource_id = models.BigIntegerField()
    uri = models.CharField(max_length=2048, blank=True, help_text=_("The URI its resource had."))
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["resource_set", "at"], name="resourcesync_withdrawal_at")]
        verbose_name = _("withdrawal")
        verbose_name_plural = _("withdrawals")

    @classmethod
    def since(cls, resource_set, moment):
        """``[(object_pk, record id, uri)]`` of the set's withdrawals at or after ``moment``."""
        rows = cls.objects.filter(resource_set=resource_set, at__gte=moment)
        return list(rows.values_list("object_pk", "resource_id", "uri"))


class SourceState(models.Model):
    """One row: what the Source as a whole needs to remember (the Source Description's
    Last-Modified, which must not go backwards when a set is deleted)."""

    changed = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = _("source state")

    @classmethod
    def touch(cls, moment=None):
        moment = moment or timezone.now()
        if not cls.objects.filter(pk=1).update(changed=moment):
            cls.objects.get_or_create(pk=1, defaults={"changed": moment})

    @classmethod
    def changed_at(cls):
        return cls.objects.filter(pk=1).values_list("changed", flat=True).first()


class Version(models.Model):
    """Bytes a change left, kept in the version store by their sha-256 (one copy whatever the
    number of changes with those bytes): Change Dump packages are packed from here. Collected
    once no change event refers to them (see :mod:`django_resourcesync.versions`)."""

    sha256 = models.CharField(max_length=64, unique=True)
    storage_name = models.CharField(max_length=1024)
    length = models.PositiveBigIntegerField()
    created = models.DateTimeField(default=timezone.now)
    last_used = models.DateTimeField(default=timezone.now, help_text=_("When a change last referred to them."))

    class Meta:
        verbose_name = _("stored version")
        verbose_name_plural = _("stored versions")

    def __str__(self):
        return self.sha256


class Channel(models.Model):
    """A set's notification channel (a WebSub topic): what it has announced so far.

    The change notification channel remembers the last change event it announced; the framework
    notification channel, the state of each document it announced, so that the next
    announcement says what changed since (see :mod:`django_resourcesync.push`)."""

    resource_set = models.ForeignKey(ResourceSet, on_delete=models.CASCADE, related_name="channels", db_index=False)
    capability = models.CharField(max_length=32)
    last_event = models.BigIntegerField(default=0, help_text=_("Sequence of the last change event announced."))
    announced = models.JSONField(default=dict, blank=True, help_text=_("What each document was when last announced."))

    class Meta:
        constraints = [models.UniqueConstraint(fields=["resource_set", "capability"], name="resourcesync_one_channel")]
        verbose_name = _("notification channel")
        verbose_name_plural = _("notification channels")

    def __str__(self):
        return f"{self.resource_set.slug} {self.capability}"


class AccessToken(models.Model):
    """A bearer token issued to one Destination (a partner) for reading restricted sets. Only a
    digest of the token is kept: the token itself is shown once, when it is issued."""

    name = models.CharField(_("destination"), max_length=200, help_text=_("Who holds the token: it names them in the logs."))
    sets = models.ManyToManyField(ResourceSet, related_name="access_tokens", verbose_name=_("sets"), blank=True)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(_("token begins"), max_length=16, editable=False,
                              help_text=_("The first characters of the token, to tell tokens apart."))
    created = models.DateTimeField(_("issued"), default=timezone.now, editable=False)
    expires = models.DateTimeField(_("expires"), null=True, blank=True, help_text=_("Empty: never."))
    revoked = models.DateTimeField(_("revoked"), null=True, blank=True, editable=False)
    last_used = models.DateTimeField(_("last used"), null=True, blank=True, editable=False)

    class Meta:
        ordering = ["name", "-created"]
        # Named apart from the tokens of Django REST framework (authtoken), which log users in to APIs.
        verbose_name = _("partner access token")
        verbose_name_plural = _("partner access tokens")

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"

    def state(self, now=None):
        """``"valid"``, ``"revoked"`` or ``"expired"``."""
        if self.revoked is not None:
            return "revoked"
        if self.expires is not None and self.expires <= (now or timezone.now()):
            return "expired"
        return "valid"


class AuditReport(models.Model):
    """What a self-audit found of one set, seen over HTTP as a Destination sees it (see
    :mod:`django_resourcesync.audit`)."""

    resource_set = models.ForeignKey(ResourceSet, on_delete=models.CASCADE, related_name="audit_reports")
    base = models.CharField(_("audited at"), max_length=2048)
    finished = models.DateTimeField(_("finished"), default=timezone.now)
    problems = models.JSONField(default=list, blank=True, help_text=_("[URI, what is wrong], one per problem."))
    documents = models.PositiveIntegerField(default=0)
    resources = models.PositiveIntegerField(default=0)
    packages = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-pk"]
        verbose_name = _("audit report")
        verbose_name_plural = _("audit reports")

    def __str__(self):
        return f"{self.resource_set.slug}: {len(self.problems)} problem(s)"


class Subscription(models.Model):
    """A verified WebSub subscription of a callback to a set's channel at the built-in hub."""

    resource_set = models.ForeignKey(ResourceSet, on_delete=models.CASCADE, related_name="subscriptions")
    capability = models.CharField(_("channel"), max_length=32)
    callback = models.CharField(_("callback"), max_length=2048)
    host = models.CharField(_("callback host"), max_length=255, blank=True, db_index=True,
                            help_text=_("What HUB_SUBSCRIPTIONS_PER_HOST counts by."))
    secret = models.CharField(max_length=200, blank=True, help_text=_("Signs each delivery (X-Hub-Signature)."))
    lease_seconds = models.PositiveIntegerField(_("lease (seconds)"))
    expires = models.DateTimeField(_("expires"))
    created = models.DateTimeField(_("subscribed"), default=timezone.now)
    verified = models.DateTimeField(_("last verified"), default=timezone.now)
    token = models.ForeignKey(
        AccessToken, null=True, blank=True, on_delete=models.CASCADE, related_name="subscriptions",
        help_text=_("The token that allowed the subscription to a restricted set's channel: it ends with it."),
    )

    class Meta:
        ordering = ["resource_set", "capability", "callback"]
        constraints = [
            models.UniqueConstraint(fields=["resource_set", "capability", "callback"], name="resourcesync_one_subscription")
        ]
        verbose_name = _("subscription")
        verbose_name_plural = _("subscriptions")

    def __str__(self):
        return f"{self.callback} ({self.resource_set.slug} {self.capability})"


class SubscriptionRequest(models.Model):
    """A (un)subscription request the built-in hub took: its verification of intent, waiting
    until ``done``, and what the hub's limits per client count (see
    :mod:`django_resourcesync.push.limits`)."""

    mode = models.CharField(max_length=16)
    resource_set = models.ForeignKey(ResourceSet, on_delete=models.CASCADE, related_name="+")
    capability = models.CharField(max_length=32)
    callback = models.CharField(max_length=2048)
    host = models.CharField(max_length=255)
    lease_seconds = models.PositiveIntegerField()
    secret = models.CharField(max_length=200, blank=True)
    token = models.ForeignKey(AccessToken, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    client = models.CharField(max_length=64, help_text=_("The client's address (an IPv6 address's /64)."))
    created = models.DateTimeField(default=timezone.now)
    claimed_until = models.DateTimeField(null=True, blank=True, help_text=_("Being verified by a process until then."))
    claim = models.CharField(max_length=32, blank=True)
    done = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["client", "created"], name="resourcesync_hubreq_client"),
            models.Index(fields=["created"], name="resourcesync_hubreq_age"),
            models.Index(fields=["host"], condition=models.Q(done__isnull=True), name="resourcesync_hubreq_waiting"),
        ]

    def __str__(self):
        return f"{self.mode} {self.callback}"


class Notification(models.Model):
    """One notification sent on a channel: its payload, as delivered and as its topic serves it."""

    resource_set = models.ForeignKey(ResourceSet, on_delete=models.CASCADE, related_name="notifications", db_index=False)
    capability = models.CharField(_("channel"), max_length=32)
    payload = models.TextField()
    entries = models.PositiveIntegerField(default=0)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-pk"]
        indexes = [models.Index(fields=["resource_set", "capability", "id"], name="resourcesync_notification_chan")]
        verbose_name = _("notification")
        verbose_name_plural = _("notifications")

    def __str__(self):
        return f"{self.resource_set.slug} {self.capability} #{self.pk}"


class Delivery(models.Model):
    """One notification on its way to a subscriber's callback, or to the external hub."""

    class State(models.TextChoices):
        PENDING = "pending", _("pending")
        DELIVERED = "delivered", _("delivered")
        FAILED = "failed", _("failed")

    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="deliveries")
    subscription = models.ForeignKey(Subscription, null=True, blank=True, on_delete=models.SET_NULL, related_name="deliveries")
    target = models.CharField(_("to"), max_length=2048, help_text=_("The callback, or the external hub."))
    to_hub = models.BooleanField(_("to the external hub"), default=False)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt = models.DateTimeField(default=timezone.now)
    give_up = models.DateTimeField(_("given up at"), help_text=_("Not retried after this (the subscription's lease)."))
    claimed_until = models.DateTimeField(null=True, blank=True, help_text=_("Being attempted by a process until then."))
    claim = models.CharField(max_length=32, blank=True, help_text=_("The attempt that claimed it."))
    last_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    delivered = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-pk"]
        indexes = [
            models.Index(fields=["next_attempt"], condition=models.Q(state="pending"), name="resourcesync_delivery_due"),
        ]
        verbose_name = _("delivery")
        verbose_name_plural = _("deliveries")

    def __str__(self):
        return f"{self.notification} to {self.target} ({self.state})"
