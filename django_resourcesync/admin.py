import logging

from celery.result import EagerResult
from django import forms
from django.apps import apps
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views import main as changelist
from django.core.exceptions import EmptyResultSet, FieldDoesNotExist, PermissionDenied, ValidationError
from django.db import models
from django.db.models import Count, Max, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.defaultfilters import filesizeformat
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import escape, format_html, format_html_join
from django.utils.timesince import timesince
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext, ngettext_lazy

from . import access, capabilities, charts, overview, running, uris, versions
from .builders import changedump
from .capabilities import CAPABILITY_CHOICES
from .exceptions import NotRegistered
from .models import (
    AccessToken,
    AuditReport,
    Build,
    BuildPart,
    ChangeDumpPackage,
    ChangeEvent,
    ChangeList,
    Delivery,
    Document,
    LeftOut,
    Notification,
    PendingChange,
    Resource,
    ResourceSet,
    Subscription,
    default_capabilities,
)
from .sources import registry
from .tasks import rebuild_set_task, reconcile_set_task
from .validation import validate_resource_set

logger = logging.getLogger(__name__)


def _model_label(source):
    """The model whose objects a source's items are (what its filter's lookups name)."""
    try:
        return registry.get(source).queryset({}).model._meta.label
    except Exception:  # a source whose items() fails is reported by the set's builds, not the form
        return "?"


class ResourceSetForm(forms.ModelForm):
    source = forms.ChoiceField(label=_("Source"), choices=(), help_text=_("A registered resource source."))
    capabilities = forms.MultipleChoiceField(
        label=_("Capabilities"),
        choices=CAPABILITY_CHOICES,
        widget=forms.CheckboxSelectMultiple,
        required=False,
        initial=default_capabilities,
    )

    class Meta:
        model = ResourceSet
        fields = [
            "name", "slug", "source", "lookups", "describedby", "capabilities", "prior_versions", "access", "enabled", "position",
        ]

    def clean_access(self):
        # Left out of the form (a form or script of before): a set keeps its access, a new one is public.
        if self.cleaned_data.get("access"):
            return self.cleaned_data["access"]
        return self.instance.access if self.instance.pk else "public"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["source"].choices = [(name, name) for name in registry.names()]
        if "access" in self.fields:
            self.fields["access"].required = False  # left out (a form or script of before): public

        # Help texts are HTML in the admin: written here so that none of their text is taken for a
        # tag. (A manager who may only view sets gets a form without these fields.)
        if "slug" in self.fields:
            self.fields["slug"].help_text = escape(_("Part of the set's URIs: /resourcesync/<slug>/capabilitylist.xml"))
        if "lookups" in self.fields:
            self.fields["lookups"].help_text = format_html(
                "{} {}", _('Queryset lookups on the source\'s items, as a JSON object, e.g. {"pk__in": [1, 2, 3]}.'),
                _("The items of each source: %(models)s.") % {"models": ", ".join(
                    f"{name}: {_model_label(name)}" for name in registry.names()
                )},
            )

    def clean(self):
        """What makes the set publishable (see :func:`~django_resourcesync.validation.validate_resource_set`,
        which the REST API runs too): each problem an error on its field, never a 500 on save or
        a failed build later."""
        cleaned = super().clean()
        try:
            validate_resource_set(
                source=cleaned.get("source"), lookups=cleaned.get("lookups"), capabilities=cleaned.get("capabilities") or []
            )
        except ValidationError as exc:
            self.add_error(None, exc)
        return cleaned


def _binds(value):
    """Whether a database can take ``value`` as a parameter: a number within 64 bits (SQLite
    refuses to bind one past them; no column of the app holds one), or anything else."""
    return not isinstance(value, int) or -(2**63) <= value < 2**63


class ChangeListInRange(changelist.ChangeList):
    """The list of an admin page whose query string holds a number no database can take (a set
    or an id past 64 bits, a year past 9999) answers as the admin answers any filter it cannot
    apply, with the redirect to ``?e=1``, never a 500. Django guards the lookups on a primary
    key only: a foreign key or an ``__in`` reaches SQLite's binding as it is, a year past what a
    date holds raises when the query is compiled, and the date hierarchy lets a year past a C
    int through. So the list's query is compiled here, once, and its numbers checked, before
    anything runs it."""

    def get_queryset(self, request, exclude_parameters=None):
        try:
            queryset = super().get_queryset(request, exclude_parameters)
        except OverflowError as exc:  # the date hierarchy's ?datetime__year=10**30
            raise IncorrectLookupParameters(exc) from exc
        try:
            _sql, params = queryset.query.get_compiler(queryset.db).as_sql()
        except EmptyResultSet:  # a lookup Django found can match nothing (?id=10**30): an empty list
            return queryset
        except (ValueError, OverflowError) as exc:  # ?created__year=10000
            raise IncorrectLookupParameters(exc) from exc
        if not all(map(_binds, params)):
            raise IncorrectLookupParameters(_("A number past what a database holds."))
        return queryset


class NumbersInRange:
    """Bad numbers in the requests of the app's admin pages answered as Django answers bad
    input elsewhere, never a 500: a filter through :class:`ChangeListInRange`; an id of the
    selection of an action that names no object (past 64 bits, not a number) is left out, as
    the id of an object deleted meanwhile is; with none left, Django says nothing is selected.
    A site's own ``ModelAdmin`` may take it too, as the example project's do."""

    def get_changelist(self, request, **kwargs):
        return ChangeListInRange

    def response_action(self, request, queryset, *args, **kwargs):
        # (Django 6.1 passes where the action was chosen, too: whatever it passes goes on.)
        selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
        kept = [value for value in selected if self._names_an_object(value)]
        if len(kept) < len(selected):
            request.POST = request.POST.copy()
            request.POST.setlist(ACTION_CHECKBOX_NAME, kept)
        return super().response_action(request, queryset, *args, **kwargs)

    def _names_an_object(self, value):
        try:
            return _binds(self.model._meta.pk.to_python(value))
        except ValidationError:
            return False


class Dates:
    """Every date of the app's admin pages in one format, with seconds, in the site's time zone
    (``2026-11-23 06:08:39 UTC``), whatever the site's ``DATETIME_FORMAT``: a manager compares
    them at a glance, each on one line. The model's date fields named in ``list_display``,
    ``fields`` and ``readonly_fields`` are shown through :func:`when`."""

    _columns = {}

    def _dated(self, names):
        return [self._column(name) if isinstance(name, str) and self._is_datetime(name) else name for name in names]

    def _is_datetime(self, name):
        try:
            return isinstance(self.model._meta.get_field(name), models.DateTimeField)
        except FieldDoesNotExist:
            return False

    def _column(self, name):
        key = (self.model, name)
        if key not in self._columns:
            def column(obj):
                return format_html('<span class="resourcesync-when">{}</span>', when(getattr(obj, name)))

            column.__name__ = name
            self._columns[key] = admin.display(
                description=self.model._meta.get_field(name).verbose_name, ordering=name
            )(column)
        return self._columns[key]

    def get_list_display(self, request):
        return self._dated(super().get_list_display(request))

    def get_fields(self, request, obj=None):
        return self._dated(super().get_fields(request, obj))

    def get_readonly_fields(self, request, obj=None):
        return self._dated(super().get_readonly_fields(request, obj))


def when(value):
    """A datetime in the one format of the app's admin pages; — for none."""
    if value is None:
        return "—"
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z")


def ago(value, depth=2):
    """How long ago, in ``depth`` units at most (``1 month, 1 week``), with the exact time in the tooltip."""
    if value is None:
        return "—"
    return format_html('<span title="{}">{}</span>', when(value), _("%(time)s ago") % {"time": timesince(value, depth=depth)})


def link(uri, text=None):
    """A URI as a link, the whole URI in its tooltip (only http(s) and paths: a value from the
    data never becomes a script link)."""
    if not uri:
        return "—"
    if not str(uri).lower().startswith(("http://", "https://", "/")):
        return uri
    return format_html('<a href="{}" class="resourcesync-uri" title="{}">{}</a>', uri, uri, text or uri)


def size(value):
    return "—" if value is None else filesizeformat(value)


#: The capabilities the list of sets shows a row of (the others: a line naming them).
MAIN_CAPABILITIES = (capabilities.RESOURCELIST, capabilities.CHANGELIST, capabilities.RESOURCEDUMP, capabilities.CHANGEDUMP)

STATE_CLASSES = {
    overview.PUBLISHED: "published", overview.BUILDING: "building", overview.FAILED: "failed", overview.NOT_BUILT: "not-built",
}


def state_badge(state):
    css = STATE_CLASSES[state.state]
    return format_html('<span class="resourcesync-state resourcesync-state-{}">{}</span>', css, _(state.state))


def failure_link(state):
    if state.failure is None:
        return ""
    url = reverse("admin:resourcesync_build_change", args=[state.failure.pk])
    return format_html(
        '<a href="{}" class="resourcesync-failure" title="{}">{}</a>', url, when(state.failure.finished), state.reason
    )


class SetsChangeList(ChangeListInRange):
    """The list of sets: each set of the page is fetched with the date of its Change Dump, as
    ``with_published()`` fetches it (the one date of a document the list reads from its builder;
    the others its columns read from the builds), and what its columns show is read for all of
    the page's sets at once (:meth:`ResourceSetAdmin.read_columns`), in as many queries for 20
    sets as for one. Read at each request: nothing is kept from one to the next."""

    def get_queryset(self, request, exclude_parameters=None):
        changedump = capabilities.get(capabilities.CHANGEDUMP)
        return super().get_queryset(request, exclude_parameters).annotate(
            **{changedump.annotation: changedump.builder.published_expression()}
        )

    def get_results(self, request):
        super().get_results(request)
        self.model_admin.read_columns(self.result_list)


@admin.register(ResourceSet)
class ResourceSetAdmin(NumbersInRange, admin.ModelAdmin):
    """The sets, with what each publishes at a glance: per capability its state, when what is
    served was made, its entries and size, and why the last build failed; the changes waiting
    and made; a chart of the last 30 days. The set's page has buttons to rebuild and reconcile."""

    form = ResourceSetForm
    list_display = ["set_name", "overview_table", "activity_column", "resource_count", "last_audit"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    readonly_fields = ["overview", "audit_report"]
    actions = ["rebuild", "reconcile"]

    class Media:
        css = {"all": ["resourcesync/admin.css"]}

    def changelist_view(self, request, extra_context=None):
        """The sets, under a line saying where the app's tasks run, and a warning when pending
        changes have waited for more than a minute, with the reason (check resourcesync.W016)."""
        try:
            late = running.stalled()
        except Exception:  # the page shows the sets all the same
            logger.warning("Could not tell whether pending changes are stalled", exc_info=True)
            late = None
        if late is not None:
            self.message_user(request, ngettext(
                "%(n)d pending change has waited since %(since)s UTC: %(why)s.",
                "%(n)d pending changes have waited since %(since)s UTC: %(why)s.", late.count,
            ) % {"n": late.count, "since": f"{late.since:%Y-%m-%d %H:%M:%S}", "why": late.reason}, messages.WARNING)
        current = running.mode()
        context = {"resourcesync_tasks": {"mode": current.name, "reason": current.reason}, **(extra_context or {})}
        return super().changelist_view(request, extra_context=context)

    def get_changelist(self, request, **kwargs):
        return SetsChangeList

    def read_columns(self, sets):
        """What the list's columns show of each of ``sets``, read for all of them at once and
        kept on each (a set not read this way reads its own when its row is shown)."""
        sets = list(sets)
        states = overview.states_of(sets, only=MAIN_CAPABILITIES)
        activities = overview.activities(sets)
        pending = overview.pending_counts(sets)
        audits = {report.resource_set_id: report for report in AuditReport.objects.filter(pk__in=(
            AuditReport.objects.filter(resource_set__in=sets).values("resource_set").annotate(last=Max("pk")).values("last")
        ))}
        for resource_set in sets:
            resource_set._resourcesync_row = (states[resource_set.pk], activities[resource_set.pk], pending[resource_set.pk])
            resource_set._last_audit = audits.get(resource_set.pk)

    def _row(self, obj):
        """``(capability states, activity, pending changes)`` of the list's row of ``obj``."""
        if not hasattr(obj, "_resourcesync_row"):
            self.read_columns([obj])
        return obj._resourcesync_row

    def get_queryset(self, request):
        # Counted by subqueries: one join of both tables would multiply their rows.
        resources = Resource.objects.filter(resource_set=OuterRef("pk")).order_by().values("resource_set").annotate(n=Count("pk"))
        left_out = LeftOut.objects.filter(resource_set=OuterRef("pk")).order_by().values("resource_set").annotate(n=Count("pk"))
        return super().get_queryset(request).annotate(
            resource_total=Coalesce(Subquery(resources.values("n")), 0),
            left_out_total=Coalesce(Subquery(left_out.values("n")), 0),
        )

    def get_fieldsets(self, request, obj=None):
        fields = [
            "name", "slug", "source", "lookups", "describedby", "capabilities", "prior_versions", "access", "enabled", "position",
        ]
        if obj is None:
            return [(None, {"fields": fields})]
        return [(_("What it publishes"), {"fields": ["overview"]}), (_("As a Destination sees it"), {"fields": ["audit_report"]}),
                (_("Settings"), {"fields": fields})]

    def _last_audit(self, obj):
        if not hasattr(obj, "_last_audit"):
            obj._last_audit = AuditReport.objects.filter(resource_set=obj).order_by("-pk").first()
        return obj._last_audit

    @admin.display(description=_("last audit"))
    def last_audit(self, obj):
        """The last self-audit's verdict (manage.py resourcesync_audit, the task resourcesync.audit)."""
        report = self._last_audit(obj)
        if report is None:
            return format_html('<span class="resourcesync-quiet">{}</span>', _("never"))
        count = len(report.problems)
        verdict = _("OK") if not count else ngettext("%(count)d problem", "%(count)d problems", count) % {"count": count}
        state = "published" if not report.problems else "failed"
        return format_html('<span class="resourcesync-state resourcesync-state-{}" title="{}">{}</span> {}', state,
                           when(report.finished), verdict, _("%(age)s ago") % {"age": timesince(report.finished, depth=1)})

    @admin.display(description=_("last audit"))
    def audit_report(self, obj):
        """The last self-audit of the set: its problems, one a line, and what it checked."""
        report = self._last_audit(obj)
        if report is None:
            return _("Never audited: run manage.py resourcesync_audit, or schedule the task resourcesync.audit.")
        summary = _("%(documents)s, %(resources)s and %(packages)s checked at %(base)s, %(when)s.") % {
            "documents": ngettext("%(n)d document", "%(n)d documents", report.documents) % {"n": report.documents},
            "resources": ngettext("%(n)d resource", "%(n)d resources", report.resources) % {"n": report.resources},
            "packages": ngettext("%(n)d package", "%(n)d packages", report.packages) % {"n": report.packages},
            "base": report.base, "when": when(report.finished),
        }
        if not report.problems:
            return format_html("<strong>{}</strong> {}", _("No problem."), summary)
        return format_html("<ul>{}</ul>{}", format_html_join("", "<li><code>{}</code>: {}</li>", report.problems), summary)

    @admin.display(description=_("set"), ordering="name")
    def set_name(self, obj):
        return format_html(
            '<strong>{}</strong><div class="resourcesync-quiet"><span class="resourcesync-pair">{} {}</span> · '
            '<span class="resourcesync-pair">{} {}</span></div>{}{}', obj.name, _("slug:"), obj.slug, _("source:"), obj.source,
            "" if obj.enabled else format_html(
                ' <span class="resourcesync-state resourcesync-state-not-built">{}</span>', _("disabled")
            ),
            "" if obj.is_public else format_html(
                ' <span class="resourcesync-state resourcesync-state-building" title="{}">{}</span>',
                _("Read with a token only (see Partner access tokens)"), _("for partners"),
            ),
        )

    @admin.display(description=_("resources"), ordering="resource_total")
    def resource_count(self, obj):
        """The resources listed, and the objects among the set's items that cannot be
        published, linked to their reasons."""
        if not obj.left_out_total:
            return obj.resource_total
        return format_html(
            '{}<br><a href="{}?resource_set__id__exact={}" class="resourcesync-failure">{}</a>', obj.resource_total,
            reverse("admin:resourcesync_leftout_changelist"), obj.pk,
            _("%(n)d left out") % {"n": obj.left_out_total},
        )

    @admin.display(description=_("changes: day / week"))
    def activity_column(self, obj):
        """The changes of the last day and week, the last 30 days drawn, and what waits."""
        _states, activity, pending = self._row(obj)
        waiting = "" if not pending else format_html(
            '<br><a href="{}?source__exact={}">{}</a>', reverse("admin:resourcesync_pendingchange_changelist"), obj.source,
            _("%(n)d pending") % {"n": pending},
        )
        return format_html(
            '<div class="resourcesync-counts">{} / {}</div>{}{}',
            activity.last_day, activity.last_week, charts.activity_svg(activity, width=120, height=28, detailed=False), waiting,
        )

    @admin.display(description=_("capabilities: state, made, entries, size, last failure"))
    def overview_table(self, obj):
        """Each document capability: state, age of what is served, entries, size, the last
        failure; the archives and notification channels it offers, named in one line."""
        states, _activity, _pending = self._row(obj)
        others = [capability.label for capability in capabilities.TABLE
                  if obj.has_capability(capability.name) and capability.name not in MAIN_CAPABILITIES]
        if not states and not others:
            return "—"
        also = "" if not others else format_html(
            '<div class="resourcesync-quiet">{} {}</div>', _("Also:"), ", ".join(str(label) for label in others)
        )
        # The list is read at a glance and must fit a laptop's window: ages in one unit, and a
        # failure's reason on a row of its own under its capability, the width of the others.
        rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>{}", (
            (link(state.uri, state.capability.label) if obj.enabled and state.served
             else state.capability.label,
             state_badge(state), ago(state.published, depth=1), "—" if state.entries is None else state.entries,
             size(state.bytes), "" if state.failure is None else format_html(
                 '<tr class="resourcesync-failure-row"><td></td><td colspan="4">{}</td></tr>', failure_link(state)))
            for state in states
        ))
        return format_html('<table class="resourcesync-overview resourcesync-compact">{}</table>{}', rows, also)

    @admin.display(description=_("published documents"))
    def overview(self, obj):
        """The set's page: every capability in full, the changes, the chart, the version store."""
        if obj.pk is None:
            return "—"
        capability_list = uris.capability_list_uri(obj)
        head = format_html(
            "<p>{} {}</p>", _("Capability List:"),
            link(capability_list) if obj.enabled else _("not published (the set is disabled)"),
        )
        rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", (
            (state.capability.label, state_badge(state),
             link(state.uri, state.uri.rsplit("/", 1)[-1]) if obj.enabled and state.served else "—",
             ago(state.published), "—" if state.entries is None else state.entries, size(state.bytes),
             format_html("{}{}", failure_link(state), state.note or ""))
            for state in overview.capability_states(obj)
        ))
        table = format_html(
            '<table class="resourcesync-overview"><thead><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th>'
            "<th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>",
            _("capability"), _("state"), _("document"), _("made"), _("entries"), _("size"), _("notes"), rows,
        )
        activity = overview.activity(obj)
        pending = overview.pending_changes(obj).count()
        changes = format_html(
            "<p>{}</p>{}",
            _("Changes: %(day)d in the last day, %(week)d in the last week; %(pending)d waiting to be processed.")
            % {"day": activity.last_day, "week": activity.last_week, "pending": pending},
            charts.activity_svg(activity),
        )
        try:
            held = versions.held(obj)
        except NotRegistered:  # the set's source is gone (check resourcesync.W003 says so)
            held = None
        store = "" if held is None else format_html(
            "<p>{}</p>",
            _("Version store: %(versions)s, %(size)s, of %(changes)s.") % {
                "versions": ngettext("%(n)d version", "%(n)d versions", held["versions"]) % {"n": held["versions"]},
                "size": filesizeformat(held["bytes"]),
                "changes": ngettext("%(n)d change", "%(n)d changes", held["changes"]) % {"n": held["changes"]},
            },
        )
        return format_html("{}{}{}{}", head, table, changes, store)

    def get_deleted_objects(self, objs, request):
        """A manager who may delete sets may delete one with what the app recorded of it (its
        builds, change log, subscriptions…): those records are read-only in the admin, so no
        one holds a permission to delete them, and Django would otherwise refuse."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        own = {str(model._meta.verbose_name) for model in apps.get_app_config("resourcesync").get_models()
               if model is not ResourceSet}
        return deleted, counts, {name for name in perms_needed if str(name) not in own}, protected

    def get_urls(self):
        view = self.admin_site.admin_view
        own = [
            path("<int:pk>/rebuild/", view(self.rebuild_view), name="resourcesync_resourceset_rebuild"),
            path("<int:pk>/reconcile/", view(self.reconcile_view), name="resourcesync_resourceset_reconcile"),
        ]
        return own + super().get_urls()

    def rebuild_view(self, request, pk):
        return self._button(request, pk, self.rebuild)

    def reconcile_view(self, request, pk):
        return self._button(request, pk, self.reconcile)

    def _button(self, request, pk, action):
        """A button of the set's page (POST only): run the action on the set, come back with its message."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        resource_set = self.get_object(request, str(pk))
        if resource_set is None:
            raise Http404(_("No such resource set."))
        if not self.has_change_permission(request, resource_set):
            raise PermissionDenied
        action(request, ResourceSet.objects.filter(pk=resource_set.pk))
        return HttpResponseRedirect(reverse("admin:resourcesync_resourceset_change", args=[resource_set.pk]))

    @admin.action(description=_("Rebuild the selected sets now"), permissions=["change"])
    def rebuild(self, request, queryset):
        for resource_set in queryset.filter(enabled=False):
            self.message_user(
                request, _("“%(set)s” is disabled: it publishes nothing, so it is not rebuilt. Enable it first.")
                % {"set": resource_set}, messages.ERROR,
            )
        queryset = queryset.filter(enabled=True)
        self.send_task(
            request, queryset, rebuild_set_task,
            failed=_("Rebuilding “%(set)s” failed: %(error)s"),
            ran=ngettext_lazy("Rebuilt %(n)d set.", "Rebuilt %(n)d sets.", "n"),
            queued=ngettext_lazy("Rebuild queued for %(n)d set.", "Rebuild queued for %(n)d sets.", "n"),
        )

    @admin.action(description=_("Reconcile the selected sets with the site's data"), permissions=["change"])
    def reconcile(self, request, queryset):
        self.send_task(
            request, queryset, reconcile_set_task,
            failed=_("Reconciling “%(set)s” failed: %(error)s"),
            ran=ngettext_lazy("Reconciled %(n)d set.", "Reconciled %(n)d sets.", "n"),
            queued=ngettext_lazy("Reconcile queued for %(n)d set.", "Reconcile queued for %(n)d sets.", "n"),
        )

    def send_task(self, request, queryset, task, *, failed, ran, queued):
        """Send ``task`` for each selected set and say what happened. With tasks run in process
        (``CELERY_TASK_ALWAYS_EAGER``: the demo, the tests) the work is done in this request, so a
        set that fails (a full disk, a broken filter), like a broker that cannot be reached, is an
        error message naming the set, never a 500, and the other sets go on. A rebuild that ran
        but left a build failed says so too."""
        done = sent = 0
        for resource_set in queryset:
            newest = Build.objects.filter(resource_set=resource_set).order_by("-pk").values_list("pk", flat=True).first() or 0
            try:
                result = running.send(task, resource_set.pk)
                if isinstance(result, EagerResult):
                    result.get()  # raises the task's error when CELERY_TASK_EAGER_PROPAGATES is off
            except Exception as exc:
                reason = overview.one_line(str(exc)) or exc
                self.message_user(request, failed % {"set": resource_set, "error": reason}, messages.ERROR)
                continue
            if isinstance(result, EagerResult) or running.mode().in_process:
                failures = Build.objects.filter(resource_set=resource_set, pk__gt=newest, status=Build.Status.FAILED)
                for build in failures:
                    reason = overview.one_line(build.error)
                    self.message_user(request, failed % {"set": resource_set, "error": reason}, messages.ERROR)
                if not failures:
                    done += 1
            else:
                sent += 1
        if done:
            self.message_user(request, ran % {"n": done}, messages.SUCCESS)
        if sent:
            self.message_user(request, queued % {"n": sent}, messages.SUCCESS)


class ReadOnlyAdmin(NumbersInRange, Dates, admin.ModelAdmin):
    """The app's own records: they are what is published, so the admin only shows them."""

    class Media:
        css = {"all": ["resourcesync/admin.css"]}

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyInline(Dates, admin.TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


class DocumentInline(ReadOnlyInline):
    model = Document
    fields = ["served_at", "is_index", "entries", "human_size", "at", "completed", "withdrawn"]
    readonly_fields = fields

    @admin.display(description=_("document"))
    def served_at(self, obj):
        return link(uris.document_uri(obj.resource_set, obj.name), obj.name)

    @admin.display(description=_("size"))
    def human_size(self, obj):
        return size(obj.size)


class BuildPartInline(ReadOnlyInline):
    """The parts of a build rendered in parts: which are done, and how often each was started."""

    model = BuildPart
    fields = ["number", "after_pk", "last_pk", "attempts", "done", "documents", "entries", "report"]
    readonly_fields = fields


@admin.register(Build)
class BuildAdmin(ReadOnlyAdmin):
    list_display = ["pk", "resource_set", "capability", "status", "parts_done", "reason", "entries", "at", "finished"]
    list_filter = ["status", "capability", "resource_set"]
    fields = [
        "resource_set", "capability", "status", "failure", "at", "completed", "entries", "documents", "parts_done",
        "started", "finished", "report",
    ]
    readonly_fields = ["parts_done", "failure"]
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

    @admin.display(description=_("why it failed"))
    def reason(self, obj):
        return overview.one_line(obj.error) or "—"

    @admin.display(description=_("why it failed"))
    def failure(self, obj):
        """The reason in one line, the traceback folded under it."""
        if not obj.error:
            return "—"
        return format_html(
            '<p class="resourcesync-failure">{}</p><details><summary>{}</summary><pre class="resourcesync-traceback">{}</pre>'
            "</details>", overview.one_line(obj.error), _("traceback"), obj.error,
        )


@admin.register(Resource)
class ResourceAdmin(ReadOnlyAdmin):
    list_display = ["id", "resource", "resource_set", "lastmod", "human_length", "media_type"]
    list_filter = ["resource_set"]
    search_fields = ["uri"]
    show_full_result_count = False

    @admin.display(description=_("URI"), ordering="uri")
    def resource(self, obj):
        return link(obj.uri)

    @admin.display(description=_("length"), ordering="length")
    def human_length(self, obj):
        return size(obj.length)


@admin.register(ChangeEvent)
class ChangeEventAdmin(ReadOnlyAdmin):
    """The change log: read-only, filterable by set, kind of change and date."""

    list_display = ["id", "datetime", "change", "resource", "resource_set", "changelist_number"]
    list_filter = ["resource_set", "change"]
    date_hierarchy = "datetime"
    search_fields = ["uri"]
    list_select_related = ["resource_set", "changelist"]
    show_full_result_count = False

    @admin.display(description=_("change list"), ordering="changelist__number")
    def changelist_number(self, obj):
        return obj.changelist.number

    @admin.display(description=_("URI"), ordering="uri")
    def resource(self, obj):
        return link(obj.uri)


@admin.register(ChangeDumpPackage)
class ChangeDumpPackageAdmin(ReadOnlyAdmin):
    """The packages of a set's Change Dump: which changes each carries, and its size."""

    list_display = ["number", "resource_set", "package", "from_time", "until", "entries", "human_size", "withdrawn", "archived"]
    list_filter = ["resource_set"]
    fields = [
        "resource_set", "number", "package", "from_time", "until", "first_event", "last_event", "entries", "human_size",
        "sha256", "written", "withdrawn", "archived",
    ]
    readonly_fields = ["package", "human_size"]

    @admin.display(description=_("package"))
    def package(self, obj):
        name = changedump.package_name(obj.number)
        if obj.withdrawn or obj.archived:
            return name
        return link(uris.document_uri(obj.resource_set, name), name)

    @admin.display(description=_("size"), ordering="size")
    def human_size(self, obj):
        return size(obj.size)


@admin.register(PendingChange)
class PendingChangeAdmin(ReadOnlyAdmin):
    """The outbox: objects saved or deleted whose change is not yet in the log. Processing
    empties it within seconds; rows that stay say a set fails to apply them (see its builds)."""

    list_display = ["id", "source", "object_pk", "related", "recorded", "resource_set"]
    list_filter = ["source"]
    search_fields = ["object_pk"]
    show_full_result_count = False


@admin.register(ChangeList)
class ChangeListAdmin(ReadOnlyAdmin):
    list_display = ["resource_set", "number", "from_time", "until", "entries", "archived"]
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


class AccessTokenForm(forms.ModelForm):
    class Meta:
        model = AccessToken
        fields = ["name", "sets", "expires"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "sets" in self.fields:
            self.fields["sets"].queryset = ResourceSet.objects.filter(access=access.TOKEN)
            self.fields["sets"].help_text = _("The sets for partners with a token that it opens.")


@admin.register(AccessToken)
class AccessTokenAdmin(NumbersInRange, admin.ModelAdmin):
    """Tokens issued to Destinations (partners) for the restricted sets, named apart from the REST
    framework's tokens of API users. Issuing one shows the token once; only its digest is kept.
    Revoking takes effect at once."""

    form = AccessTokenForm
    list_display = ["name", "prefix", "set_slugs", "state", "expires", "last_used", "created"]

    class Media:
        css = {"all": ["resourcesync/admin.css"]}

    list_filter = ["sets"]
    search_fields = ["name", "prefix"]
    readonly_fields = ["prefix", "created", "revoked", "last_used", "state"]
    actions = ["revoke"]

    def get_fields(self, request, obj=None):
        return ["name", "sets", "expires"] if obj is None else ["name", "prefix", "sets", "expires", "state", "created",
                                                               "revoked", "last_used"]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("sets")

    @admin.display(description=_("sets"))
    def set_slugs(self, obj):
        return ", ".join(s.slug for s in obj.sets.all())

    @admin.display(description=_("state"))
    def state(self, obj):
        return obj.state()

    def save_model(self, request, obj, form, change):
        if not change:
            # A new token: made here, kept as its digest; the page after this shows it once.
            token, kept = access.new_token()
            obj.digest, obj.prefix = kept["digest"], kept["prefix"]
            request._resourcesync_issued = token
        super().save_model(request, obj, form, change)

    def response_add(self, request, obj, post_url_continue=None):
        token = getattr(request, "_resourcesync_issued", None)
        if token is None:
            return super().response_add(request, obj, post_url_continue)
        access.logger.info("Token %s… issued to %s in the admin by %s", obj.prefix, obj.name, request.user)
        context = {
            **self.admin_site.each_context(request), "opts": self.opts, "record": obj, "token": token,
            "sets": ", ".join(s.slug for s in obj.sets.all()) or "-",
        }
        response = TemplateResponse(request, "admin/resourcesync/accesstoken/issued.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description=_("Revoke the selected tokens"), permissions=["change"])
    def revoke(self, request, queryset):
        count = access.revoke(queryset)
        self.message_user(
            request, ngettext("%(count)d token revoked.", "%(count)d tokens revoked.", count) % {"count": count},
            messages.SUCCESS,
        )
