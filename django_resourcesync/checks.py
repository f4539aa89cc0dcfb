"""System checks: every misconfiguration a site owner can make, reported with a hint."""

import re
import sys
from collections.abc import Mapping
from urllib.parse import urlsplit

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, Info, Tags, Warning, register
from django.core.exceptions import FieldError, ImproperlyConfigured
from django.db import DatabaseError
from django.http.request import validate_host
from django.urls import NoReverseMatch, reverse

from . import capabilities, running, versions
from .clients import parse_proxies
from .conf import DEFAULTS, app_settings, is_rate, source_module_errors
from .links import problems as link_problems
from .models import RESERVED_SLUGS, ResourceSet
from .sources import ResourceSource, ViewSource, registry


@register(Tags.compatibility)
def check_settings(app_configs=None, **kwargs):
    errors = []
    user = getattr(settings, "RESOURCESYNC", None)
    if user is not None and not isinstance(user, dict):
        return [
            Error(
                "settings.RESOURCESYNC must be a dict.",
                hint='RESOURCESYNC = {"BASE_URL": "https://…"}',
                id="resourcesync.E001",
            )
        ]
    unknown = app_settings.unknown_keys()
    if unknown:
        errors.append(
            Error(
                f"Unknown key(s) in settings.RESOURCESYNC: {', '.join(unknown)}.",
                hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                id="resourcesync.E002",
            )
        )
        return errors
    base = app_settings.BASE_URL
    parts = urlsplit(base or "")
    if not base:
        errors.append(
            Error(
                "RESOURCESYNC['BASE_URL'] is not set.",
                hint="Set it to the absolute base of the site's URIs, e.g. 'https://repository.example.org'.",
                id="resourcesync.E003",
            )
        )
    elif parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query or parts.fragment:
        errors.append(
            Error(
                f"RESOURCESYNC['BASE_URL'] = {base!r} is not an http(s) scheme and host.",
                hint="Give scheme, host and optional port only, e.g. 'https://repository.example.org'.",
                id="resourcesync.E004",
            )
        )
    elif not validate_host(parts.hostname or "", settings.ALLOWED_HOSTS) and not settings.DEBUG:
        errors.append(
            Error(
                f"The host of RESOURCESYNC['BASE_URL'] ({parts.hostname}) is not in ALLOWED_HOSTS.",
                hint="Pages the app renders to hash them (ViewSource) would answer 400 and be left out; "
                "add the host to ALLOWED_HOSTS.",
                id="resourcesync.E016",
            )
        )
    alias = app_settings.STORAGE
    if alias not in settings.STORAGES:
        errors.append(
            Error(
                f"RESOURCESYNC['STORAGE'] = {alias!r} is not an alias in settings.STORAGES.",
                hint=f"Use one of: {', '.join(sorted(settings.STORAGES))}, or add {alias!r} to STORAGES.",
                id="resourcesync.E005",
            )
        )
    positive = (
        "MAX_ENTRIES_PER_DOCUMENT", "MAX_DOCUMENT_BYTES", "BATCH_SIZE", "DUMP_PACKAGE_BYTES", "BUILD_LOCK_TIMEOUT",
        "PART_TIMEOUT", "BUILD_THREADS",
    )
    for key in positive:
        value = getattr(app_settings, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            errors.append(
                Error(
                    f"RESOURCESYNC['{key}'] must be a positive integer.",
                    hint=f"Default: {DEFAULTS[key]}.",
                    id="resourcesync.E006",
                )
            )
    if isinstance(app_settings.MAX_ENTRIES_PER_DOCUMENT, int) and app_settings.MAX_ENTRIES_PER_DOCUMENT > 50_000:
        errors.append(
            Error(
                "RESOURCESYNC['MAX_ENTRIES_PER_DOCUMENT'] is above 50,000, the sitemaps limit Destinations rely on.",
                hint="Use 50000 or less.",
                id="resourcesync.E007",
            )
        )
    if isinstance(app_settings.MAX_DOCUMENT_BYTES, int) and not 10_000 <= app_settings.MAX_DOCUMENT_BYTES <= 50 * 1024 * 1024:
        errors.append(
            Error(
                "RESOURCESYNC['MAX_DOCUMENT_BYTES'] must be between 10,000 and 52,428,800 (50 MB).",
                hint="Use 52428800 or less.",
                id="resourcesync.E008",
            )
        )
    attempts = app_settings.PART_ATTEMPTS
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        errors.append(
            Error(
                f"RESOURCESYNC['PART_ATTEMPTS'] = {attempts!r} is not a positive integer.",
                hint="Default: 3. A part of a parallel build must be allowed to start at least once.",
                id="resourcesync.E019",
            )
        )
    for key in ("KEEP_BUILDS", "SWEEP_GRACE_SECONDS"):
        value = getattr(app_settings, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            errors.append(
                Error(
                    f"RESOURCESYNC['{key}'] must be 0 or more.",
                    hint=f"Default: {DEFAULTS[key]}.",
                    id="resourcesync.E009",
                )
            )
    for key, hint, code in (
        ("BACKGROUND_DISPATCH", "Default: True.", "E018"),
        ("LIST_TOKEN_SETS", "Default: False (the public Source Description does not name the sets for partners with a token).",
         "E028"),
        ("HTML_PAGES", "Default: True (a browser opening a document gets a page made from it).", "E031"),
    ):
        value = getattr(app_settings, key)
        if not isinstance(value, bool):
            errors.append(Error(f"RESOURCESYNC['{key}'] = {value!r} is not True or False.", hint=hint,
                                id=f"resourcesync.{code}"))
    period = app_settings.CHANGELIST_PERIOD
    if not (
        period in ("hourly", "daily", "weekly") or (isinstance(period, int) and not isinstance(period, bool) and period >= 1)
    ):
        errors.append(
            Error(
                f"RESOURCESYNC['CHANGELIST_PERIOD'] = {period!r} is not a period.",
                hint='Use "hourly", "daily", "weekly" or a number of seconds.',
                id="resourcesync.E014",
            )
        )
    retention = app_settings.CHANGELIST_RETENTION
    if retention is not None and (not isinstance(retention, int) or isinstance(retention, bool) or retention < 1):
        errors.append(
            Error(
                f"RESOURCESYNC['CHANGELIST_RETENTION'] = {retention!r} is not a number of seconds.",
                hint="Use a positive number of seconds (30 days: 2592000), or None to keep closed Change Lists forever.",
                id="resourcesync.E015",
            )
        )
    schemes = app_settings.LINK_SCHEMES
    # A string would be read letter by letter; "https:" is not a scheme name.
    if not isinstance(schemes, (list, tuple)) or not all(
        isinstance(s, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", s) for s in schemes
    ):
        errors.append(
            Error(
                f"RESOURCESYNC['LINK_SCHEMES'] = {schemes!r} is not a list or tuple of URI schemes.",
                hint='Give scheme names without the colon, e.g. ("http", "https", "urn"); links with other schemes are left out.',
                id="resourcesync.E021",
            )
        )
    errors += _hub_errors()
    errors += _archive_errors()
    errors += _api_errors()
    errors += _stylesheet_errors()
    try:
        reverse("resourcesync:source-description")
    except NoReverseMatch:
        errors.append(
            Error(
                "The ResourceSync URLs are not included in the URLconf.",
                hint='Add path("", include("django_resourcesync.urls")) to the root urls.py.',
                id="resourcesync.E010",
            )
        )
    else:
        if reverse("resourcesync:source-description") != "/.well-known/resourcesync":
            errors.append(
                Warning(
                    "The Source Description is not served at /.well-known/resourcesync.",
                    hint="Include django_resourcesync.urls at the site root, with no prefix.",
                    id="resourcesync.W001",
                )
            )
    return errors


@register(Tags.database)
def check_sets(app_configs=None, databases=None, **kwargs):
    """Sets that name an unregistered source or a filter the source's queryset rejects.

    Runs where Django runs database checks (``migrate``, ``check --database default``). Warnings,
    not errors: such a set publishes nothing until it is fixed in the admin, but it must not stop
    ``migrate``.
    """
    errors = []
    if not databases:
        return errors
    try:
        sets = list(ResourceSet.objects.all())
    except DatabaseError:  # not migrated yet
        return errors
    for resource_set in sets:
        if resource_set.slug in RESERVED_SLUGS:
            errors.append(
                Warning(
                    f"Resource set {resource_set.slug!r} has a reserved slug: /resourcesync/{resource_set.slug}/ is a "
                    "route of the app, so none of its documents can be fetched.",
                    hint="Give the set another slug in the admin (its documents are then published under it).",
                    obj=resource_set,
                    id="resourcesync.W011",
                )
            )
        if resource_set.source not in registry:
            errors.append(
                Warning(
                    f"Resource set {resource_set.slug!r} names the source {resource_set.source!r}, which is not registered.",
                    hint=f"Registered sources: {', '.join(registry.names()) or 'none'}. "
                    "Register it, or edit the set in the admin.",
                    obj=resource_set,
                    id="resourcesync.W003",
                )
            )
            continue
        if resource_set.source in registry.failures:
            continue  # E029 names the source and its failure
        try:
            resource_set.get_source().queryset(resource_set.lookups).exists()
        except DatabaseError:
            raise  # the database itself: Django's own checks say so
        except Exception as exc:
            errors.append(
                Warning(
                    f"Resource set {resource_set.slug!r} has a filter its source rejects: {exc}",
                    hint="Fix the filter in the admin; it is a JSON object of queryset lookups.",
                    obj=resource_set,
                    id="resourcesync.W004",
                )
            )
            continue
        errors += _check_links(resource_set)
        dumps = capabilities.needing_bytes(resource_set.capabilities or [])
        if dumps and not resource_set.get_source().gives_bytes:
            errors.append(
                Warning(
                    f"Resource set {resource_set.slug!r} offers {', '.join(dumps)}, but its source "
                    f"{resource_set.source!r} gives no bytes (neither file() nor content()): a dump of it would be empty.",
                    hint="Take the dumps off the set in the admin, or give the source a file() or content(); they are not "
                    "built meanwhile.",
                    obj=resource_set,
                    id="resourcesync.W008",
                )
            )
        if resource_set.prior_versions and not versions.publishes(resource_set):
            why = ("RESOURCESYNC['KEEP_VERSIONS'] is off" if not app_settings.KEEP_VERSIONS
                   else f"its source {resource_set.source!r} gives no bytes (neither file() nor content())")
            errors.append(
                Warning(
                    f"Resource set {resource_set.slug!r} is to publish prior versions, but {why}: it publishes none.",
                    hint="Turn KEEP_VERSIONS on (the version store keeps the bytes of each change), or untick "
                    "\"prior versions\" on the set in the admin.",
                    obj=resource_set,
                    id="resourcesync.W009",
                )
            )
        if not resource_set.is_public:
            errors += _token_set_errors(resource_set)
        if resource_set.base_url and app_settings.BASE_URL and resource_set.base_url != app_settings.BASE_URL:
            errors.append(
                Warning(
                    f"Resource set {resource_set.slug!r} was recorded with the base URL {resource_set.base_url}, "
                    f"not RESOURCESYNC['BASE_URL'] = {app_settings.BASE_URL}: its documents list the old URIs.",
                    hint="Run `manage.py resourcesync_rebuild`: it renders every entry again under the new base (changes "
                    "that reach the set meanwhile are listed under it already).",
                    obj=resource_set,
                    id="resourcesync.W006",
                )
            )
    return errors


def _token_set_errors(resource_set):
    """W014 and W015: what would let a set for partners be read without a token."""
    errors = []
    if app_settings.SERVE_BY_REDIRECT:
        errors.append(Warning(
            f"Resource set {resource_set.slug!r} is for partners with a token, and SERVE_BY_REDIRECT is on: the app "
            "streams this set's stored documents and dumps itself, after checking the token, never redirecting to the "
            "storage, whose URLs check no token.",
            hint="Nothing to do if this is what you want; make sure the storage itself is not readable by the public "
            "(S3: a private bucket, querystring_auth on).",
            obj=resource_set, id="resourcesync.W014",
        ))
    if app_settings.HUB_URL and any(capabilities.get(name).channel for name in resource_set.capabilities or []
                                    if name in capabilities.BY_NAME):
        errors.append(Warning(
            f"Resource set {resource_set.slug!r} is for partners with a token and offers notifications, but they go "
            f"through the external hub {app_settings.HUB_URL}, which would hand them to anyone: none of the set's "
            "notifications is sent.",
            hint="Use the built-in hub (RESOURCESYNC['HUB_URL'] = None), which takes subscriptions to a restricted "
            "set's channels with a token only, or take the notification capabilities off the set.",
            obj=resource_set, id="resourcesync.W015",
        ))
    return errors


def _check_links(resource_set):
    """W007: the links ``links()`` gives the set's first object, checked as section 14 and the
    schema require (a link that fails is left out of every entry). A warning, as every check of
    the sets: ``migrate`` runs it."""
    source = resource_set.get_source()
    try:
        obj = source.queryset(resource_set.lookups).order_by("pk").first()
    except (DatabaseError, FieldError, ValueError, TypeError, ImproperlyConfigured):
        return []  # the set's filter or source is reported above, or the database is not ready
    if obj is None:
        return []
    try:
        given, failure = source._get("links", obj, []), None
    except Exception as exc:  # the source's own code (an InvalidLink from a helper): say so
        given, failure = [], exc
    errors = []
    if failure is not None:
        errors.append(Warning(
            f"Resource set {resource_set.slug!r}: links() of its source {resource_set.source!r} failed on object "
            f"{obj.pk}: {type(failure).__name__}: {failure}",
            hint="Fix the source's links(); objects whose entry cannot be made are left out of the set.",
            obj=resource_set, id="resourcesync.W007",
        ))
    for link in given:
        problems = link_problems(link) if isinstance(link, dict) else ["it is not a dict"]
        if problems:
            errors.append(Warning(
                f"Resource set {resource_set.slug!r}: links() of its source {resource_set.source!r} gives object {obj.pk} "
                f"the link {link!r}, which is not valid: {'; '.join(problems)}. Entries leave out the attributes the "
                "schema refuses, or the whole link.",
                hint="Make links with django_resourcesync.links (links.memento(), links.patch()...), which say what "
                "each relation of the spec's section 14 needs.",
                obj=resource_set, id="resourcesync.W007",
            ))
    return errors


@register(Tags.compatibility)
def check_tasks(app_configs=None, **kwargs):
    """I001: where the app's tasks run (see :mod:`.running`); W016: pending changes that wait
    for more than a minute, and why; E030: a ``TASKS`` value the app does not know, or an
    ``EMBEDDED_CATCH_UP_SECONDS`` that is not a number of seconds."""
    try:
        chosen = app_settings.TASKS
        every = app_settings.EMBEDDED_CATCH_UP_SECONDS
    except ImproperlyConfigured:  # RESOURCESYNC itself is wrong: E001 and E002 say so
        return []
    messages = []
    if every is not None and not running.is_interval(every):
        messages.append(Error(
            f"RESOURCESYNC['EMBEDDED_CATCH_UP_SECONDS'] = {every!r} is not a positive number of seconds.",
            hint=f"Default: {DEFAULTS['EMBEDDED_CATCH_UP_SECONDS']} (applied meanwhile). None: a process that serves "
                 "requests looks for the pending changes left by others at its first request only.",
            id="resourcesync.E030",
        ))
    if chosen not in running.CHOICES:
        return [*messages, Error(
            f"RESOURCESYNC['TASKS'] = {app_settings.TASKS!r} is not one of {', '.join(map(repr, running.CHOICES))}.",
            hint='"auto" (the default) sends tasks to Celery workers when the site has a Celery app with a broker '
                 'that answers, and runs them in the process otherwise.',
            id="resourcesync.E030",
        )]
    if _run_by_the_check_command():
        # Said by ``manage.py check`` only: every other command runs the checks too, and would
        # print it before its own output.
        current = running.mode()
        messages.append(Info(f"ResourceSync tasks run {MODE_NAMES[current.name]}: {current.reason}.", id="resourcesync.I001"))
    try:
        # One indexed query, even where Django runs no database check (plain ``check``,
        # ``runserver``): a stalled processing is what a site owner must hear of first.
        late = running.stalled()
    except Exception:  # not migrated yet, no database here, or database access not allowed
        late = None
    if late is not None:
        messages.append(Warning(
            f"{late.count} pending change(s) have waited since {late.since:%Y-%m-%d %H:%M:%S} UTC: {late.reason}.",
            hint="Once the cause is fixed they are processed by the next change, or at once by "
                 "`manage.py resourcesync_reconcile`; nothing is lost meanwhile.",
            id="resourcesync.W016",
        ))
    return messages


def _run_by_the_check_command():
    """Whether these checks run for Django's ``check`` command (``manage.py check`` or
    ``call_command("check")``)."""
    from django.core.management.commands.check import Command

    frame = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), Command):
            return True
        frame = frame.f_back
    return False


#: How I001 names each mode.
MODE_NAMES = {
    running.CELERY: "on Celery workers",
    running.EAGER: "in the calling process (Celery eager mode)",
    running.EMBEDDED: "in this process (embedded mode: changes are processed on a thread after each commit)",
}


@register(Tags.compatibility)
def check_sources(app_configs=None, **kwargs):
    errors = [
        Error(
            f"RESOURCESYNC['SOURCE_MODULES'] names {module!r}, which cannot be imported: {exc}",
            hint="Give the dotted path of a module that registers resource sources.",
            id="resourcesync.E013",
        )
        for module, exc in source_module_errors
    ]
    errors += [
        Error(
            f"Source {name!r} cannot say what it publishes: {type(exc).__name__}: {exc}",
            hint="Fix the source's items() (or set `model` on it, which is then used without calling items()). "
            "Its sets are left unpublished meanwhile; the other sets publish as usual.",
            id="resourcesync.E029",
        )
        for name, exc in sorted(registry.failures.items())
    ]
    errors += _related_lookup_errors(registry)
    errors += _fingerprint_field_errors(registry)
    if not errors and not registry.names():
        return [
            Warning(
                "No resource source is registered, so no set can publish anything.",
                hint="Register a ResourceSource subclass in a resourcesync.py module of one of your apps.",
                id="resourcesync.W002",
            )
        ]
    return errors



def _readable(registry):
    """The registered sources but those that cannot say what they publish (E029)."""
    return [source for source in registry.sources() if registry.models_of(source)]


def _related_lookup_errors(registry):
    """``related_models = {Model: "lookup"}`` whose lookup does not lead from the source's
    objects to that model."""
    errors = []
    for source in _readable(registry):
        if not isinstance(source.related_models, Mapping):
            continue
        for model, lookup in source.related_models.items():
            try:
                source.item_model._base_manager.filter(**{f"{lookup}__in": []}).query
            except (FieldError, TypeError, ValueError) as exc:
                errors.append(
                    Error(
                        f"Source {source.name!r}: related_models maps {model._meta.label} to {lookup!r}, "
                        f"which is not a lookup of {source.item_model._meta.label}: {exc}",
                        hint=f"Give the field path from a {source.item_model._meta.object_name} to its "
                        f"{model._meta.object_name}, as in a queryset filter (for example \"item\" or \"item__collection\").",
                        id="resourcesync.E017",
                    )
                )
    return errors


def _fingerprint_field_errors(registry):
    """``fingerprint_fields`` that a ``values_list()`` of the source's objects cannot read, and
    a ``fingerprint()`` written in vain beside them."""
    errors = []
    for source in _readable(registry):
        fields = source.fingerprint_fields
        if not fields:
            continue
        problem = None
        if isinstance(fields, str) or not all(isinstance(name, str) for name in fields):
            problem = "is not a sequence of field names"
        else:
            try:
                source.items().values_list(*fields)
            except (FieldError, TypeError, ValueError) as exc:
                problem = f"cannot be read from {source.item_model._meta.label}: {exc}"
            else:
                # One value per object: a lookup across a to-many relation gives a row per
                # related object, and the fingerprint would cover only one of them.
                many = [name for name in fields if any(f.many_to_many or f.one_to_many for f in source._lookup_path(name) or ())]
                if many:
                    problem = f"crosses a to-many relation in {', '.join(map(repr, many))}: one value per object is needed"
        if problem:
            errors.append(
                Error(
                    f"Source {source.name!r}: fingerprint_fields = {fields!r} {problem}",
                    hint="Give a tuple of field names or lookups of the source's objects, as for "
                    'values_list() (for example ("title", "modified", "collection__name")).',
                    id="resourcesync.E020",
                )
            )
        elif type(source).fingerprint not in (ResourceSource.fingerprint, ViewSource.fingerprint):
            errors.append(
                Warning(
                    f"Source {source.name!r} defines fingerprint() and fingerprint_fields: the "
                    "fingerprint is made of the fields, and fingerprint() is not called.",
                    hint="Remove one of them; to shape the value made of the fields, override "
                    "fingerprint_of_values(values).",
                    id="resourcesync.W005",
                )
            )
    return errors


def _archive_errors():
    """E025: ARCHIVE_RETENTION, {capability: {"count": n or None, "age": seconds or None}}."""
    rules = app_settings.ARCHIVE_RETENTION
    known = set(capabilities.ARCHIVES.values())

    def whole(value, least):
        return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= least)

    if not isinstance(rules, Mapping) or not set(rules) <= known or not all(
        isinstance(rule, Mapping) and set(rule) <= {"count", "age"} and whole(rule.get("count"), 1)
        and whole(rule.get("age"), 1)
        for rule in rules.values()
    ):
        return [Error(
            f"RESOURCESYNC['ARCHIVE_RETENTION'] = {rules!r} is not a retention per archived capability.",
            hint=f"Give {{capability: {{\"count\": n, \"age\": seconds}}}} for capabilities among {', '.join(sorted(known))}; "
                 "count at least 1, age at least 1 second, or None for no limit.",
            id="resourcesync.E025",
        )]
    return []


#: What the API's pages need besides DRF itself: drf-spectacular's template of the schema page,
#: and the sidecar's scripts and styles, served by the site (never from a CDN).
API_PAGE_APPS = ("rest_framework", "drf_spectacular", "drf_spectacular_sidecar")


def _stylesheet_errors():
    """E027, W012 and W013: the documents' stylesheet (see docs/publishing.rst)."""
    value = app_settings.STYLESHEET
    if value is None or value is False:
        return []
    if value is not True and (not isinstance(value, str) or not value.strip()):
        return [Error(
            f"RESOURCESYNC['STYLESHEET'] must be None, False, True or a URL; got {value!r}.",
            hint="True serves the app's own stylesheet at /resourcesync/resourcesync.xsl; a string names one of the "
                 "site's own, e.g. '/static/resourcesync.xsl'.",
            id="resourcesync.E027",
        )]
    errors = []
    target, base = urlsplit("" if value is True else value), urlsplit(app_settings.BASE_URL or "")
    if target.scheme or target.netloc:
        if (target.scheme, target.netloc) != (base.scheme, base.netloc):
            errors.append(Warning(
                f"RESOURCESYNC['STYLESHEET'] = {value!r} is on another origin than BASE_URL: a browser applies no "
                "stylesheet from another origin and shows the documents as an empty page.",
                hint="Use a path on this site (e.g. '/static/resourcesync.xsl'), or True for the app's own.",
                id="resourcesync.W012",
            ))
    if app_settings.SERVE_BY_REDIRECT:
        errors.append(Warning(
            "RESOURCESYNC['STYLESHEET'] is set with SERVE_BY_REDIRECT: stored documents (Resource Lists, Resource "
            "Dumps, closed Change Lists, manifests) are redirected to the storage, where a browser applies no "
            "stylesheet from the site and may show an empty page.",
            hint="Turn SERVE_BY_REDIRECT off, or set STYLESHEET to None.",
            id="resourcesync.W013",
        ))
    return errors


def _api_errors():
    """E026, E032 and W010: the REST API and the limits per client (see docs/api.rst)."""
    errors = []
    for key in ("API_ANON_RATE", "AUTH_FAILURE_RATE", "HUB_REQUESTS_PER_CLIENT"):
        rate = getattr(app_settings, key)
        if rate is not None and not is_rate(rate):
            errors.append(Error(
                f"RESOURCESYNC['{key}'] = {rate!r} is not a request rate.",
                hint='Give requests per period as DRF writes rates, e.g. "300/minute", "10/second", "1000/day" (a '
                     "positive number, a slash, a period starting with s, m, h or d), or None for no limit. Meanwhile "
                     f"the default, {DEFAULTS[key]}, applies.",
                id="resourcesync.E026",
            ))
    _networks, _unix, refused = parse_proxies(app_settings.TRUSTED_PROXIES)
    if refused:
        errors.append(Error(
            f"RESOURCESYNC['TRUSTED_PROXIES'] = {app_settings.TRUSTED_PROXIES!r} cannot be used: "
            + "; ".join(f"{entry!r} {reason}" for entry, reason in refused) + ".",
            hint='Give a list of the addresses or networks of the proxies in front of the site, e.g. ["127.0.0.1", '
                 '"10.0.0.0/8"] ("unix" for one on a Unix socket), or [] when clients connect to the site directly. '
                 "Meanwhile what cannot be used is not trusted.",
            id="resourcesync.E032",
        ))
    missing = [app for app in API_PAGE_APPS if not apps.is_installed(app)]
    if missing:
        errors.append(Warning(
            f"The REST API's browsable pages and its schema page at /resourcesync/api/schema/ui/ cannot work: "
            f"{', '.join(missing)} not in INSTALLED_APPS.",
            hint=f"Add {', '.join(repr(app) for app in missing)} to INSTALLED_APPS (the packages are installed with "
                 "django-resourcesync). The API itself and its schema at /resourcesync/api/schema/ answer meanwhile.",
            id="resourcesync.W010",
        ))
    return errors


def _hub_errors():
    """E022-E024: the push settings (see docs/notifications.rst and :mod:`.push.limits`)."""
    errors = []
    hub_url = app_settings.HUB_URL
    if hub_url is not None:
        parts = urlsplit(hub_url) if isinstance(hub_url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            errors.append(Error(
                f"RESOURCESYNC['HUB_URL'] = {hub_url!r} is not an http(s) URL.",
                hint="Give the URL of an external WebSub hub, e.g. \"https://hub.example.org/\", or None for the built-in hub.",
                id="resourcesync.E022",
            ))
    if app_settings.HUB_PING not in ("fat", "thin"):
        errors.append(Error(
            f"RESOURCESYNC['HUB_PING'] = {app_settings.HUB_PING!r} is not \"fat\" or \"thin\".",
            hint='"fat" POSTs each notification to the hub (the ResourceSync way); "thin" asks a generic WebSub hub '
                 "to fetch the topic.",
            id="resourcesync.E023",
        ))
    for key, least in (("HUB_LEASE_SECONDS", 60), ("HUB_MAX_LEASE_SECONDS", 60), ("HUB_TIMEOUT", 1),
                       ("HUB_GIVE_UP_SECONDS", 1), ("HUB_DELIVERY_THREADS", 1), ("HUB_VERIFY_THREADS", 1),
                       ("NOTIFICATION_RETENTION", 0), ("HUB_SUBSCRIPTIONS_PER_HOST", None),
                       ("HUB_PENDING_VERIFICATIONS", None)):
        value = getattr(app_settings, key)
        if least is None and value is None:
            continue  # a limit that may be off
        if not isinstance(value, int) or isinstance(value, bool) or value < (least or 1):
            errors.append(Error(
                f"RESOURCESYNC['{key}'] = {value!r} is not a whole number of at least {least or 1}"
                + (" or None." if least is None else "."),
                hint=f"Default: {DEFAULTS[key]}.", id="resourcesync.E024",
            ))
    if not isinstance(app_settings.HUB_ALLOW_PRIVATE_CALLBACKS, bool):
        errors.append(Error(
            f"RESOURCESYNC['HUB_ALLOW_PRIVATE_CALLBACKS'] = {app_settings.HUB_ALLOW_PRIVATE_CALLBACKS!r} is not True or False.",
            hint="Default: False (callbacks on loopback and private addresses are refused).", id="resourcesync.E024",
        ))
    return errors
