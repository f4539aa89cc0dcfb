"""URIs: percent-encoding what a source gives into RFC 3986 URIs, and the URIs of the documents
the Source publishes."""

import contextlib
import re
import threading
from urllib.parse import quote, urlsplit, urlunsplit

from django.core.exceptions import ImproperlyConfigured
from django.urls import converters, get_script_prefix, get_urlconf, resolve, reverse
from django.utils.http import RFC3986_SUBDELIMS

from . import capabilities
from .conf import app_settings
from .exceptions import UnpublishableResource

URI_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
MAX_URI_LENGTH = 2048
MIN_URI_LENGTH = 12


def absolute_uri(location):
    """Make ``location`` (a path or an absolute IRI) an absolute, percent-encoded URI."""
    location = str(location)
    if not URI_SCHEME_RE.match(location):
        if not location.startswith("/"):
            location = "/" + location
        base = app_settings.BASE_URL
        if not base:
            raise ImproperlyConfigured("RESOURCESYNC['BASE_URL'] is not set.")
        location = base + location
    uri = encode_uri(location)
    if not (MIN_URI_LENGTH <= len(uri) <= MAX_URI_LENGTH):
        raise UnpublishableResource(f"URI length {len(uri)} is outside {MIN_URI_LENGTH}..{MAX_URI_LENGTH}: {uri[:80]}")
    if _DOT_SEGMENT.search(uri) and _DOT_SEGMENT.search(urlsplit(uri).path):
        # Escaped or not, a "." or ".." segment is removed by a client that normalises the URI
        # (RFC 3986 6.2.2 decodes %2E first; so do browsers): it would fetch another resource.
        raise UnpublishableResource(f"its path has a '.' or '..' segment, which clients normalise away: {uri[:200]}")
    return uri


_STRAY_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
# Scheme, host and a path, query and fragment of unreserved and sub-delimiter characters and
# well-formed escapes only: such a URI is what encode_uri would make of it (but for dot segments).
_PLAIN_URI = re.compile(r"[a-z][a-z0-9+.-]*://[A-Za-z0-9.-]+(?::\d+)?(?:/(?:[A-Za-z0-9._~!$&'()*+,;=:@/-]|%[0-9A-Fa-f]{2})*)?(?:\?(?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*)?")
# A whole path segment "." or "..", either dot possibly written %2E.
_DOT = r"(?:\.|%2[Ee])"
_DOT_SEGMENT = re.compile(rf"(?<![^/]){_DOT}{_DOT}?(?![^/])")
# Space and the ASCII controls, which urlsplit() strips from the ends or drops (tab, CR, LF).
_SPACE_OR_CONTROL = re.compile("[\x00-\x20\x7f]")
_PATH_SAFE = "/!$&'()*+,;=:@%"
_QUERY_SAFE = _PATH_SAFE + "?"
_USERINFO_SAFE = "!$&'()*+,;=:%"
_NETLOC_SAFE = _USERINFO_SAFE + "@[]"


def _quote(part, safe):
    return quote(_STRAY_PERCENT.sub("%25", part), safe=safe, errors="surrogatepass")


def _escape_dot_segments(path):
    """``/a/../b`` -> ``/a/%2E%2E/b``. A client that follows RFC 3986 removes dot segments
    before it fetches (``/a/../b`` is ``/b`` to it), so a resource whose name has one (a file
    called ``..``) is listed with the dots escaped: then the URI is fetched as it is written,
    and the site, which decodes ``%2E``, still sees the name."""
    return _DOT_SEGMENT.sub(lambda m: "%2E" * len(re.findall(_DOT, m.group())), path)


def encode_uri(iri):
    """Percent-encode an IRI into an RFC 3986 URI that ``xs:anyURI`` accepts.

    Non-ASCII characters become UTF-8 escapes (IDNA for host names), spaces, control characters
    and characters not allowed in each component are escaped, and existing ``%XX`` escapes are
    kept, so the result is plain ASCII that an XML document can always carry. Nothing is
    stripped (two names that differ in a trailing space or control character must not share a
    URI), and dot segments are escaped (see :func:`_escape_dot_segments`): the URI names the
    resource it was made from, also once a client has normalised it.
    """
    if _PLAIN_URI.fullmatch(iri) and not _DOT_SEGMENT.search(iri):
        return iri  # already a plain URI: nothing to encode (the common case, and the fast one)
    parts = urlsplit(_SPACE_OR_CONTROL.sub(lambda m: f"%{ord(m.group()):02X}", iri))
    netloc = parts.netloc
    if netloc and not netloc.isascii():
        userinfo, at, hostport = netloc.rpartition("@")
        host, colon, port = hostport.partition(":")
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            host = _quote(host, "")
        netloc = _quote(userinfo, _USERINFO_SAFE) + at + host + colon + port
    return urlunsplit(
        (
            parts.scheme.lower(),
            _quote(netloc, _NETLOC_SAFE),
            _escape_dot_segments(_quote(parts.path, _PATH_SAFE)),
            _quote(parts.query, _QUERY_SAFE),
            _quote(parts.fragment, _QUERY_SAFE),
        )
    )



# -- reverse() once per URL name ------------------------------------------------------------


class PathReverser:
    """``reverse(viewname, kwargs=...)`` for one URL name, made quick for describing many objects.

    ``reverse()`` walks the URLconf's patterns on every call (some 30 µs): three URIs an entry
    make it most of what describing a changed file costs. This reverses the name once with
    stand-in values, learns where each parameter goes, and then writes the path of any values
    directly. It is meant for a name with one pattern whose parameters use Django's ``int``,
    ``str``, ``slug`` or ``path`` converters: a value those converters would refuse, another
    converter, a name it cannot learn, all go through ``reverse()``, which answers (or raises
    ``NoReverseMatch``) as ever. One instance serves every URLconf and script prefix::

        item_path = PathReverser("repository:item")
        item_path(pk=7)  # "/items/7/", as reverse("repository:item", kwargs={"pk": 7})
    """

    #: Converters whose ``to_url`` is ``str()``: the path of a value is its text, checked against
    #: the converter's pattern and escaped as ``reverse()`` escapes it.
    PLAIN = (converters.IntConverter, converters.StringConverter, converters.SlugConverter, converters.PathConverter)
    _PARAMETER = re.compile(r"<(?:(?P<converter>[^>:]+):)?(?P<name>[^>]+)>")
    _SAFE = RFC3986_SUBDELIMS + "/~:@"

    def __init__(self, viewname):
        self.viewname = viewname
        self._templates = {}

    def __call__(self, **kwargs):
        key = (*(getattr(_fixed, "urls", None) or (get_urlconf(), get_script_prefix())), tuple(kwargs))
        template = self._templates.get(key, False)
        if template is False:
            template = self._templates[key] = self._learn(kwargs)
        if template is not None:
            parts, slots = template
            path = [parts[0]]
            for (name, pattern, plain_digits), part in zip(slots, parts[1:]):
                text = str(kwargs[name])
                if not pattern.fullmatch(text):
                    return reverse(self.viewname, kwargs=kwargs)
                path.append(text if plain_digits else quote(text, safe=self._SAFE))
                path.append(part)
            path = "".join(path)
            if not path.startswith("//"):  # reverse() escapes the second slash of "//" (not a host)
                return path
        return reverse(self.viewname, kwargs=kwargs)

    def _learn(self, kwargs):
        """``(parts, slots)``: the path reversed with stand-ins cut at each, and per parameter
        in order its name, its converter's pattern and whether its text needs no escaping; or
        ``None`` where this name is left to ``reverse()``."""
        names = list(kwargs)
        # Stand-ins that every one of those converters takes, of one length, none inside another.
        stand_ins = {name: f"7051966{index:04d}3" for index, name in enumerate(names)}
        try:
            path = reverse(self.viewname, kwargs=stand_ins)
            prefix = get_script_prefix()
            match = resolve("/" + path[len(prefix):] if path.startswith(prefix) else path)
        except Exception:  # noqa: BLE001 - NoReverseMatch, Resolver404, a converter's own error
            return None
        if match.view_name != self.viewname or not match.route or "(?P<" in match.route:
            return None  # another name's pattern, or a regular expression's (re_path)
        known = converters.get_converters()
        found = {}
        for parameter in self._PARAMETER.finditer(match.route):
            converter = known.get(parameter["converter"] or "str")
            found[parameter["name"]] = converter
        if set(found) != set(names) or not all(type(found[name]) in self.PLAIN for name in names):
            return None
        at = sorted((path.find(stand_in), name) for name, stand_in in stand_ins.items())
        if any(path.count(stand_ins[name]) != 1 for name in names):
            return None
        parts, slots, start = [], [], 0
        for position, name in at:
            parts.append(path[start:position])
            converter = found[name]
            slots.append((name, re.compile(converter.regex), isinstance(converter, converters.IntConverter)))
            start = position + len(stand_ins[name])
        parts.append(path[start:])
        return parts, slots


_fixed = threading.local()


@contextlib.contextmanager
def urls_fixed(fixed=True):
    """Inside, :class:`PathReverser` writes paths for the URLconf and script prefix the thread
    has on entry, not reading them again (asgiref's context-local reads, some 7 µs a path, a
    fifth of describing a file): for describing many objects at once, which changes neither.
    ``urls_fixed(False)`` reads them again on each call, inside: around what may change them (a
    page of the site rendered, whose middleware may choose another URLconf)."""
    outer = getattr(_fixed, "urls", None)
    _fixed.urls = (get_urlconf(), get_script_prefix()) if fixed else None
    try:
        yield
    finally:
        _fixed.urls = outer


# -- the Source's own documents ---------------------------------------------------------------


def _absolute(path):
    return app_settings.BASE_URL + path


def site_uri(path):
    """The absolute URI of a path of this site (one of the app's routes)."""
    return _absolute(path)


def source_description_uri():
    return _absolute(reverse("resourcesync:source-description"))


def source_description_part_uri(number):
    return _absolute(reverse("resourcesync:source-description-part", kwargs={"number": number}))


def capability_list_uri(resource_set):
    return _absolute(reverse("resourcesync:capability-list", kwargs={"slug": resource_set.slug}))


def document_uri(resource_set, name):
    return _absolute(reverse("resourcesync:document", kwargs={"slug": resource_set.slug, "name": name}))


def hub_uri():
    """The hub Destinations subscribe at: ``RESOURCESYNC["HUB_URL"]``, or the built-in one."""
    return app_settings.HUB_URL or _absolute(reverse("resourcesync:hub"))


def topic_uri(resource_set, capability):
    """The WebSub topic of a set's notification channel (``change-notification``, say)."""
    return document_uri(resource_set, capabilities.get(capability).document)


def topic_capability(name):
    """The channel whose topic is the document ``name`` of a set, or ``None``."""
    return next((c.name for c in capabilities.TABLE if c.channel and c.document == name), None)
