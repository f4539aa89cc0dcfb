"""A listed URI names the resource it describes, whatever the name; links carry only usable URIs;
dump members unpack to distinct files on every file system."""

import io
import zipfile
from urllib.parse import urljoin, urlsplit

import pytest
from django.core.files.base import ContentFile

from django_resourcesync.models import LeftOut
from django_resourcesync.packaging import MemberNames
from django_resourcesync.rebuild import rebuild_set
from django_resourcesync.sources import UnpublishableResource, absolute_uri, clean_link, encode_uri
from example_project.repository.models import Collection, Item, ItemFile

from .helpers import build, fetch, path_of, resource_list_entries
from .xmlcheck import SM, check_document, entries, link, md


def remove_dot_segments(path):
    """RFC 3986, section 5.2.4, as a normalising client applies it."""
    output = []
    while path:
        if path.startswith("../"):
            path = path[3:]
        elif path.startswith("./"):
            path = path[2:]
        elif path.startswith("/./"):
            path = path[2:]
        elif path == "/.":
            path = "/"
        elif path.startswith("/../"):
            path = path[3:]
            output = output[:-1]
        elif path == "/..":
            path = "/"
            output = output[:-1]
        elif path in (".", ".."):
            path = ""
        else:
            start = 1 if path.startswith("/") else 0
            end = path.find("/", start)
            end = len(path) if end < 0 else end
            output.append(path[:end])
            path = path[end:]
    return "".join(output)


def unchanged_by_normalisation(uri):
    """Whether a client that resolves the URI (RFC 3986, section 5.2) fetches it as written."""
    parts = urlsplit(uri)
    origin = f"{parts.scheme}://{parts.netloc}"
    return remove_dot_segments(parts.path) == parts.path and urljoin(origin + "/", uri[len(origin):]) == uri


def add_files(names):
    item = Item.objects.create(collection=Collection.objects.create(name="C", slug="c"), title="x")
    files = []
    for name in names:
        row = ItemFile(item=item, name=name, media_type="text/plain")
        row.file.save("f.txt", ContentFile(f"bytes of {name!r}".encode()), save=False)
        row.save()
        files.append(row)
    return files


# -- 1. dot segments ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "location, escaped",
    [
        ("/a/../b", "http://testserver/a/%2E%2E/b"),
        ("/a/./b", "http://testserver/a/%2E/b"),
        ("/a/..", "http://testserver/a/%2E%2E"),
        ("/a/.", "http://testserver/a/%2E"),
        ("/a/%2e%2E/b", "http://testserver/a/%2E%2E/b"),
        ("/a/.%2e/b", "http://testserver/a/%2E%2E/b"),
        ("/a/%2E./b", "http://testserver/a/%2E%2E/b"),
        ("/a/%2e/b", "http://testserver/a/%2E/b"),
        ("/a/../ü", "http://testserver/a/%2E%2E/%C3%BC"),
        ("http://h.example/a/../../b", "http://h.example/a/%2E%2E/%2E%2E/b"),  # the plain fast path
        ("https://h.example/..?x=/../", "https://h.example/%2E%2E?x=/../"),
    ],
)
def test_a_uri_with_dot_segments_is_refused(location, escaped):
    """Escaping does not help: RFC 3986 normalisation (6.2.2) and browsers decode %2E before they
    remove dot segments, so no URI can name a segment "..". Such a resource is not published
    (left out and reported); in other URIs the dots are escaped all the same."""
    with pytest.raises(UnpublishableResource, match="normalise"):
        absolute_uri(location)
    assert encode_uri(location if "://" in location else "http://testserver" + location) == escaped


@pytest.mark.parametrize(
    "location, expected",
    [
        ("/a/.../b", "http://testserver/a/.../b"),
        ("/a/..b/.c/d.", "http://testserver/a/..b/.c/d."),
        ("/a/%2e%2e%2e", "http://testserver/a/%2e%2e%2e"),
        ("https://h.example/x?y=/../", "https://h.example/x?y=/../"),
    ],
)
def test_dots_that_are_no_dot_segments_are_kept(location, expected):
    assert absolute_uri(location) == expected
    assert unchanged_by_normalisation(expected)


@pytest.mark.django_db
def test_a_file_named_with_dot_segments_is_left_out_and_reported(bitstreams):
    names = ["../../evil.txt", "./here.txt", "a/../b.txt", "..", "fine.txt"]
    files = add_files(names)
    build(bitstreams)
    listed = {entry.find(f"{{{SM}}}loc").text for entry in resource_list_entries(bitstreams)}
    fine = files[-1]
    assert listed == {"http://testserver" + fine.get_absolute_url()}, "a listed URI always names its resource"
    assert unchanged_by_normalisation(next(iter(listed)))
    reported = dict(LeftOut.objects.filter(resource_set=bitstreams).values_list("object_pk", "reason"))
    assert set(reported) == {str(row.pk) for row in files[:-1]}
    assert all("'..'" in reason for reason in reported.values())


# -- 2. whitespace and controls -----------------------------------------------------------


@pytest.mark.parametrize(
    "location, expected",
    [
        ("/name\x1c", "http://testserver/name%1C"),
        ("/name\x1f", "http://testserver/name%1F"),
        ("/name ", "http://testserver/name%20"),
        ("/name\t", "http://testserver/name%09"),
        ("/a\tb\r\nc", "http://testserver/a%09b%0D%0Ac"),
        ("/name\n", "http://testserver/name%0A"),  # "$" in a regular expression matches before it
        ("/name\x0b\x0c", "http://testserver/name%0B%0C"),
        ("/name\x85\xa0\u3000", "http://testserver/name%C2%85%C2%A0%E3%80%80"),
        ("http://example.org/a\x1f ", "http://example.org/a%1F%20"),
        ("http://example.org/a?q=\x1e", "http://example.org/a?q=%1E"),
    ],
)
def test_whitespace_and_controls_are_encoded_never_stripped(location, expected):
    assert absolute_uri(location) == expected


def test_names_that_differ_in_whitespace_give_different_uris():
    names = [
        "/x", "/x ", "/x\x1c", "/x\x1d", "/x\x1e", "/x\x1f", "/x\t", "/x\n", "/x\r", "/x\x0b", "/x\x0c", "/x\xa0", "/x\u2028"
    ]
    assert len({absolute_uri(name) for name in names}) == len(names)


# -- 3. userinfo ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "iri, expected",
    [
        ("http://us%20er@bücher.example/x", "http://us%20er@xn--bcher-kva.example/x"),
        ("http://us%20er@h.example/x", "http://us%20er@h.example/x"),
        ("http://us%20er:p%41ss@bücher.example:8080/x", "http://us%20er:p%41ss@xn--bcher-kva.example:8080/x"),
        ("http://ü%zz@bücher.example/x", "http://%C3%BC%25zz@xn--bcher-kva.example/x"),
        ("http://a%2Fb@h.example/ü", "http://a%2Fb@h.example/%C3%BC"),
    ],
)
def test_escapes_in_userinfo_are_kept(iri, expected):
    assert encode_uri(iri) == expected


# -- 4. link schemes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "href", ["javascript:alert(1)//xxxxxxxx", "JavaScript:alert(document.cookie)", "data:text/html,<script>x</script>", "ftp://files.example/f.txt",
             "file:///etc/passwd", "vbscript:msgbox(1)"]
)
def test_links_with_other_schemes_are_dropped(href):
    assert clean_link({"rel": "alternate", "href": href}) is None


def test_http_https_and_paths_are_kept_in_links():
    assert clean_link({"rel": "alternate", "href": "https://mirror.example/a"})["href"] == "https://mirror.example/a"
    assert clean_link({"rel": "alternate", "href": "HTTP://mirror.example/a b"})["href"] == "http://mirror.example/a%20b"
    assert clean_link({"rel": "alternate", "href": "/a"})["href"] == "http://testserver/a"


def test_link_schemes_setting_adds_schemes(settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "LINK_SCHEMES": ["http", "https", "FTP"]}
    assert clean_link({"rel": "alternate", "href": "ftp://files.example/f.txt"})["href"] == "ftp://files.example/f.txt"
    assert clean_link({"rel": "alternate", "href": "javascript:alert(1)//xxxxxxxx"}) is None


def test_profile_follows_the_scheme_rule(settings):
    link = clean_link({"rel": "describedby", "href": "/meta", "profile": "javascript:alert(1)"})
    assert link == {"rel": "describedby", "href": "http://testserver/meta"}, "the profile goes, the link stays"
    assert "profile" not in clean_link({"rel": "describedby", "href": "/meta", "profile": "urn:example:profile"})
    assert "profile" not in clean_link({"rel": "describedby", "href": "/meta", "profile": "relative/profile"})
    oai = "http://www.openarchives.org/OAI/2.0/oai_dc/"
    assert clean_link({"rel": "describedby", "href": "/meta", "profile": oai})["profile"] == oai
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "LINK_SCHEMES": ("http", "https", "urn")}
    assert (
        clean_link({"rel": "describedby", "href": "/meta", "profile": "urn:example:profile"})["profile"] == "urn:example:profile"
    )


# -- 5. describedby -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_describedby_links_are_encoded_like_every_uri(seed, bitstreams, metadata, settings):
    seed(1)
    bitstreams.describedby = "https://example.org/über uns"
    bitstreams.save()
    metadata.describedby = "javascript:alert(1)//not-a-description"  # cannot be published: left out
    metadata.save()
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "SOURCE_DESCRIBEDBY": "https://example.org/über uns"}
    build(bitstreams)
    build(metadata)
    encoded = "https://example.org/%C3%BCber%20uns"
    status, body, _ = fetch("/resourcesync/bitstreams/capabilitylist.xml")
    assert status == 200
    assert link(check_document(body, "capabilitylist"), "describedby") == encoded
    status, body, _ = fetch("/resourcesync/metadata/capabilitylist.xml")
    assert status == 200
    assert link(check_document(body, "capabilitylist"), "describedby") is None
    status, body, _ = fetch("/.well-known/resourcesync")
    assert status == 200
    description = check_document(body, "description")
    assert link(description, "describedby") == encoded
    by_set = {e.find(f"{{{SM}}}loc").text.split("/")[-2]: link(e, "describedby") for e in entries(description)}
    assert by_set == {"bitstreams": encoded, "metadata": None}


@pytest.mark.django_db
def test_an_overlong_describedby_is_left_out(seed, bitstreams, settings):
    seed(1)
    bitstreams.describedby = "https://example.org/" + "ü" * 1000  # fits the field; 6,020 characters encoded
    bitstreams.save()
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "SOURCE_DESCRIBEDBY": "ftp://example.org/about"}
    build(bitstreams)
    status, body, _ = fetch("/resourcesync/bitstreams/capabilitylist.xml")
    assert link(check_document(body, "capabilitylist"), "describedby") is None
    status, body, _ = fetch("/.well-known/resourcesync")
    description = check_document(body, "description")
    assert link(description, "describedby") is None
    assert [link(e, "describedby") for e in entries(description)] == [None]


# -- 6. ZIP member names ------------------------------------------------------------------------

RESERVED = {"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$", *(f"{d}{n}" for d in ("COM", "LPT") for n in range(10))}


def assert_portable(made):
    """Distinct on a case-insensitive file system, no reserved device name, no name ending in a
    dot or a space, no file where a folder must go."""
    folded = [name.lower() for name in made]
    assert len(set(folded)) == len(folded), made
    folders = {"/".join(name.split("/")[:depth]) for name in folded for depth in range(1, name.count("/") + 1)}
    assert not folders & set(folded), made
    for name in made:
        for segment in name.split("/"):
            assert segment.split(".")[0].upper() not in RESERVED, name
            assert segment and not segment.endswith((".", " ")), name


def test_member_names_that_differ_only_by_case_are_made_distinct():
    names = MemberNames()
    made = [names.name(uri) for uri in ["http://h.example/A.txt", "http://h.example/a.txt", "http://h.example/a.TXT"]]
    assert made == ["resources/h.example/A.txt", "resources/h.example/a~2.txt", "resources/h.example/a~3.TXT"]
    made += [names.name(uri) for uri in ["http://h.example/About/team", "http://h.example/about", "http://h.example/ABOUT/team"]]
    assert_portable(made)


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("http://h.example/CON", "resources/h.example/_CON"),
        ("http://h.example/aux.txt", "resources/h.example/_aux.txt"),
        ("http://h.example/Con", "resources/h.example/_Con"),
        ("http://h.example/nul.tar.gz", "resources/h.example/_nul.tar.gz"),
        ("http://h.example/com1", "resources/h.example/_com1"),
        ("http://h.example/LPT9.log", "resources/h.example/_LPT9.log"),
        ("http://h.example/prn/x", "resources/h.example/_prn/x"),
        ("http://h.example/conin$", "resources/h.example/_conin$"),
        ("http://h.example/name.", "resources/h.example/name_"),
        ("http://h.example/name...", "resources/h.example/name___"),
        ("http://h.example/dir./x", "resources/h.example/dir_/x"),
        ("http://h.example/...", "resources/h.example/___"),
        # Not reserved: kept as they are.
        ("http://h.example/console.txt", "resources/h.example/console.txt"),
        ("http://h.example/com10", "resources/h.example/com10"),
        ("http://h.example/auxiliary", "resources/h.example/auxiliary"),
    ],
)
def test_member_names_avoid_windows_reserved_names_and_trailing_dots(uri, expected):
    made = MemberNames().name(uri)
    assert made == expected
    assert_portable([made])


@pytest.mark.django_db
def test_a_resource_dump_unpacks_to_distinct_portable_files(bitstreams):
    bitstreams.capabilities = ["resourcelist", "resourcedump"]
    bitstreams.save()
    names = ["A.txt", "a.txt", "aux.txt", "Con", "x.", "x..", "nul.tar.gz", "..x"]
    add_files(names)
    assert [b.capability for b in rebuild_set(bitstreams)] == ["resourcelist", "resourcedump"]
    status, body, _ = fetch("/resourcesync/bitstreams/resourcedump.xml")
    assert status == 200
    (package_entry,) = entries(check_document(body, "resourcedump"))
    status, package, _ = fetch(path_of(package_entry.find(f"{{{SM}}}loc").text))
    archive = zipfile.ZipFile(io.BytesIO(package))
    manifest = check_document(archive.read("manifest.xml"), "resourcedump-manifest")
    paths = [md(entry)["path"][1:] for entry in entries(manifest)]
    assert len(paths) == len(names)
    assert_portable(paths)
    for entry in entries(manifest):
        uri = entry.find(f"{{{SM}}}loc").text
        assert archive.read(md(entry)["path"][1:]) == fetch(path_of(uri))[1]


# --- reverse() learnt once (PathReverser) -----------------------------------------------------

ODD_VALUES = [
    {"item": 1, "pk": 2, "name": "a b.txt"},
    {"item": 10, "pk": 0, "name": "dir/ü %41.pdf"},  # a folder, non-ASCII, a percent sign
    {"item": "3", "pk": 4, "name": "?#[]@!$&'()*+,;=~:"},
    {"item": 1, "pk": 2, "name": "a\nb"},  # the path converter refuses a line break
    {"item": 1, "pk": 2, "name": ""},  # and an empty name
    {"item": -1, "pk": 2, "name": "x"},  # the int converter a sign
    {"item": True, "pk": 1, "name": "x"},
    {"item": 1, "pk": 2, "name": "\ud800"},  # a lone surrogate: no UTF-8 for it
]


def reversed_or_error(call):
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - the error is what is compared
        return type(exc)


@pytest.mark.parametrize("values", ODD_VALUES)
def test_a_path_reverser_writes_what_reverse_writes(values):
    from django.urls import reverse

    from django_resourcesync.uris import PathReverser

    file_path = PathReverser("repository:file")
    file_path(item=5, pk=6, name="first.txt")  # learnt from a first call
    expected = reversed_or_error(lambda: reverse("repository:file", kwargs=values))
    assert reversed_or_error(lambda: file_path(**values)) == expected


def test_a_path_reverser_follows_the_script_prefix_and_the_urlconf():
    from django.urls import clear_script_prefix, reverse, set_script_prefix, set_urlconf

    from django_resourcesync.uris import PathReverser

    item_path = PathReverser("repository:item")
    assert item_path(pk=7) == reverse("repository:item", kwargs={"pk": 7}) == "/items/7/"
    set_script_prefix("/site/")
    try:
        assert item_path(pk=8) == "/site/items/8/"
        set_urlconf("tests.urls_elsewhere")
        assert item_path(pk=9) == reverse("repository:item", kwargs={"pk": 9}) == "/site/elsewhere/items/9/"
    finally:
        set_urlconf(None)
        clear_script_prefix()
    assert item_path(pk=7) == "/items/7/"
    assert len(item_path._templates) == 3, "one learnt per URLconf and prefix"


def test_a_name_a_path_reverser_cannot_learn_goes_through_reverse():
    from django.urls import NoReverseMatch, reverse

    from django_resourcesync.uris import PathReverser

    # A regular expression's pattern (re_path), and a name that does not exist.
    pattern = PathReverser("elsewhere-regex")
    from django.urls import set_urlconf

    set_urlconf("tests.urls_elsewhere")
    try:
        assert pattern(pk=12) == reverse("elsewhere-regex", kwargs={"pk": 12}) == "/regex/12/"
        assert list(pattern._templates.values()) == [None]
    finally:
        set_urlconf(None)
    with pytest.raises(NoReverseMatch):
        PathReverser("repository:nothing")(pk=1)


def test_a_path_that_would_start_with_two_slashes_is_escaped_as_reverse_escapes_it():
    from django.urls import reverse, set_urlconf

    from django_resourcesync.uris import PathReverser

    anything = PathReverser("elsewhere-any")
    set_urlconf("tests.urls_elsewhere")
    try:
        assert anything(name="a/b") == reverse("elsewhere-any", kwargs={"name": "a/b"}) == "/a/b"
        assert anything(name="/a") == reverse("elsewhere-any", kwargs={"name": "/a"}) == "/%2Fa"
    finally:
        set_urlconf(None)


class ElsewhereMiddleware:
    """Gives every request the second URLconf, as a site serving several hosts may."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.urlconf = "tests.urls_elsewhere"
        return self.get_response(request)


def test_a_page_rendered_among_objects_described_writes_the_paths_of_its_own_urlconf(settings):
    """Objects described in a batch have their paths written for the URLconf of its start, read
    once; a page rendered meanwhile (a ViewSource's) is written for the URLconf its request has."""
    from django_resourcesync import rendering
    from example_project.repository.models import item_path

    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.test_uris.ElsewhereMiddleware"]
    with rendering.batch():
        assert item_path(pk=4) == "/items/4/"
        body, _type = rendering.render_location("/writes/5/")
        assert body == b"/elsewhere/items/5/"
        assert item_path(pk=6) == "/items/6/"
