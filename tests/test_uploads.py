"""The example's uploaded files, served from the site's own origin, never run as its pages: a file
a browser would render as active content (HTML, SVG, anything but plain text and raster images)
is downloaded, none is sniffed as another type, every one carries a sandbox policy; and the
Resource List still describes exactly the bytes, length and type served. The site's own pages
escape what staff type."""

import hashlib
import urllib.error
import urllib.request

import pytest
from django.core.files.base import ContentFile
from django.core.files.uploadedfile import SimpleUploadedFile
from resync.resource_list import ResourceList

from example_project.repository.models import Collection, Item, ItemFile

from .conftest import demo_set
from .helpers import build, fetch

SCRIPT = b"<script>document.title = 'ran'</script>"
UPLOADS = {
    # name: (stored media type, bytes, shown in place)
    "page.html": ("text/html", b"<!DOCTYPE html><html><body>" + SCRIPT + b"</body></html>", False),
    "drawing.svg": (
        "image/svg+xml",
        b'<svg xmlns="http://www.w3.org/2000/svg"><script>document.title = "ran"</script></svg>',
        False,
    ),
    "notes.txt": ("text/plain", b"Plain notes: " + SCRIPT, True),
    # A stored type that is no media type (a row written behind the admin's back), with a line
    # break that no header may carry: served and listed as bytes of no known type, downloaded.
    "odd.bin": ("text/html\r\nX-Injected: yes", SCRIPT, False),
}
POLICY_DIRECTIVES = {"sandbox", "default-src 'none'"}


def new_item(title="Files staff uploaded", collection="Uploads"):
    return Item.objects.create(collection=Collection.objects.create(name=collection, slug="uploads"), title=title)


def add_uploads():
    item = new_item()
    for name, (media_type, content, _inline) in UPLOADS.items():
        row = ItemFile(item=item, name=name, media_type="")
        row.file.save(name, ContentFile(content), save=False)
        row.save()
        # As a script or a bulk import would store it, past the admin's form.
        ItemFile.objects.filter(pk=row.pk).update(media_type=media_type)
    return item


def policy(headers):
    return {directive.strip() for directive in headers["Content-Security-Policy"].split(";")}


def assert_served_safely(name, headers):
    _type, _content, inline = UPLOADS[name]
    assert headers["X-Content-Type-Options"] == "nosniff", name
    assert POLICY_DIRECTIVES <= policy(headers), name
    disposition = headers.get("Content-Disposition", "")
    if inline:
        assert not disposition.startswith("attachment"), (name, disposition)
    else:
        assert disposition.startswith("attachment;") and f'filename="{name}"' in disposition, (name, disposition)


@pytest.fixture
def live_source(live_server, settings, transactional_db):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BASE_URL": live_server.url}
    return live_server.url


def get(uri):
    try:
        with urllib.request.urlopen(uri, timeout=30) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers


def test_uploads_are_served_as_listed_and_never_run_as_pages_of_the_site(live_source):
    item = add_uploads()
    bitstreams = demo_set("bitstreams")
    build(bitstreams)
    listing = ResourceList(allow_multifile=True)
    listing.read(uri=f"{live_source}/resourcesync/bitstreams/resourcelist.xml")
    served = {}
    for resource in listing:
        status, body, headers = get(resource.uri)
        assert status == 200, resource.uri
        # The headers change nothing of what the Resource List describes.
        assert resource.length == len(body) == int(headers["Content-Length"])
        assert resource.md5 == hashlib.md5(body).hexdigest()
        assert resource.sha256 == hashlib.sha256(body).hexdigest()
        assert resource.mime_type == headers["Content-Type"].split(";")[0]
        served[resource.uri.rsplit("/", 1)[1]] = (body, headers)
    assert set(served) == set(UPLOADS)
    for name, (body, headers) in served.items():
        assert body == UPLOADS[name][1]
        assert_served_safely(name, headers)
    assert served["odd.bin"][1]["Content-Type"] == "application/octet-stream"
    assert "X-Injected" not in served["odd.bin"][1]
    assert served["notes.txt"][1]["Content-Type"] == "text/plain"
    # The item's page links each file, and is the site's own: served without the sandbox.
    status, page, headers = get(f"{live_source}{item.get_absolute_url()}")
    assert status == 200 and "Content-Security-Policy" not in headers
    for row in item.files.all():
        assert f'href="{row.get_absolute_url()}"'.encode() in page


@pytest.mark.django_db
@pytest.mark.parametrize("stored", ["image/svg+xml", "application/xhtml+xml", "text/xml", "application/javascript",
                                    "application/pdf", "text/csv", ""])
def test_types_a_browser_could_run_are_downloaded(stored):
    item = new_item()
    row = ItemFile(item=item, name="upload.html", media_type=stored)
    row.file.save("upload.html", ContentFile(SCRIPT), save=True)
    status, body, response = fetch(row.get_absolute_url())
    assert status == 200 and body == SCRIPT
    assert response["Content-Type"] == (stored or "text/html")
    assert response["Content-Disposition"].startswith("attachment;")
    assert response["X-Content-Type-Options"] == "nosniff" and POLICY_DIRECTIVES <= policy(response)


@pytest.mark.django_db
@pytest.mark.parametrize("stored", ["text/plain; charset=utf-8", "image/png", "image/jpeg", "image/gif", "image/webp"])
def test_plain_text_and_raster_images_are_shown_in_place(stored):
    item = new_item()
    row = ItemFile(item=item, name="shown", media_type=stored)
    row.file.save("shown", ContentFile(b"bytes"), save=True)
    status, body, response = fetch(row.get_absolute_url())
    assert status == 200 and body == b"bytes" and response["Content-Type"] == stored
    assert not response.get("Content-Disposition", "").startswith("attachment")
    assert response["X-Content-Type-Options"] == "nosniff" and POLICY_DIRECTIVES <= policy(response)


@pytest.mark.parametrize("typed", ["text html", "html", "text/html\r\nX-Injected: yes", "text/", "/plain",
                                   "text/plain; charset", "text/plain;;", "ünï/code"])
def test_the_admin_refuses_a_media_type_that_is_not_one(admin_client, typed):
    item = new_item()
    response = admin_client.post("/admin/repository/itemfile/add/", {
        "item": item.pk, "name": "upload.html", "media_type": typed,
        "file": SimpleUploadedFile("upload.html", SCRIPT),
    })
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["media_type"]
    assert "is not a media type: write it as type/subtype" in errors["media_type"][0]
    assert not ItemFile.objects.exists()


def test_the_admin_writes_a_media_type_as_it_is_served_and_listed(admin_client):
    item = new_item()
    response = admin_client.post(f"/admin/repository/item/{item.pk}/change/", {
        "collection": item.collection_id, "title": "x", "creator": "", "abstract": "", "is_public": "on",
        "files-TOTAL_FORMS": "2", "files-INITIAL_FORMS": "0", "files-MIN_NUM_FORMS": "0", "files-MAX_NUM_FORMS": "1000",
        "files-0-name": "a.txt", "files-0-media_type": " Text/Plain; charset=UTF-8 ",
        "files-0-file": SimpleUploadedFile("a.txt", b"a"),
        "files-1-name": "b.txt", "files-1-media_type": "", "files-1-file": SimpleUploadedFile("b.txt", b"b"),
    })
    assert response.status_code == 302
    assert dict(item.files.values_list("name", "media_type")) == {"a.txt": "text/plain; charset=UTF-8", "b.txt": ""}


@pytest.mark.django_db
def test_markup_staff_type_is_shown_as_text_on_the_site_pages():
    markup = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    item = new_item(title=markup, collection=markup)
    Item.objects.filter(pk=item.pk).update(creator=markup, abstract=markup)
    row = ItemFile(item=item, name=f"{markup}.txt", media_type="text/plain")
    row.file.save("f.txt", ContentFile(b"f"), save=True)
    for path in ["/", item.get_absolute_url(), item.get_metadata_url()]:
        status, body, _ = fetch(path)
        assert status == 200, path
        assert b"<script>" not in body and b"<img" not in body, path
        assert b"&lt;script&gt;" in body, path
