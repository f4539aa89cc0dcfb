from celery.result import EagerResult
from django import forms
from django.contrib import admin, messages
from django.core.exceptions import FieldError, ImproperlyConfigured, ValidationError
from django.db import DatabaseError, transaction
from django.db.models import Count, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.template.defaultfilters import filesizeformat
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from . import capabilities, uris, versions
from .capabilities import CAPABILITY_CHOICES
from .models import (
    Build,
    BuildPart,
    ChangeEvent,
    ChangeList,
    Delivery,
    Document,
    LeftOut,
    Notification,
    Resource,
    ResourceSet,
    Subscription,
    default_capabilities,
)
from .sources import registry
from .tasks import rebuild_set_task, reconcile_set_task


class ResourceSetForm(forms.ModelForm):
    source = forms.ChoiceField(label=_("source"), choices=())
    capabilities = forms.MultipleChoiceField(
        label=_("capabilities"),
        choices=CAPABILITY_CHOICES,
        widget=forms.CheckboxSelectMultiple,
        required=False,
        initial=default_capabilities,
    )

    class Meta:
        model = ResourceSet
        fields = ["name", "slug", "source", "lookups", "describedby", "capabilities", "prior_versions", "enabled", "position"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["source"].choices = [(name, name) for name in registry.names()]

    def clean(self):
        """Run the filter once, so that what the database refuses (a bad regular expression, say)
        is an error on the field rather than a 500 on save or a failed build later. In a savepoint,
        so that on PostgreSQL the error does not break the request's transaction. A filter over
        no rows may not be checked (SQLite): its first build then fails and says why."""
        cleaned = super().clean()
        source, lookups = cleaned.get("source"), cleaned.get("lookups")
        dumps = capabilities.needing_bytes(cleaned.get("capabilities") or [])
        if source in registry and dumps and not registry.get(source).gives_bytes:
            names = ", ".join(str(capabilities.get(name).label) for name in dumps)
            self.add_error(
                "capabilities",
                _("The source %(source)s gives no bytes (neither a file nor content), so it cannot offer %(dumps)s: "
                  "a dump holds the resources' bytes.") % {"source": source, "dumps": names},
            )
        if source in registry and isinstance(lookups, dict):
            try:
                with transaction.atomic():
                    registry.get(source).queryset(lookups).exists()
            except (FieldError, ValueError, TypeError, ValidationError, ImproperlyConfigured, DatabaseError) as exc:
                self.add_error("lookups", _("The source rejects this filter: %(error)s") % {"error": exc})
        return cleaned


@admin.register(ResourceSet)
class ResourceSetAdmin(admin.ModelAdmin):
    form = ResourceSetForm
    list_display = ["name", "slug", "source", "enabled", "capability_names", "resource_count", "left_out_count", "last_build"]
    list_filter = ["enabled", "source"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    readonly_fields = ["published"]
    actions = ["rebuild", "reconcile"]

    def get_queryset(self, request):
        # Counted by subqueries: one join of both tables would multiply their rows.
        resources = Resource.objects.filter(resource_set=OuterRef("pk")).order_by().values("resource_set").annotate(n=Count("pk"))
        left_out = LeftOut.objects.filter(resource_set=OuterRef("pk")).order_by().values("resource_set").annotate(n=Count("pk"))
        return super().get_queryset(request).annotate(
            resource_total=Coalesce(Subquery(resources.values("n")), 0),
            left_out_total=Coalesce(Subquery(left_out.values("n")), 0),
        )

    @admin.display(description=_("left out"), ordering="left_out_total")
    def left_out_count(self, obj):
        """Objects among the set's items that cannot be published, linked to their reasons."""
        if not obj.left_out_total:
            return "0"
        return format_html(
            '<a href="{}?resource_set__id__exact={}">{}</a>',
            reverse("admin:resourcesync_leftout_changelist"), obj.pk, obj.left_out_total
        )

    @admin.display(description=_("capabilities"))
    def capability_names(self, obj):
        return ", ".join(obj.capabilities or []) or "—"

    @admin.display(description=_("resources"), ordering="resource_total")
    def resource_count(self, obj):
        return obj.resource_total

    @admin.display(description=_("last build"))
    def last_build(self, obj):
        build = obj.builds.order_by("-pk").first()
        return f"{build.status}, {build.finished or build.started:%Y-%m-%d %H:%M:%S}" if build else "—"

    @admin.display(description=_("published documents"))
    def published(self, obj):
        if obj.pk is None:
            return "—"
        rows = [(uris.capability_list_uri(obj), "Capability List", "")]
        for capability in capabilities.TABLE:
            if obj.has_capability(capability.name):
                described = capability.builder.describe(obj)
                if described is not None:
                    rows.append((uris.document_uri(obj, capability.document), capability.name, described))
        listed = format_html("<ul>{}</ul>", format_html_join("", '<li><a href="{}">{}</a> {}</li>', rows))
        held = versions.held(obj)
        if held is None:
            return listed
        return format_html(
            "{}<p>{}</p>", listed,
            _("Version store: %(versions)d version(s), %(size)s, of %(changes)d change(s).")
            % {"versions": held["versions"], "size": filesizeformat(held["bytes"]), "changes": held["changes"]},
        )

    @admin.action(description=_("Rebuild the selected sets now"), permissions=["change"])
    def rebuild(self, request, queryset):
        self.send_task(
            request, queryset, rebuild_set_task,
            failed=_("Rebuilding “%(set)s” failed: %(error)s"),
            ran=_("Rebuilt %(n)d set(s)."),
            queued=_("Rebuild queued for %(n)d set(s)."),
        )

    @admin.action(description=_("Reconcile the selected sets with the site's data"), permissions=["change"])
    def reconcile(self, request, queryset):
        self.send_task(
            request, queryset, reconcile_set_task,
            failed=_("Reconciling “%(set)s” failed: %(error)s"),
            ran=_("Reconciled %(n)d set(s)."),
            queued=_("Reconcile queued for %(n)d set(s)."),
        )

    def send_task(self, request, queryset, task, *, failed, ran, queued):
        """Send ``task`` for each selected set and say what happened. With tasks run in process
        (``CELERY_TASK_ALWAYS_EAGER``: the demo, the tests) the work is done in this request, so a
        set that fails (a full disk, a broken filter), like a broker that cannot be reached, is an
        error message naming the set, never a 500, and the other sets go on."""
        done = sent = 0
        for resource_set in queryset:
            try:
                result = task.delay(resource_set.pk)
                if isinstance(result, EagerResult):
                    result.get()  # raises the task's error when CELERY_TASK_EAGER_PROPAGATES is off
            except Exception as exc:
                self.message_user(request, failed % {"set": resource_set, "error": exc}, messages.ERROR)
                continue
            if isinstance(result, EagerResult) or task.app.conf.task_always_eager:
                done += 1
            else:
                sent += 1
        if done:
            self.message_user(request, ran % {"n": done}, messages.SUCCESS)
        if sent:
            self.message_user(request, queued % {"n": sent}, messages.SUCCESS)


class ReadOnlyAdmin(admin.ModelAdmin):
    """The app's own records: they are what is published, so the admin only shows them."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


class DocumentInline(ReadOnlyInline):
    model = Document
    fields = ["name", "is_index", "entries", "size", "at", "completed"]
    readonly_fields = fields


class BuildPartInline(ReadOnlyInline):
    """The parts of a build rendered in parts: which are done, and how often each was started."""

    model = BuildPart
    fields = ["number", "after_pk", "last_pk", "attempts", "done", "documents", "entries", "report"]
    readonly_fields = fields


@admin.register(Build)
class BuildAdmin(ReadOnlyAdmin):
    list_display = [
        "pk", "resource_set", "capability", "status", "parts_done", "entries", "documents", "at", "completed", "finished"
    ]
    list_filter = ["status", "capability", "resource_set"]
    readonly_fields = ["parts_done"]
    inlines = [BuildPartInline, DocumentInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            parts_total=Count("parts"), parts_finished=Count("parts", filter=Q(parts__done__isnull=False))
        )

    @admin.display(description=_("parts done"))
    def parts_done(self, obj):
        """``3 of 4`` for a build rendered in parts (a parallel one, while it runs), else —."""
        if not obj.parts_total:
            return "—"
        return _("%(done)d of %(total)d") % {"done": obj.parts_finished, "total": obj.parts_total}


@admin.register(Resource)
class ResourceAdmin(ReadOnlyAdmin):
    list_display = ["uri", "resource_set", "lastmod", "length", "media_type"]
    list_filter = ["resource_set"]
    search_fields = ["uri"]
    show_full_result_count = False


@admin.register(ChangeEvent)
class ChangeEventAdmin(ReadOnlyAdmin):
    """The change log: read-only, filterable by set, kind of change and date."""

    list_display = ["id", "datetime", "change", "uri", "resource_set", "changelist_number"]
    list_filter = ["resource_set", "change"]
    date_hierarchy = "datetime"
    search_fields = ["uri"]
    list_select_related = ["resource_set", "changelist"]
    show_full_result_count = False

    @admin.display(description=_("change list"), ordering="changelist__number")
    def changelist_number(self, obj):
        return obj.changelist.number


@admin.register(ChangeList)
class ChangeListAdmin(ReadOnlyAdmin):
    list_display = ["resource_set", "number", "from_time", "until", "entries"]
    list_filter = ["resource_set"]


@admin.register(LeftOut)
class LeftOutAdmin(ReadOnlyAdmin):
    """Objects among a set's items that could not be published, and why: fix the object (or the
    source), and the next processing or reconcile publishes it and removes it from this list."""

    list_display = ["object_pk", "resource_set", "reason", "first_seen", "last_seen"]
    list_filter = ["resource_set"]
    search_fields = ["object_pk", "reason"]


@admin.register(Subscription)
class SubscriptionAdmin(ReadOnlyAdmin):
    """Who is subscribed at the built-in hub. A manager may end a subscription (delete it); its
    secret is never shown."""

    list_display = ["callback", "resource_set", "capability", "expires", "verified", "failed_deliveries"]
    list_filter = ["resource_set", "capability"]
    search_fields = ["callback"]
    fields = ["callback", "resource_set", "capability", "lease_seconds", "expires", "created", "verified", "signed"]
    readonly_fields = fields

    def has_delete_permission(self, request, obj=None):
        return request.user.has_perm("resourcesync.delete_subscription")

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            failures=Count("deliveries", filter=Q(deliveries__state=Delivery.State.FAILED))
        )

    @admin.display(description=_("failed deliveries"), ordering="failures")
    def failed_deliveries(self, obj):
        if not obj.failures:
            return 0
        url = reverse("admin:resourcesync_delivery_changelist")
        return format_html('<a href="{}?subscription__id__exact={}&state__exact=failed">{}</a>', url, obj.pk, obj.failures)

    @admin.display(description=_("signed"), boolean=True)
    def signed(self, obj):
        return bool(obj.secret)


class DeliveryInline(ReadOnlyInline):
    model = Delivery
    fields = ["target", "state", "attempts", "last_status", "last_error", "next_attempt", "delivered"]
    readonly_fields = fields


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    """What each channel sent, and where it went."""

    list_display = ["pk", "created", "resource_set", "capability", "entries", "delivered", "failed"]
    list_filter = ["resource_set", "capability"]
    fields = ["resource_set", "capability", "created", "entries", "payload"]
    readonly_fields = fields
    inlines = [DeliveryInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            sent=Count("deliveries", filter=Q(deliveries__state=Delivery.State.DELIVERED)),
            failures=Count("deliveries", filter=Q(deliveries__state=Delivery.State.FAILED)),
        )

    @admin.display(description=_("delivered"), ordering="sent")
    def delivered(self, obj):
        return obj.sent

    @admin.display(description=_("failed"), ordering="failures")
    def failed(self, obj):
        return obj.failures


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    """Deliveries of notifications: those that failed for good (the callback kept refusing until
    its lease ended) and those still being retried."""

    list_display = ["notification", "target", "state", "attempts", "last_status", "last_error", "next_attempt", "delivered"]
    list_filter = ["state", "notification__resource_set", "notification__capability"]
    search_fields = ["target"]
    list_select_related = ["notification__resource_set"]
    show_full_result_count = False
