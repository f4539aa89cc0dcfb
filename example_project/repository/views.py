"""Public pages of the repository. Items that are not public are answered 404 everywhere, but to
partners: the record view answers a request with a token for the "all-records" set (issued in
the admin or by ``manage.py resourcesync_token``) with the record of any item."""

import datetime
import functools

from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.template.loader import get_template
from django.utils import timezone
from django.utils.http import content_disposition_header, http_date

from django_resourcesync import access, streaming
from django_resourcesync.access import token_access
from django_resourcesync.models import ResourceSet

from . import uploads
from .models import Item, ItemFile

#: The Dublin Core record of an item, and the type it is served with.
RECORD_TEMPLATE = "repository/metadata.xml"
RECORD_CONTENT_TYPE = "application/xml; charset=utf-8"


def public_items():
    return Item.objects.filter(is_public=True)


def record_items():
    """The items whose records are served, with what the records show (their collection)."""
    return public_items().select_related("collection")


#: The set of every item's record, public or not, for partners with a token.
PARTNER_SET = "all-records"


def partner_record_items():
    """The items whose records partners read: all of them, with their collection."""
    return Item.objects.select_related("collection")


def render_record(item):
    """The bytes of the record of ``item`` (fetched by :func:`record_items`): the one way a
    record is rendered, by its view and by the ``metadata`` source's ``contents()``, which
    renders many at once. It is made of the item alone, with no request: what a middleware or
    context processor would add, it must not depend on."""
    return get_template(RECORD_TEMPLATE).render({"item": item}).encode("utf-8")


def home(request):
    items = public_items().select_related("collection").order_by("-pk")[:20]
    return render(request, "repository/home.html", {"items": items})


def about_source(request):
    sets = ResourceSet.objects.public().order_by("position", "pk")
    return render(request, "repository/about_source.html", {"sets": sets})


def about_set(request, slug):
    """A set's description; that of a set for partners to the holders of its token only."""
    resource_set = get_object_or_404(ResourceSet, slug=slug, enabled=True)
    if not resource_set.is_public:
        try:
            access.check(request, resource_set)
        except access.Denied:
            raise Http404("No such set") from None
        return access.private(render(request, "repository/about_set.html", {"set": resource_set}))
    return render(request, "repository/about_set.html", {"set": resource_set})


def item(request, pk):
    obj = get_object_or_404(public_items().select_related("collection"), pk=pk)
    return render(request, "repository/item.html", {"item": obj, "files": obj.files.order_by("pk")})


@token_access(PARTNER_SET)
def item_metadata(request, pk):
    items = partner_record_items() if request.resourcesync_partner else record_items()
    obj = get_object_or_404(items, pk=pk)
    # No Last-Modified: the record shows its collection's name too. ConditionalGetMiddleware
    # gives it an ETag of its bytes instead.
    return HttpResponse(render_record(obj), content_type=RECORD_CONTENT_TYPE)


def item_file(request, item, pk, name):
    obj = get_object_or_404(ItemFile.objects.filter(item__is_public=True), item_id=item, pk=pk)
    if obj.name != name:
        raise Http404("No such file")
    try:
        size = obj.file.size
    except (FileNotFoundError, ValueError):
        raise Http404("File missing") from None
    # Only a few types are shown in the browser; any other is downloaded, and none runs as a
    # page of the site (see uploads.py). The type is the one the Resource Lists give.
    content_type = uploads.served_type(obj)
    # Streamed in chunks under WSGI and ASGI alike (Django's FileResponse would be read whole
    # into memory under ASGI); the file is opened only once its bytes are sent.
    response = uploads.protect(streaming.response(
        request, functools.partial(streaming.read_span, obj.file.storage, obj.file.name, 0, size - 1),
        content_type=content_type, length=size,
    ))
    response["Content-Disposition"] = content_disposition_header(not uploads.shown_inline(content_type), obj.name)
    # Whole seconds: only once the second of the last change is over, or a change later in that
    # second would hide behind a 304.
    if obj.modified.replace(microsecond=0) + datetime.timedelta(seconds=1) <= timezone.now():
        response["Last-Modified"] = http_date(obj.modified.timestamp())
    return response
