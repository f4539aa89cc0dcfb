"""Serving: the Source Description, Capability Lists and the documents in storage.

Every response carries an ETag (the SHA-256 of the document) and Last-Modified, and a
conditional GET is answered 304 from database metadata alone, without touching storage. A
document rendered live has no Last-Modified until the second of its last change is over (see
``_last_modified``).

Stored files are streamed in chunks, never read whole (see :mod:`.streaming`, under WSGI and
ASGI alike): from S3 (django-storages) by ranged GETs of the object's body, from other storages
through ``open()``. With ``SERVE_BY_REDIRECT`` they are redirected to the storage's URL instead.

A browser asking for a document a person may open gets a page made from its bytes instead of
the XML (``HTML_PAGES``, see :mod:`.pages`), with an ETag of its own; every such answer varies by
``Accept``. ZIP packages and notification payloads are always served as they are.
"""

import functools
import hashlib
import re
from importlib import resources

from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.utils import timezone
from django.utils.cache import get_conditional_response, patch_vary_headers
from django.utils.http import http_date, quote_etag
from django.views.decorators.http import require_safe

from . import access, capabilities, pages, storage, streaming
from .builders import capabilitylist
from .conf import app_settings
from .models import Build, Document, ResourceSet
from .served import GONE

CONTENT_TYPE = "application/xml"


def _last_modified(last_modified, live):
    """``last_modified`` in whole seconds, as HTTP dates count, or ``None`` while it is no validator.

    A live document (rendered from rows, not a stored file) can change again within the second
    of its last change. A copy sent in that second and a later one would carry the same date, and
    If-Modified-Since would hide the later change. So, as RFC 9110 (8.8.2.2) has it, its date
    serves only once that second is over: any copy dated so then holds every change of it, and
    comparing whole seconds is exact. Until then it is neither sent nor compared."""
    if last_modified is None:
        return None
    timestamp = int(last_modified.timestamp())
    if live and timestamp >= int(timezone.now().timestamp()):
        return None
    return timestamp


def _conditional(request, etag, last_modified, make_response, *, live=False):
    etag = quote_etag(etag)
    timestamp = _last_modified(last_modified, live)
    response = get_conditional_response(request, etag=etag, last_modified=timestamp)
    if response is None:
        response = make_response()
    response.headers.setdefault("ETag", etag)
    if timestamp is not None:
        response.headers.setdefault("Last-Modified", http_date(timestamp))
    return response


def _negotiated(request, etag, last_modified, make_response, chunks, *, live=False):
    """A document a person may open: its XML (``make_response()``) or, for a browser (see
    :func:`pages.wanted`), its page, made from the bytes ``chunks()`` yields, with an ETag of its
    own. A page is always sent whole: a Range request applies to the XML alone."""
    if pages.wanted(request):
        response = _conditional(request, pages.etag(etag), last_modified, lambda: _page(chunks, make_response, etag), live=live)
    else:
        response = _conditional(request, etag, last_modified, make_response, live=live)
    if app_settings.HTML_PAGES:
        patch_vary_headers(response, ["Accept"])
    return response


def _page(chunks, make_response, etag):
    body = pages.render(chunks())
    if body is None:  # no sitemap document after all: served as it is, with its own ETag
        response = make_response()
        response["ETag"] = quote_etag(etag)
        return response
    return HttpResponse(body, content_type=pages.CONTENT_TYPE)


def _xml_response(request, document):
    """A document rendered live, a :class:`capabilitylist.Rendered`."""
    return _negotiated(
        request, document.etag, document.last_modified, lambda: HttpResponse(document.body, content_type=CONTENT_TYPE),
        lambda: [document.body], live=True,
    )


def _stored_chunks(storage_name, size):
    """``chunks()`` of a stored file for :func:`_negotiated`."""
    return lambda: streaming.read_span(storage.get_storage(), storage_name, 0, size - 1)


def _enabled_set(request, slug, sets=ResourceSet.objects):
    """The enabled set ``slug`` (among ``sets``), if the request may read it (:func:`access.check`:
    a restricted set answers 401 or 403 to a request without a token for it); else 404."""
    try:
        resource_set = sets.get(slug=slug, enabled=True)
    except ResourceSet.DoesNotExist:
        raise Http404("No such resource set") from None
    access.check(request, resource_set)
    return resource_set


@require_safe
def source_description(request):
    """The Source Description: two queries whatever the number of sets, and rendered only when
    what it is made of has changed (see :mod:`.builders.capabilitylist`)."""
    return _xml_response(request, capabilitylist.source_description_document())


@require_safe
def source_description_part(request, number):
    """A part of the Source Description Index, while the Source has one."""
    rendered = capabilitylist.source_description_document(part=number)
    if rendered is None:
        raise Http404("No such part of the Source Description")
    return _xml_response(request, rendered)


@require_safe
@access.guarded
def capability_list(request, slug):
    """A set's Capability List: the set and the dates of its documents in one query."""
    resource_set = _enabled_set(request, slug, ResourceSet.objects.with_published())
    rendered = capabilitylist.capability_list_document(resource_set)
    if rendered is None:
        raise Http404("This set has published nothing yet")
    return _xml_response(request, rendered)


def find_document(resource_set, name):
    """The newest published or retained file called ``name`` of a capability the set offers;
    :data:`GONE` if that file was withdrawn (it held bytes that are no longer public)."""
    candidates = (
        Document.objects.filter(
            resource_set=resource_set, name=name, build__status__in=[Build.Status.PUBLISHED, Build.Status.RETIRED]
        )
        .select_related("build")
        .order_by("-build_id", "-pk")
    )
    for document in candidates[:1]:
        if resource_set.has_capability(document.build.capability):
            return GONE if document.withdrawn else document
    return None


def _gone():
    return HttpResponse("Withdrawn: it held resources that are no longer public.\n", status=410, content_type="text/plain")


@require_safe
@access.guarded
def document(request, slug, name):
    resource_set = _enabled_set(request, slug)
    doc = find_document(resource_set, name)
    if doc is None:
        raise Http404("No such document")
    if doc is GONE:
        return _gone()

    def make_response():
        return _stream_from_storage(request, doc.storage_name, doc.size, doc.media_type, doc.sha256,
                                    redirect=resource_set.is_public)

    if doc.media_type != CONTENT_TYPE:  # a dump package
        return _conditional(request, doc.sha256, doc.written, make_response)
    return _negotiated(request, doc.sha256, doc.written, make_response, _stored_chunks(doc.storage_name, doc.size))


_RANGE = re.compile(r"bytes=(\d*)-(\d*)", re.ASCII | re.IGNORECASE)
# No file has an offset of more than 18 digits: a longer number is past the end of any file, and
# is never converted (Python refuses to convert more than 4300 digits; a client may send more).
_BEYOND = 10**18


def _offset(digits):
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else _BEYOND


def _byte_range(request, size, etag):
    """``(start, end)`` of a satisfiable single Range request, ``False`` for an unsatisfiable one,
    ``None`` to send the whole file (no Range, several ranges, or an If-Range that does not match).

    Anything not understood is ignored, as RFC 9110 (14.2) allows: the whole file is sent."""
    header = request.headers.get("Range")
    if not header or request.headers.get("If-Range", f'"{etag}"') != f'"{etag}"':
        return None
    match = _RANGE.fullmatch(header.strip())
    if not match or match.groups() == ("", ""):
        return None
    first, last = match.groups()
    if first == "":  # the last N bytes
        start, end = max(size - _offset(last), 0), size - 1
    else:
        start, end = _offset(first), min(_offset(last), size - 1) if last else size - 1
        if last and _offset(last) < start:
            return None  # a malformed range is ignored (RFC 9110): the whole file
    if start >= size:
        return False
    return start, end


def _stream_from_storage(request, storage_name, size, content_type=CONTENT_TYPE, etag="", *, redirect=True):
    """A stored file, streamed (with single-range support) or redirected to the storage URL
    (with ``SERVE_BY_REDIRECT``, unless ``redirect`` is false: a restricted set's files, whose
    storage URL checks no token, are always streamed)."""
    store = storage.get_storage()
    if app_settings.SERVE_BY_REDIRECT and redirect:
        return HttpResponseRedirect(store.url(storage_name))
    byte_range = _byte_range(request, size, etag)
    if byte_range is False:
        response = HttpResponse(status=416, content_type="text/plain")
        response["Content-Range"] = f"bytes */{size}"
        return response
    start, end = byte_range or (0, size - 1)
    response = streaming.response(
        request, functools.partial(streaming.read_span, store, storage_name, start, end),
        status=200 if byte_range is None else 206, content_type=content_type, length=end - start + 1,
    )
    if byte_range is not None:
        response["Content-Range"] = f"bytes {start}-{end}/{size}"
    response["Accept-Ranges"] = "bytes"
    return response


@require_safe
@access.guarded
def live(request, slug, name, capability):
    """A document of a capability served ``"live"`` (see :mod:`.capabilities`): rendered from
    the database (the open Change List, the Change Dump), or a file its rows point at."""
    resource_set = _enabled_set(request, slug)
    served = capabilities.get(capability).builder.serve(resource_set, name) if resource_set.has_capability(capability) else None
    if served is None:
        raise Http404("No such document")
    if served == GONE:
        return _gone()
    if served.live:
        def make_response():
            return HttpResponse(served.body(), content_type=served.media_type)

        def chunks():
            return [served.body()]
    else:
        def make_response():
            return _stream_from_storage(request, served.storage_name, served.size, served.media_type, served.etag,
                                        redirect=resource_set.is_public)

        chunks = _stored_chunks(served.storage_name, served.size)
    if served.media_type != CONTENT_TYPE or capabilities.get(capability).channel:
        # A package, or a notification: what software reads, served as it is.
        response = _conditional(request, served.etag, served.last_modified, make_response, live=served.live)
    else:
        response = _negotiated(request, served.etag, served.last_modified, make_response, chunks, live=served.live)
    for header, value in served.headers.items():
        response.headers[header] = value
    return response


#: What the app's stylesheet is served as: XSLT's registered type; browsers take it from the
#: ``xml-stylesheet`` instruction of a document whatever its type.
STYLESHEET_TYPE = "application/xslt+xml; charset=utf-8"
#: A browser asks again after an hour (and gets a 304 while the app has not changed it).
STYLESHEET_MAX_AGE = 3600


@functools.cache
def _stylesheet():
    body = resources.files("django_resourcesync.xml").joinpath("resourcesync.xsl").read_bytes()
    return body, hashlib.sha256(body).hexdigest()


@require_safe
def stylesheet(request):
    """The app's XSLT stylesheet, which a browser applies to the documents that name it
    (``RESOURCESYNC["STYLESHEET"] = True``): each reads as a page with a table of its entries.
    Served whatever the setting, so that documents written while it was on still read."""
    body, etag = _stylesheet()
    response = _conditional(request, etag, None, lambda: HttpResponse(body, content_type=STYLESHEET_TYPE))
    response["Cache-Control"] = f"public, max-age={STYLESHEET_MAX_AGE}"
    return response


def live_in_folder(request, slug, rest, capability):
    """A document in the folder of a capability served live (``changelist/3.xml``)."""
    return live(request, slug, f"{capabilities.get(capability).folder}/{rest}", capability)
