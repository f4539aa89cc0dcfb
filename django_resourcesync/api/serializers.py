"""What each answer of the API shows.

Two views of a set: :class:`PublicResourceSetSerializer` shows what its Capability List and the
Source Description already tell anyone (its documents' URIs, its capabilities, how many
resources, when it was last published), never its filter, its source or its builds' errors;
:class:`ResourceSetSerializer` is the managers' view, which writes a set too, validated as the
admin's form validates it (:func:`~django_resourcesync.validation.validate_resource_set`).

Datetimes are full W3C datetimes in UTC ending in ``Z``, as in the documents, whatever the
site's time zone.
"""

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from .. import capabilities, uris
from ..builders.capabilitylist import published_capabilities
from ..models import AccessToken, Build, BuildPart, ChangeEvent, Document, PendingChange, ResourceSet, Subscription
from ..validation import validate_resource_set
from ..xml.writer import w3c_datetime


class W3CDateTimeField(serializers.DateTimeField):
    """A datetime as the documents write it: UTC, ``Z``, fractions of a second only when present."""

    def to_representation(self, value):
        return w3c_datetime(value) if value else None


class ModelSerializer(serializers.ModelSerializer):
    serializer_field_mapping = {**serializers.ModelSerializer.serializer_field_mapping, models.DateTimeField: W3CDateTimeField}


class SetSlugField(serializers.SlugRelatedField):
    """The set a row belongs to, by its slug (the key the API and the documents' URIs use)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("source", "resource_set")
        kwargs.setdefault("help_text", _("The slug of its set."))
        super().__init__(slug_field="slug", read_only=True, **kwargs)


# -- sets --------------------------------------------------------------------------------------


def _published(resource_set):
    """``[(capability, last changed)]`` of the set's published documents, read once per answer."""
    if not hasattr(resource_set, "_published_capabilities"):
        resource_set._published_capabilities = published_capabilities(resource_set)
    return resource_set._published_capabilities


def _annotated(resource_set, name, compute):
    value = getattr(resource_set, name, None)
    return compute() if value is None and not hasattr(resource_set, name) else value


class PublicResourceSetSerializer(ModelSerializer):
    """A set as anyone may see it: what its Capability List already says."""

    url = serializers.HyperlinkedIdentityField(view_name="resourcesync:api:set-detail", lookup_field="slug")
    capabilities = serializers.ListField(
        child=serializers.ChoiceField(choices=capabilities.CAPABILITY_CHOICES), read_only=True,
        help_text=_("The capabilities the set offers."),
    )
    capability_list = serializers.SerializerMethodField(help_text=_("The set's Capability List; null while it lists nothing."))
    documents = serializers.SerializerMethodField(
        help_text=_("The URI of each capability's document the Capability List points at, by capability.")
    )
    resources = serializers.SerializerMethodField(
        help_text=_("How many resources the set lists: for anyone, only while it publishes a Resource List (which shows them).")
    )
    last_good_build = serializers.SerializerMethodField(
        help_text=_("When the newest build that published a document of the set finished; null before the first.")
    )

    class Meta:
        model = ResourceSet
        fields = ["url", "name", "slug", "capabilities", "capability_list", "documents", "resources", "last_good_build"]
        read_only_fields = fields

    @extend_schema_field(serializers.URLField(allow_null=True))
    def get_capability_list(self, obj):
        return uris.capability_list_uri(obj) if _published(obj) else None

    @extend_schema_field(serializers.DictField(child=serializers.URLField()))
    def get_documents(self, obj):
        return {name: uris.document_uri(obj, capabilities.get(name).document) for name, _changed in _published(obj)}

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_resources(self, obj):
        if capabilities.RESOURCELIST not in {name for name, _changed in _published(obj)}:
            return None  # no public document shows how many there are
        return self.count_resources(obj)

    def count_resources(self, obj):
        return _annotated(obj, "resource_total", lambda: obj.resources.count())

    @extend_schema_field(W3CDateTimeField(allow_null=True))
    def get_last_good_build(self, obj):
        return w3c_datetime(_annotated(obj, "last_published", lambda: last_published(obj)))


def last_published(resource_set):
    return (
        Build.objects.filter(resource_set=resource_set, status__in=[Build.Status.PUBLISHED, Build.Status.RETIRED])
        .aggregate(latest=models.Max("finished"))["latest"]
    )


class ResourceSetSerializer(PublicResourceSetSerializer):
    """A set as its managers see and write it: the fields of the admin's form, and what it shows."""

    capabilities = serializers.ListField(
        child=serializers.ChoiceField(choices=capabilities.CAPABILITY_CHOICES), required=False,
        help_text=_("The capabilities the set offers (default: resourcelist)."),
    )
    source = serializers.CharField(max_length=100, help_text=_("A registered resource source."))
    left_out = serializers.SerializerMethodField(help_text=_("Objects among the set's items that could not be published."))

    class Meta:
        model = ResourceSet
        fields = [
            *PublicResourceSetSerializer.Meta.fields, "enabled", "access", "source", "lookups", "describedby", "prior_versions",
            "position", "left_out", "created", "modified",
        ]
        read_only_fields = ["capability_list", "documents", "resources", "last_good_build", "left_out", "created", "modified"]

    @extend_schema_field(OpenApiTypes.INT)
    def get_resources(self, obj):
        return self.count_resources(obj)  # managers see the record whatever is published

    @extend_schema_field(OpenApiTypes.INT)
    def get_left_out(self, obj):
        return _annotated(obj, "left_out_total", lambda: obj.left_out.count())

    def validate_capabilities(self, value):
        """Each once, in the order of the Capability List (as the form's checkboxes give them)."""
        return [capability.name for capability in capabilities.TABLE if capability.name in value]

    def validate(self, attrs):
        def value(name, default=None):
            return attrs[name] if name in attrs else getattr(self.instance, name, default)

        validate_resource_set(source=value("source"), lookups=value("lookups", {}), capabilities=value("capabilities", []))
        return attrs


# -- builds and documents ----------------------------------------------------------------------


class DocumentSerializer(ModelSerializer):
    """A published document, as anyone may fetch it."""

    set = SetSlugField()
    capability = serializers.CharField(source="build.capability", read_only=True)
    uri = serializers.SerializerMethodField(help_text=_("Where the document is served."))

    class Meta:
        model = Document
        fields = ["id", "set", "capability", "name", "uri", "media_type", "is_index", "entries", "size", "sha256", "at",
                  "completed"]
        read_only_fields = fields

    @extend_schema_field(serializers.URLField())
    def get_uri(self, obj):
        return uris.document_uri(obj.resource_set, obj.name)


class BuildDocumentSerializer(DocumentSerializer):
    """A document of a build, for its managers: withdrawn ones too, and when it was written."""

    class Meta(DocumentSerializer.Meta):
        fields = [*DocumentSerializer.Meta.fields, "written", "withdrawn"]
        read_only_fields = fields


class BuildPartSerializer(ModelSerializer):
    class Meta:
        model = BuildPart
        fields = ["number", "after_pk", "last_pk", "documents", "entries", "attempts", "done", "report"]
        read_only_fields = fields


class BuildSerializer(ModelSerializer):
    """A build, with its error and its report (which may hold a traceback): for managers only."""

    set = SetSlugField()
    url = serializers.HyperlinkedIdentityField(view_name="resourcesync:api:build-detail")

    class Meta:
        model = Build
        fields = ["id", "url", "set", "capability", "status", "at", "completed", "entries", "documents", "parts_planned",
                  "started", "finished", "error", "report"]
        read_only_fields = fields


class BuildDetailSerializer(BuildSerializer):
    parts = BuildPartSerializer(many=True, read_only=True)
    files = BuildDocumentSerializer(many=True, read_only=True)

    class Meta(BuildSerializer.Meta):
        fields = [*BuildSerializer.Meta.fields, "parts", "files"]
        read_only_fields = fields


# -- changes -----------------------------------------------------------------------------------


class ChangeEventSerializer(ModelSerializer):
    """One entry of the change log, as its Change List shows it; ``id`` is its place in the log."""

    set = SetSlugField()
    changelist = serializers.IntegerField(source="changelist.number", read_only=True,
                                          help_text=_("The number of the Change List it is in."))

    class Meta:
        model = ChangeEvent
        fields = ["id", "set", "changelist", "uri", "change", "datetime", "lastmod", "md5", "sha256", "length", "media_type",
                  "encoding"]
        read_only_fields = fields


class PendingChangeSerializer(ModelSerializer):
    set = SetSlugField(allow_null=True, help_text=_("The one set it is kept for, after that set failed to apply it."))

    class Meta:
        model = PendingChange
        fields = ["id", "source", "object_pk", "related", "recorded", "transaction", "state", "sets", "noted", "set"]
        read_only_fields = fields


# -- push --------------------------------------------------------------------------------------


class SubscriptionSerializer(ModelSerializer):
    """A subscription at the built-in hub. Its secret is never shown: only whether it has one."""

    set = SetSlugField()
    channel = serializers.CharField(source="capability", read_only=True)
    signed = serializers.SerializerMethodField(help_text=_("Whether deliveries are signed (the subscriber gave a secret)."))
    failed_deliveries = serializers.SerializerMethodField()

    class Meta:
        model = Subscription
        fields = ["id", "set", "channel", "callback", "lease_seconds", "expires", "created", "verified", "signed",
                  "failed_deliveries"]
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_signed(self, obj):
        return bool(obj.secret)

    @extend_schema_field(OpenApiTypes.INT)
    def get_failed_deliveries(self, obj):
        return _annotated(obj, "failures", lambda: obj.deliveries.filter(state="failed").count())


# -- answers of the actions (for the schema) ----------------------------------------------------


class BuildMadeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    capability = serializers.CharField()
    status = serializers.ChoiceField(choices=Build.Status.choices)
    entries = serializers.IntegerField()


class TaskAnswerSerializer(serializers.Serializer):
    """What ``rebuild`` and ``reconcile`` answer."""

    state = serializers.ChoiceField(
        choices=["queued", "done", "failed"],
        help_text=_("queued: sent to the workers (202); done or failed: run in this request (200)."),
    )
    task_id = serializers.CharField(required=False, help_text=_("Of a queued task."))
    builds = BuildMadeSerializer(many=True, required=False, help_text=_("The builds a rebuild made (or failed)."))
    summary = serializers.CharField(required=False, help_text=_("What a reconcile found."))
    reason = serializers.CharField(required=False, help_text=_("Why it failed, in one line."))


class NoInputSerializer(serializers.Serializer):
    """An action that takes no input."""


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()


# -- access tokens -----------------------------------------------------------------------------


class AccessTokenSerializer(ModelSerializer):
    """A token issued to a Destination for restricted sets. The token itself is never shown,
    but once, in the answer that issues it (:class:`IssuedTokenSerializer`)."""

    sets = serializers.SlugRelatedField(
        slug_field="slug", many=True, queryset=ResourceSet.objects.all(),
        help_text=_("The slugs of the sets it opens (those for partners with a token)."),
    )
    state = serializers.SerializerMethodField(help_text=_("valid, expired or revoked."))

    class Meta:
        model = AccessToken
        fields = ["id", "name", "sets", "prefix", "created", "expires", "revoked", "last_used", "state"]
        read_only_fields = ["id", "prefix", "created", "revoked", "last_used", "state"]

    @extend_schema_field(OpenApiTypes.STR)  # valid, expired or revoked (no enum: "state" names one already)
    def get_state(self, obj):
        return obj.state()

    def validate_expires(self, expires):
        if expires is not None and expires <= timezone.now():
            raise serializers.ValidationError(_("The expiry is in the past: the token would open nothing."))
        return expires

    def validate_sets(self, sets):
        public = sorted(s.slug for s in sets if s.is_public)
        if public:
            raise serializers.ValidationError(
                _("Anyone may read %(sets)s: a token opens only sets for partners with a token.") % {"sets": ", ".join(public)}
            )
        return sets


class IssuedTokenSerializer(AccessTokenSerializer):
    """A token just issued: with the token, shown this once (only its digest is kept)."""

    token = serializers.CharField(read_only=True, help_text=_("The bearer token. Keep it: it is not shown again."))

    class Meta(AccessTokenSerializer.Meta):
        fields = [*AccessTokenSerializer.Meta.fields, "token"]
