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

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, router, transaction
from django.http import HttpResponse
from django.urls import NoReverseMatch, get_script_prefix, get_urlconf
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


def request_uri(request):
    """The request's URI as the sets' records write a resource's: ``BASE_URL`` and the path with
    its query, percent-encoded; ``None`` when it could not be published (too long, say)."""
    query = request.META.get("QUERY_STRING", "")
    try:
        # The decoded path, encoded as entries are (Django's own escaping differs: "=", ";").
        return uris.absolute_uri(request.path + ("?" + query if query else ""))
    except (UnpublishableResource, ValueError):
        return None


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
                found = capability_lists_for(request_uri(request))
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
    uri = request_uri(request)
    if not uri:
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
                if uris.absolute_uri(source._get("location", obj)) != uri:
                    continue
                listed = source.queryset(resource_set.lookups).filter(pk=obj.pk).exists()
            if listed:
                found.append(uris.capability_list_uri(resource_set))
        except NotRegistered:
            continue
        except Exception:  # the source's own code or a broken filter: W004 and W007 report them
            logger.warning("No discovery link to set %s for %s", resource_set.slug, uri, exc_info=True)
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
