"""Serving: the Source Description, Capability Lists and the documents in storage.

Every response carries an ETag (the SHA-256 of the document) and Last-Modified, and a
conditional GET is answered 304 from database metadata alone, without touching storage.
"""

import hashlib

from django.http import FileResponse, Http404, HttpResponse, HttpResponseRedirect
from django.utils.cache import get_conditional_response
from django.utils.http import http_date, quote_etag
from django.views.decorators.http import require_safe

from . import storage
from .builders import capabilitylist
from .builders import changelist as changelists
from .capabilities import CHANGELIST
from .conf import app_settings
from .models import Build, Document, ResourceSet

CONTENT_TYPE = "application/xml"


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

    return _conditional(request, doc.sha256, doc.written, lambda: _stream_from_storage(doc.storage_name, doc.size))


def _stream_from_storage(storage_name, size):
    if app_settings.SERVE_BY_REDIRECT:
        return HttpResponseRedirect(storage.get_storage().url(storage_name))
    response = FileResponse(storage.get_storage().open(storage_name, "rb"), content_type=CONTENT_TYPE)
    response["Content-Length"] = str(size)
    return response


@require_safe
def changelist(request, slug, name):
    """The open Change List (served live) or, once there are several, the Change List Index."""
    resource_set = _enabled_set(slug)
    served = changelists.serve(resource_set, name) if resource_set.has_capability(CHANGELIST) else None
    if served is None:
        raise Http404("No Change List")
    if served.storage_name:
        return _conditional(request, served.etag, served.last_modified, lambda: _stream_from_storage(served.storage_name, served.size))
    return _conditional(request, served.etag, served.last_modified, lambda: HttpResponse(served.body(), content_type=CONTENT_TYPE))


@require_safe
def changelist_part(request, slug, number):
    return changelist(request, slug, changelists.part_name(number))
