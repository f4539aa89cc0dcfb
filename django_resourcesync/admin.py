from django import forms
from django.contrib import admin, messages
from django.core.exceptions import FieldError, ImproperlyConfigured
from django.db.models import Count, Q
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from . import uris
from .builders import current_build
from .builders.capabilitylist import DOCUMENT_NAMES
from .capabilities import CAPABILITY_CHOICES
from .models import Build, BuildPart, ChangeEvent, ChangeList, Document, Resource, ResourceSet, default_capabilities
from .sources import registry


class ResourceSetForm(forms.ModelForm):
    source = forms.ChoiceField(label=_("source"), choices=())
    describedby = forms.URLField(
        label=_("description URL"), max_length=2048, required=False, assume_scheme="https",
        help_text=ResourceSet._meta.get_field("describedby").help_text,
    )
    capabilities = forms.MultipleChoiceField(
        label=_("capabilities"),
        choices=CAPABILITY_CHOICES,
        widget=forms.CheckboxSelectMultiple,
        required=False,
        initial=default_capabilities,
    )

    class Meta:
        model = ResourceSet
        fields = ["name", "slug", "source", "lookups", "describedby", "capabilities", "enabled", "position"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["source"].choices = [(name, name) for name in registry.names()]

    def clean(self):
        cleaned = super().clean()
        source, lookups = cleaned.get("source"), cleaned.get("lookups")
        if source in registry and isinstance(lookups, dict):
            try:
                registry.get(source).queryset(lookups).exists()
            except (FieldError, ValueError, TypeError, ImproperlyConfigured) as exc:
                self.add_error("lookups", _("The source rejects this filter: %(error)s") % {"error": exc})
        return cleaned


@admin.register(ResourceSet)
class ResourceSetAdmin(admin.ModelAdmin):
    form = ResourceSetForm
    list_display = ["name", "slug", "source", "enabled", "capability_names", "resource_count", "last_build"]
    list_filter = ["enabled", "source"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    readonly_fields = ["published"]
    actions = ["rebuild", "reconcile"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(resource_total=Count("resources", distinct=True))

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
        lists = obj.changelists.count()
        if lists and obj.has_capability("changelist"):
            events = obj.changes.count()
            rows.append((uris.document_uri(obj, DOCUMENT_NAMES["changelist"]), "changelist", f"{events} change(s) in {lists} list(s)"))
        packages = obj.changedump_packages.order_by("-number")
        if packages and obj.has_capability("changedump"):
            latest = packages[0]
            rows.append(
                (uris.document_uri(obj, DOCUMENT_NAMES["changedump"]), "changedump", f"{len(packages)} package(s), the latest until {latest.until:%Y-%m-%d %H:%M:%S}Z")
            )
        for capability, name in DOCUMENT_NAMES.items():
            build = current_build(obj, capability)
            if build:
                rows.append(
                    (
                        uris.document_uri(obj, name),
                        capability,
                        f"{build.entries} entries in {build.documents} file(s), at {build.at:%Y-%m-%d %H:%M:%S}Z",
                    )
                )
        return format_html("<ul>{}</ul>", format_html_join("", '<li><a href="{}">{}</a> {}</li>', rows))

    @admin.action(description=_("Rebuild the selected sets now"))
    def rebuild(self, request, queryset):
        from .tasks import rebuild_set_task

        for resource_set in queryset:
            rebuild_set_task.delay(resource_set.pk)
        self.message_user(request, _("Rebuild queued for %(n)d set(s).") % {"n": queryset.count()}, messages.SUCCESS)

    @admin.action(description=_("Reconcile the selected sets with the site's data"))
    def reconcile(self, request, queryset):
        from .tasks import reconcile_set_task

        for resource_set in queryset:
            reconcile_set_task.delay(resource_set.pk)
        self.message_user(request, _("Reconcile queued for %(n)d set(s).") % {"n": queryset.count()}, messages.SUCCESS)


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
    list_display = ["pk", "resource_set", "capability", "status", "parts_done", "entries", "documents", "at", "completed", "finished"]
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
