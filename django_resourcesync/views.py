"""Serving: the Source Description, Capability Lists and the documents in storage.

Every response carries an ETag (the SHA-256 of the document) and Last-Modified, and a
conditional GET is answered 304 from database metadata alone, without touching storage.

Stored files are streamed in chunks of ``CHUNK_SIZE`` bytes, never read whole: from S3
(django-storages) by ranged GETs of the object's body, from other storages through ``open()``.
With ``SERVE_BY_REDIRECT`` they are redirected to the storage's URL instead.
"""

import hashlib
import re

from django.http import Http404, HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.utils.cache import get_conditional_response
from django.utils.http import http_date, quote_etag
from django.views.decorators.http import require_safe

from . import storage
from .builders import capabilitylist
from .builders import changedump
from .builders import changelist as changelists
from .capabilities import CHANGEDUMP, CHANGELIST
from .conf import app_settings
from .models import Build, Document, ResourceSet

CONTENT_TYPE = "application/xml"
CHUNK_SIZE = 1024 * 1024


def _conditional(request, etag, last_modified, make_response):
    etag = quote_etag(etag)
    timestamp = int(last_modified.timestamp()) if last_modified else None
    response = get_conditional_response(request, etag=etag, last_modified=timestamp)
    if response is None:
        response = make_response()
    response.headers.setdefault("ETag", etag)
    if timestamp is not None:
        response.headers.setdefault("Last-Modified", http_date(timestamp))
    return response


def _xml_response(request, body, last_modified):
    return _conditional(
        request, hashlib.sha256(body).hexdigest(), last_modified, lambda: HttpResponse(body, content_type=CONTENT_TYPE)
    )


def _enabled_set(slug):
    try:
        return ResourceSet.objects.get(slug=slug, enabled=True)
    except ResourceSet.DoesNotExist:
        raise Http404("No such resource set") from None


@require_safe
def source_description(request):
    body, last_modified = capabilitylist.source_description()
    return _xml_response(request, body, last_modified)


@require_safe
def capability_list(request, slug):
    rendered = capabilitylist.capability_list(_enabled_set(slug))
    if rendered is None:
        raise Http404("This set has published nothing yet")
    return _xml_response(request, *rendered)


def find_document(resource_set, name):
    """The newest published or retained file called ``name`` of a capability the set offers."""
    candidates = (
        Document.objects.filter(
            resource_set=resource_set, name=name, build__status__in=[Build.Status.PUBLISHED, Build.Status.RETIRED]
        )
        .select_related("build")
        .order_by("-build_id")
    )
    for document in candidates[:1]:
        if resource_set.has_capability(document.build.capability):
            return document
    return None


@require_safe
def document(request, slug, name):
    resource_set = _enabled_set(slug)
    doc = find_document(resource_set, name)
    if doc is None:
        raise Http404("No such document")

    return _conditional(
        request, doc.sha256, doc.written, lambda: _stream_from_storage(request, doc.storage_name, doc.size, doc.media_type, doc.sha256)
    )


_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def _byte_range(request, size, etag):
    """``(start, end)`` of a satisfiable single Range request, ``False`` for an unsatisfiable one,
    ``None`` to send the whole file (no Range, several ranges, or an If-Range that does not match)."""
    header = request.headers.get("Range")
    if not header or request.headers.get("If-Range", f'"{etag}"') != f'"{etag}"':
        return None
    match = _RANGE.match(header.strip())
    if not match or match.groups() == ("", ""):
        return None
    first, last = match.groups()
    if first == "":  # the last N bytes
        start, end = max(size - int(last), 0), size - 1
    else:
        start, end = int(first), min(int(last), size - 1) if last else size - 1
    if first and last and int(last) < start:
        return None  # a malformed range is ignored (RFC 9110): the whole file
    if start >= size:
        return False
    return start, end


def _stream_from_storage(request, storage_name, size, content_type=CONTENT_TYPE, etag=""):
    """A stored file, streamed (with single-range support) or redirected to the storage URL."""
    store = storage.get_storage()
    if app_settings.SERVE_BY_REDIRECT:
        return HttpResponseRedirect(store.url(storage_name))
    byte_range = _byte_range(request, size, etag)
    if byte_range is False:
        response = HttpResponse(status=416, content_type="text/plain")
        response["Content-Range"] = f"bytes */{size}"
        return response
    start, end = byte_range or (0, size - 1)
    response = StreamingHttpResponse(
        _read_span(store, storage_name, start, end), status=200 if byte_range is None else 206, content_type=content_type
    )
    if byte_range is not None:
        response["Content-Range"] = f"bytes {start}-{end}/{size}"
    response["Content-Length"] = str(end - start + 1)
    response["Accept-Ranges"] = "bytes"
    return response


def _s3_object(store, storage_name):
    """The boto3 object behind ``storage_name`` if ``store`` is django-storages' S3 storage whose
    bytes are stored as they are (not gzipped), else ``None``."""
    try:
        from storages.backends.s3 import S3Storage, _filter_download_params
        from storages.utils import clean_name
    except ImportError:  # django-storages without boto3: no S3 storage in use
        return None
    if not isinstance(store, S3Storage) or store.gzip:
        return None
    key = store._normalize_name(clean_name(storage_name))
    return store.bucket.Object(key), _filter_download_params(store.get_object_parameters(storage_name))


def _read_span(store, storage_name, start, end):
    """Bytes ``start`` to ``end`` (inclusive) of a stored file, in chunks of at most CHUNK_SIZE.

    The file is opened when the response starts to be sent, so a 304 or a HEAD never reads it."""
    if end < start:
        return
    s3 = _s3_object(store, storage_name)
    if s3 is not None:
        obj, params = s3
        body = obj.get(Range=f"bytes={start}-{end}", **params)["Body"]
        try:
            yield from body.iter_chunks(CHUNK_SIZE)
        finally:
            body.close()
        return
    handle = store.open(storage_name, "rb")
    try:
        handle.seek(start)
        remaining = end - start + 1
        while remaining > 0:
            chunk = handle.read(min(remaining, CHUNK_SIZE))
            if not chunk:
                break
            remaining -= len(chunk)
            yield chunk
    finally:
        handle.close()


@require_safe
def changelist(request, slug, name):
    """The open Change List (served live) or, once there are several, the Change List Index."""
    resource_set = _enabled_set(slug)
    served = changelists.serve(resource_set, name) if resource_set.has_capability(CHANGELIST) else None
    if served is None:
        raise Http404("No Change List")
    if served.storage_name:
        return _conditional(
            request, served.etag, served.last_modified, lambda: _stream_from_storage(request, served.storage_name, served.size, etag=served.etag)
        )
    return _conditional(request, served.etag, served.last_modified, lambda: HttpResponse(served.body(), content_type=CONTENT_TYPE))


@require_safe
def changelist_part(request, slug, number):
    return changelist(request, slug, changelists.part_name(number))


@require_safe
def changedump_document(request, slug, name):
    """The Change Dump (rendered from its package rows), a package, or a manifest copy."""
    resource_set = _enabled_set(slug)
    if not resource_set.has_capability(CHANGEDUMP):
        raise Http404("No Change Dump")
    if name.endswith(".xml") and not name.endswith("-manifest.xml"):
        rendered = changedump.render(resource_set, name)
        if rendered is None:
            raise Http404("No such Change Dump document")
        return _xml_response(request, *rendered)
    found = changedump.find(resource_set, name)
    if found is None:
        raise Http404("No such package")
    storage_name, size, sha256, media_type, written = found
    return _conditional(request, sha256, written, lambda: _stream_from_storage(request, storage_name, size, media_type, sha256))


def changedump_in_folder(request, slug, name):
    return changedump_document(request, slug, f"changedump/{name}")
