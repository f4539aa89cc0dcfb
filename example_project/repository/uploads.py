"""The media types of the files staff upload: which ones the admin accepts, which type a file is
served with (and listed with, in the Resource Lists), and which files a browser may show in
place.

Files are served from the site's own origin. A file typed ``text/html`` (or ``image/svg+xml``,
XML, JavaScript...) that a browser rendered as a page of the site would run its scripts with the
cookies of whoever opens it, staff included. So every file is served with
``X-Content-Type-Options: nosniff`` (never read as another type than the one it is sent with) and
a sandbox policy (never run as a page of the site, nor load anything), and only the few types in
:data:`INLINE_TYPES` are shown in the browser; any other type is sent as a download
(``Content-Disposition: attachment``). None of this changes the bytes, their length or their type:
what the Resource Lists describe is what is served.
"""

import mimetypes
import re

from django.core.exceptions import ValidationError

#: Types shown in place: plain text and raster images, which run nothing. Not SVG (an image
#: that can hold scripts), nor PDF: the sandbox policy that every file carries keeps Chromium's
#: and Safari's PDF viewers from showing it, and a PDF can carry scripts of its own; it is
#: downloaded, and opened in the reader's own viewer. A site that wants more shown in place
#: (audio, video) adds their types here, knowing what the browser does with them.
INLINE_TYPES = frozenset({"text/plain", "image/png", "image/jpeg", "image/gif", "image/webp", "image/avif"})

#: Sent with every file: no script runs, nothing is loaded (the inline styles that browsers'
#: own documents for an image or a text use are allowed), no form is sent, no window opened.
CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'; sandbox"

#: The type of a file whose type is not known, or not one a response can carry.
UNKNOWN = "application/octet-stream"

# RFC 6838 section 4.2 (type and subtype names), and RFC 9110 section 8.3.1 (parameters).
_NAME = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = r'"(?:[\t\x20\x21\x23-\x5b\x5d-\x7e]|\\[\t\x20-\x7e])*"'
_MEDIA_TYPE_RE = re.compile(
    rf"(?P<essence>{_NAME}/{_NAME})(?P<parameters>(?:[ \t]*;[ \t]*{_TOKEN}=(?:{_TOKEN}|{_QUOTED}))*)"
)


def clean_media_type(value):
    """``value`` written the one way it is served and listed (``type/subtype`` in lower case,
    parameters as given), or :class:`ValidationError` saying what a media type is."""
    value = value.strip()
    found = _MEDIA_TYPE_RE.fullmatch(value)
    if found is None:
        raise ValidationError(
            "%(value)s is not a media type: write it as type/subtype (such as text/plain or "
            "application/pdf), optionally followed by parameters (; charset=utf-8).",
            code="invalid", params={"value": repr(value)},
        )
    return found["essence"].lower() + found["parameters"]


def served_type(item_file):
    """The type ``item_file`` is served with: its own, or else the one its name tells, or else
    :data:`UNKNOWN`. A stored type that is not a media type (a row written behind the admin's
    back) counts as none: it may not even be a valid header."""
    if item_file.media_type:
        try:
            return clean_media_type(item_file.media_type)
        except ValidationError:
            return UNKNOWN
    return mimetypes.guess_type(item_file.name)[0] or UNKNOWN


def shown_inline(content_type):
    """Whether a file of ``content_type`` may be shown in the browser rather than downloaded."""
    return content_type.split(";", 1)[0].strip().lower() in INLINE_TYPES


def protect(response):
    """``response``, serving an uploaded file, with the headers that keep it from running."""
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return response
