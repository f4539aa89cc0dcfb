"""Discovery (spec section 6.3): how a Destination that lands on a resource, or on the site's
robots.txt, finds the Source's Capability Lists.

- :class:`ResourceSyncLinkMiddleware` (or the :func:`link_resourcesync` decorator on a view)
  adds ``Link: <capability list>; rel="resourcesync"`` to the responses of published resources,
  one link per enabled set that lists the resource (section 6.3.3: the linked Capability List
  covers it). The resource is found by the request's URI, as the sets' records write it, in one
  indexed query.
- The ``resourcesync_links`` template tag and the :func:`~.context_processors.resourcesync`
  context processor give the same links to HTML pages (``<link rel="resourcesync">``).
- :func:`robots_txt` serves a robots.txt with one ``Sitemap:`` line per published Resource List
  (section 6.3.4); :func:`robots_lines` gives the lines to a site that writes its own.

Only the sets anyone may read are named: a set for partners with a token never is (see
:mod:`.access`).
"""

import contextlib
import functools
import json
import logging
import re
from urllib.parse import quote as url_quote
from urllib.parse import unquote_to_bytes, urlsplit

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, router, transaction
from django.http import HttpResponse
from django.urls import NoReverseMatch, get_script_prefix, get_urlconf
from django.utils.encoding import repercent_broken_unicode
from django.utils.http import RFC3986_SUBDELIMS
from django.views.decorators.http import require_safe

from . import access, capabilities, rendering, uris
from .capabilities import CHANGELIST
from .conf import app_settings
from .exceptions import NotRegistered, UnpublishableResource
from .models import Build, ChangeList, Resource, ResourceSet

logger = logging.getLogger(__name__)

REL = "resourcesync"
#: Responses that represent the resource (or confirm a cached representation of it).
LINKED_STATUSES = frozenset({200, 203, 206, 304})


# What Django's reverse() leaves unescaped in a path (RFC 3986's path characters but "%"): the
# rest of a name's UTF-8 octets, "%" included, it writes as escapes in upper case.
_PATH_KEPT = RFC3986_SUBDELIMS + "/:@"
_KEPT_ONLY = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:@/-]*")
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")


def _upper_escapes(text):
    """``%2a`` -> ``%2A``: escapes differ in case only are the same octet (RFC 3986, 6.2.2.1)."""
    return _ESCAPE.sub(lambda m: m.group().upper(), text) if "%" in text else text


def _raw_path(request):
    """The path of the request's target as the client wrote it, escapes and all, where the server
    passes it on (gunicorn ``RAW_URI``, uWSGI and mod_wsgi ``REQUEST_URI``, an ASGI server's
    ``raw_path``) and it is the path Django decoded; else ``None``."""
    scope = getattr(request, "scope", None)
    if isinstance(scope, dict):
        raw = scope.get("raw_path")
    else:
        raw = request.META.get("RAW_URI") or request.META.get("REQUEST_URI")
    if isinstance(raw, bytes):
        raw = raw.decode("latin-1")
    if not isinstance(raw, str) or not raw.isascii():
        return None  # a client that sends bytes no URI has: the decoded path says it all
    path = raw.partition("?")[0] if raw.startswith("/") else urlsplit(raw).path  # origin or absolute form
    octets = unquote_to_bytes(path)
    # Django decodes broken UTF-8 to escapes again (WSGI), an ASGI server to U+FFFD.
    decoded = (repercent_broken_unicode(octets).decode(), octets.decode("utf-8", "replace"))
    return path if request.path in decoded else None


def request_uris(request):
    """The URIs a set's records may list the request's resource under, each as the records write
    a URI (``BASE_URL`` and the path with its query, percent-encoded), without repeats:

    - the canonical one first: the path Django decoded, escaped as ``reverse()`` escapes a name,
      so that each character is written one way whatever the client sent (``%`` as ``%25``,
      ``~`` as itself, ``é`` as ``%C3%A9``), with the query as sent and with its escapes in
      upper case;
    - where the server passes on the request's target as the client wrote it, that path too,
      as sent and with its escapes in upper case: for a source whose locations escape more than
      ``reverse()`` does (``%3B`` for ``;``), which the decoded path cannot tell apart.

    A form that could not be published (too long, a dot segment) is left out."""
    query = request.META.get("QUERY_STRING", "")
    query, upper_query = ("?" + query, "?" + _upper_escapes(query)) if query else ("", "")
    path = request.path
    canonical = path if _KEPT_ONLY.fullmatch(path) else url_quote(path.encode("utf-8", "surrogatepass"), safe=_PATH_KEPT)
    forms = [canonical + upper_query, canonical + query]
    raw = _raw_path(request)
    if raw is not None:
        forms += [raw + query, _upper_escapes(raw) + upper_query]
    found = []
    for form in dict.fromkeys(forms):
        try:
            uri = uris.absolute_uri(form)
        except (UnpublishableResource, ValueError):
            continue
        if uri not in found:
            found.append(uri)
    return found


def request_uri(request):
    """The request's canonical URI (the first of :func:`request_uris`), or ``None`` when it could
    not be published."""
    return next(iter(request_uris(request)), None)


def _lookup_sql(connection, count=1):
    """The lookup of ``count`` URIs as one statement, made once per database and count: the ORM
    takes longer to build the query than the database takes to answer it, on every response of
    the site."""
    quote = connection.ops.quote_name
    resource, resource_set, build, changelist = Resource._meta, ResourceSet._meta, Build._meta, ChangeList._meta

    def column(meta, name):
        return quote(meta.get_field(name).column)

    set_id = column(resource_set, "id")
    # Whether the set's Capability List lists something (it answers 404 before): a published
    # build, or a change log (which it lists when it offers Change Lists).
    built = (
        f"EXISTS (SELECT 1 FROM {quote(build.db_table)} b WHERE b.{column(build, 'resource_set')} = s.{set_id} "
        f"AND b.{column(build, 'status')} = %s)"
    )
    logged = f"EXISTS (SELECT 1 FROM {quote(changelist.db_table)} c WHERE c.{column(changelist, 'resource_set')} = s.{set_id})"
    # The URI is looked for in each set's records, a probe of their (set, URI) index a set and
    # URI: a join would let a database that has not analyzed the tables scan every record instead.
    uri = "= %s" if count == 1 else f"IN ({', '.join(['%s'] * count)})"
    listed = (
        f"EXISTS (SELECT 1 FROM {quote(resource.db_table)} r WHERE r.{column(resource, 'resource_set')} = s.{set_id} "
        f"AND r.{column(resource, 'uri')} {uri})"
    )
    return (
        f"SELECT s.{column(resource_set, 'slug')}, s.{column(resource_set, 'capabilities')}, {built}, {logged} "
        f"FROM {quote(resource_set.db_table)} s "
        f"WHERE {listed} AND s.{column(resource_set, 'enabled')} = %s "
        f"AND s.{column(resource_set, 'access')} <> %s "
        f"ORDER BY s.{column(resource_set, 'position')}, s.{column(resource_set, 'slug')}"
    )


def _publishes(capabilities_value, built, logged):
    if built:
        return True
    if not logged:
        return False
    offered = json.loads(capabilities_value) if isinstance(capabilities_value, (str, bytes)) else capabilities_value
    return CHANGELIST in (offered or ())


_statements = {}


@functools.lru_cache(maxsize=4096)
def _capability_list_uri(slug, base_url, urlconf, script_prefix):
    """A set's Capability List URI, for as long as what ``reverse()`` depends on stays."""
    return uris.capability_list_uri(ResourceSet(slug=slug))


def capability_lists_for(uri):
    """The URIs of the Capability Lists of the enabled sets whose records list ``uri``, or any of
    a list of URIs (the forms of one request's URI): one query, on the index of each set's
    records' URIs."""
    found = [uri] if isinstance(uri, str) else [each for each in uri or () if each]
    if not found or not all(found):
        return []
    connection = connections[router.db_for_read(Resource)]
    key = (connection.alias, len(found))
    sql = _statements.get(key)
    if sql is None:
        sql = _statements[key] = _lookup_sql(connection, len(found))
    with connection.cursor() as cursor:
        cursor.execute(sql, [Build.Status.PUBLISHED, *found, True, access.TOKEN])
        slugs = [slug for slug, offered, built, logged in cursor.fetchall() if _publishes(offered, built, logged)]
    return [_capability_list_uri(slug, app_settings.BASE_URL, get_urlconf(), get_script_prefix()) for slug in slugs]


def capability_lists(request):
    """:func:`capability_lists_for` the request's URI, worked out once per request (the
    middleware, the template tag and the context processor share it)."""
    found = getattr(request, "_resourcesync_capability_lists", None)
    if found is None:
        try:
            with _savepoint():
                found = capability_lists_for(request_uris(request))
        except (DatabaseError, NoReverseMatch, ImproperlyConfigured):
            # The response stands without its links: never a 500 for them.
            logger.warning("No discovery links for %s: they could not be looked up", request.path, exc_info=True)
            found = []
        request._resourcesync_capability_lists = found
    return found


_PUBLIC_SETS = "discovery: public sets"


def capability_lists_of_object(request, obj):
    """The URIs of the Capability Lists of the enabled sets that list ``obj`` (as their items
    are now) at the request's URI. For a page that is itself a resource rendered for hashing: it
    depends on the sets' configuration only, not on their records or builds, which come after the
    page is read (so a set's link is there before its first build is, as its resources are). A
    set that cannot say (its filter or source is broken) is left out, never a failed page."""
    forms = request_uris(request)
    if not forms:
        return []
    concrete = type(obj)._meta.concrete_model
    found = []
    sets = rendering.shared(_PUBLIC_SETS, lambda: list(ResourceSet.objects.public().exclude(capabilities=[])))
    for resource_set in sets:
        try:
            source = resource_set.get_source()
            if source.item_model._meta.concrete_model is not concrete:
                continue
            with _savepoint():  # for the sets of the object's model only (the site's code may query)
                if uris.absolute_uri(source._get("location", obj)) not in forms:
                    continue
                listed = source.queryset(resource_set.lookups).filter(pk=obj.pk).exists()
            if listed:
                found.append(uris.capability_list_uri(resource_set))
        except NotRegistered:
            continue
        except Exception:  # the source's own code or a broken filter: W004 and W007 report them
            logger.warning("No discovery link to set %s for %s", resource_set.slug, forms[0], exc_info=True)
    return found


def _savepoint():
    """A savepoint when a transaction is open (a failed query must not break the page's
    transaction on PostgreSQL), else nothing."""
    connection = connections[router.db_for_read(Resource)]
    return transaction.atomic(using=connection.alias) if connection.in_atomic_block else contextlib.nullcontext()


def link_header(targets):
    return ", ".join(f'<{target}>; rel="{REL}"' for target in targets)


def add_link_header(response, targets):
    """Add ``rel="resourcesync"`` links for ``targets`` to the response's ``Link`` header,
    keeping the links it already has (and not adding one twice)."""
    existing = response.headers.get("Link", "")
    targets = [target for target in targets if f"<{target}>" not in existing]
    if targets:
        response.headers["Link"] = ", ".join(filter(None, [existing, link_header(targets)]))
    return response


def _wants_links(request, response):
    if request.method not in ("GET", "HEAD") or response.status_code not in LINKED_STATUSES:
        return False
    if getattr(request, "_resourcesync_rendering", False):
        return False  # a page rendered for hashing: its headers are not served
    match = getattr(request, "resolver_match", None)
    # The Source's own documents are not resources of a set: no query for them.
    return not (match is not None and "resourcesync" in match.namespaces)


class ResourceSyncLinkMiddleware:
    """Adds ``Link: <capability list>; rel="resourcesync"`` to every response whose URL is a
    resource of an enabled set. Put it first in ``MIDDLEWARE``, above
    ``ConditionalGetMiddleware`` at least: the 304 that one makes keeps a few headers only, and
    this one then adds its links to the response the client gets."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if _wants_links(request, response):
            targets = capability_lists(request)
            if targets:
                add_link_header(response, targets)
        return response


def link_resourcesync(view):
    """The middleware's links, for one view (a site that does not install the middleware)."""

    @functools.wraps(view)
    def wrapped(request, *args, **kwargs):
        response = view(request, *args, **kwargs)
        if request.method in ("GET", "HEAD") and response.status_code in LINKED_STATUSES:
            targets = capability_lists(request)
            if targets:
                add_link_header(response, targets)
        return response

    return wrapped


def resource_lists():
    """The URIs of the Resource Lists (or their indexes) published now, in Source Description
    order: the sets that are enabled and have a Resource List build published."""
    published = (
        Build.objects.filter(capability=capabilities.RESOURCELIST, status=Build.Status.PUBLISHED, resource_set__enabled=True)
        .values_list("resource_set_id", flat=True)
    )
    found = []
    for resource_set in ResourceSet.objects.public().filter(pk__in=published).order_by("position", "pk"):
        if resource_set.has_capability(capabilities.RESOURCELIST):
            try:
                found.append(uris.document_uri(resource_set, capabilities.get(capabilities.RESOURCELIST).document))
            except NoReverseMatch:  # the app's URLs are not included: nothing to point at
                return []
    return found


def robots_lines():
    """``Sitemap:`` lines for robots.txt, one per published Resource List (section 6.3.4)."""
    return [f"Sitemap: {uri}" for uri in resource_lists()]


@require_safe
def robots_txt(request):
    """A robots.txt that lets every crawler in and names the Resource Lists. Route it at the
    site's root: ``path("robots.txt", discovery.robots_txt)``; a site with its own robots.txt
    adds :func:`robots_lines` to it instead."""
    lines = ["User-agent: *", "Disallow:", "", *robots_lines()]
    return HttpResponse("\n".join(lines) + "\n", content_type="text/plain; charset=utf-8")
