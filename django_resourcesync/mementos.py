"""Prior versions of resources (core 1.1 section 14.6; Memento, RFC 7089), from the version store.

A set that publishes prior versions (``ResourceSet.prior_versions``, with the version store on:
:func:`~django_resourcesync.versions.publishes`) keeps the bytes of each change it records; then

- each **memento** (``/resourcesync/<slug>/memento/<datetime>/<key>``: the state a ``created`` or
  ``updated`` change left, at the datetime of that change) serves exactly those bytes, with the
  type they had, as an immutable resource (``ETag`` the sha-256, cacheable for a day), with
  ``Memento-Datetime`` and links to its original resource, TimeGate and TimeMap;
- each listed resource's **TimeMap** (``/resourcesync/<slug>/timemap/<key>``,
  ``application/link-format``) names its original resource and TimeGate, then lists its
  mementos, oldest first: none yet for a resource that has not changed since the log started;
- its **TimeGate** (``/resourcesync/<slug>/timegate/<key>``) answers ``Accept-Datetime`` with a
  302 to the memento of that time (the latest made at or before it; the first, for a time
  before every memento; the latest, with no ``Accept-Datetime``); with no memento, to the
  original resource, whose current state is then the only one there is.

Change List and Change Dump manifest entries link their memento (``rel="memento"`` with the
version's ``modified``, ``hash``, ``length`` and ``type``, as Example 29), the TimeGate and the
TimeMap; Resource List entries link the TimeGate and the TimeMap. The TimeMap and TimeGate of a
listed resource answer from its first listing, changed or not: every entry may link them, with
no query to know whether its resource has a memento yet.

What is served is what the set publishes now: a resource that left the set (deleted, made
private, filtered out) has no memento, TimeMap or TimeGate any more, and the store forgets its
bytes (:func:`~django_resourcesync.versions.forget_withdrawn`).
"""

import datetime
from urllib.parse import quote

from django.http import Http404, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.urls import reverse
from django.utils.cache import get_conditional_response
from django.utils.http import http_date, parse_http_date, quote_etag
from django.views.decorators.http import require_safe

from . import access, streaming, uris, versions
from .exceptions import NotRegistered
from .models import ChangeEvent, Resource, ResourceSet, Version
from .xml.writer import hash_value, ln_element, w3c_datetime

LINK_FORMAT = "application/link-format"
STAMP = "%Y%m%d%H%M%S%f"
#: A memento's bytes never change, so caches need not ask again; but a resource may leave the
#: set (made private), after which its mementos must stop being served: a day, not a year.
IMMUTABLE = "public, max-age=86400, immutable"


def _uri(name, resource_set, key, **kwargs):
    return uris.site_uri(reverse(f"resourcesync:{name}", kwargs={"slug": resource_set.slug, "key": str(key), **kwargs}))


def memento_uri(resource_set, key, moment):
    return memento_uris(resource_set, key)(moment)


def memento_uris(resource_set, key):
    """``uri(moment)``: the memento URIs of one resource, with one URL reversal for them all."""
    template = _uri("memento", resource_set, key, stamp="STAMP")
    head, tail = template.split("/memento/STAMP/", 1)  # a slug has no "/": the route's own segment

    def uri(moment):
        return f"{head}/memento/{moment.astimezone(datetime.timezone.utc).strftime(STAMP)}/{tail}"

    return uri


def timemap_uri(resource_set, key):
    return _uri("timemap", resource_set, key)


def timegate_uri(resource_set, key):
    return _uri("timegate", resource_set, key)


def resource_links(resource_set, key):
    """The links of a resource's entry in a Resource List: its TimeGate and TimeMap."""
    return resource_links_for(resource_set)(key)


#: What Django's reverse() leaves unquoted in a path (RFC 3986 sub-delimiters, "/~:@").
_PATH_SAFE = "!$&'()*+,;=/~:@"


def resource_links_for(resource_set):
    """``links(key)``: :func:`resource_links` for many resources of the set, with two URL
    reversals for them all (a Resource List of a million entries)."""
    gate = _uri("timegate", resource_set, "KEY").removesuffix("/KEY") + "/"
    timemap = _uri("timemap", resource_set, "KEY").removesuffix("/KEY") + "/"

    def links(key):
        quoted = quote(str(key), safe=_PATH_SAFE)
        return [{"rel": "timegate", "href": gate + quoted}, {"rel": "timemap", "href": timemap + quoted, "type": LINK_FORMAT}]

    return links


def change_links(resource_set, key, moment, *, lastmod=None, md5="", sha256="", length=None, media_type=""):
    """The links of a change's entry (a Change List, a Change Dump manifest): the memento of
    the state it left, with what the entry says of those bytes, then the TimeGate and TimeMap."""
    memento = {
        "rel": "memento", "href": memento_uri(resource_set, key, moment), "modified": w3c_datetime(lastmod or moment),
        "hash": hash_value(md5, sha256), "length": length, "type": media_type or None,
    }
    return [{k: v for k, v in memento.items() if v is not None}, *resource_links(resource_set, key)]


def splice(entry, links):
    """``entry`` (a ``<url>`` element, text ending in ``</url>`` and a newline) with ``links``
    added at its end."""
    head, tail = entry.rsplit("</url>", 1)
    return head + "".join(ln_element(link) for link in links) + "</url>" + tail


# --- views ---------------------------------------------------------------------------------


def _publishing_set(request, slug):
    resource_set = ResourceSet.objects.filter(slug=slug, enabled=True).first()
    if resource_set is not None:
        access.check(request, resource_set)
    try:
        publishing = resource_set is not None and versions.publishes(resource_set)
    except NotRegistered:  # its source is gone (check resourcesync.W002 says so)
        publishing = False
    if not publishing:
        raise Http404("This set publishes no prior versions")
    return resource_set


def _events(resource_set, key):
    """The change events of the resource as it is listed now: those since its last deletion
    (before it, the key named another resource, or one at another URI)."""
    events = ChangeEvent.objects.filter(resource_set=resource_set, object_pk=key)
    last_deleted = events.filter(change=ChangeEvent.Change.DELETED).order_by("-id").values_list("id", flat=True).first()
    return events.filter(id__gt=last_deleted) if last_deleted is not None else events


def _listed(resource_set, key):
    """The set's record of ``key`` (the resource as published now), or 404."""
    record = Resource.objects.filter(resource_set=resource_set, object_pk=key).only("uri").first()
    if record is None:
        raise Http404("No such resource in this set")
    return record


def _mementos(resource_set, key):
    """``[(datetime, sha256, media_type, lastmod, length)]`` of the resource's changes whose
    bytes the store holds, oldest first."""
    kept = Version.objects.values("sha256")
    return list(
        _events(resource_set, key).filter(sha256__in=kept)
        .order_by("id").values_list("datetime", "sha256", "media_type", "lastmod", "length")
    )


def _link_header(resource_set, key, original):
    return (
        f'<{original}>; rel="original", <{timegate_uri(resource_set, key)}>; rel="timegate", '
        f'<{timemap_uri(resource_set, key)}>; rel="timemap"; type="{LINK_FORMAT}"'
    )


@require_safe
@access.guarded
def memento(request, slug, stamp, key):
    resource_set = _publishing_set(request, slug)
    record = _listed(resource_set, key)
    try:
        moment = datetime.datetime.strptime(stamp, STAMP).replace(tzinfo=datetime.timezone.utc)
    except ValueError:
        raise Http404("No such memento") from None
    event = _events(resource_set, key).filter(datetime=moment).exclude(sha256="").order_by("-id").first()
    if event is None or not Version.objects.filter(sha256=event.sha256).exists():
        raise Http404("No such memento")
    etag = quote_etag(event.sha256)
    response = get_conditional_response(request, etag=etag)
    if response is None:
        opened = versions.open_bytes(event.sha256)
        if opened is None:
            raise Http404("No such memento")
        chunks, length = opened
        response = streaming.response(
            request, lambda: chunks, content_type=event.media_type or "application/octet-stream", length=length
        )
    response["ETag"] = etag
    response["Cache-Control"] = IMMUTABLE
    # Bytes a site's users uploaded, from the site's own origin: never sniffed as another type,
    # never run as a page of the site (an HTML or SVG version).
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "sandbox"
    response["Memento-Datetime"] = http_date(event.datetime.timestamp())
    response["Link"] = _link_header(resource_set, key, record.uri)
    return response


@require_safe
@access.guarded
def timemap(request, slug, key):
    resource_set = _publishing_set(request, slug)
    record = _listed(resource_set, key)
    found = _mementos(resource_set, key)
    # A listed resource has a TimeMap from its first listing (its Resource List entry links it),
    # mementos or not: "from" and "until" are those of its mementos, if it has some.
    span = f';from="{http_date(found[0][0].timestamp())}";until="{http_date(found[-1][0].timestamp())}"' if found else ""
    lines = [
        f'<{record.uri}>;rel="original"',
        f'<{timemap_uri(resource_set, key)}>;rel="self";type="{LINK_FORMAT}"{span}',
        f'<{timegate_uri(resource_set, key)}>;rel="timegate"',
    ]
    uri = memento_uris(resource_set, key)
    for number, (moment, *_rest) in enumerate(found):
        rel = "memento"
        if number == 0:
            rel = "first memento"
        if number == len(found) - 1:
            rel = "last memento" if number else "first last memento"
        lines.append(f'<{uri(moment)}>;rel="{rel}";datetime="{http_date(moment.timestamp())}"')
    return HttpResponse(",\n".join(lines) + "\n", content_type=LINK_FORMAT)


@require_safe
@access.guarded
def timegate(request, slug, key):
    resource_set = _publishing_set(request, slug)
    record = _listed(resource_set, key)
    wanted = request.headers.get("Accept-Datetime")
    if wanted:
        try:
            wanted = datetime.datetime.fromtimestamp(parse_http_date(wanted), tz=datetime.timezone.utc)
        except ValueError:
            return HttpResponseBadRequest("Accept-Datetime must be an HTTP date (RFC 9110), e.g. "
                                          "Tue, 20 Jun 2023 18:02:59 GMT\n", content_type="text/plain")
    found = _mementos(resource_set, key)
    if not found:
        # Not changed since the log started (or its changes have left it): its current state,
        # which the original resource serves, is the only one there is, whatever the datetime.
        location = record.uri
    else:
        chosen = found[-1]
        if wanted:
            # Datetimes in HTTP are whole seconds: a memento made within the second asked for counts.
            earlier = [m for m in found if m[0].replace(microsecond=0) <= wanted]
            chosen = earlier[-1] if earlier else found[0]
        location = memento_uri(resource_set, key, chosen[0])
    response = HttpResponseRedirect(location)
    response["Vary"] = "accept-datetime"
    response["Link"] = (
        f'<{record.uri}>; rel="original", <{timemap_uri(resource_set, key)}>; rel="timemap"; type="{LINK_FORMAT}"'
    )
    return response

