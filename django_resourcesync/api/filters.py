"""The query parameters that narrow a list, read strictly: a value that cannot be understood is a
400 naming the parameter and saying what it takes, never an empty list or a 500.

Datetimes are W3C datetimes (https://www.w3.org/TR/NOTE-datetime), as ResourceSync writes them:
a year, a month, a day (midnight UTC), or a time with its zone (``Z`` or ``+hh:mm``).
"""

import datetime
import re

from django.utils.translation import gettext as _
from rest_framework.exceptions import ValidationError

_W3C = re.compile(
    r"(?P<year>\d{4})(?:-(?P<month>\d{2})(?:-(?P<day>\d{2})"
    r"(?:T(?P<hour>\d{2}):(?P<minute>\d{2})(?::(?P<second>\d{2})(?:\.(?P<fraction>\d+))?)?"
    r"(?P<zone>Z|[+-]\d{2}:\d{2}))?)?)?",
    re.ASCII,  # digits are 0-9 only
)
#: What a set's slug can be (Django's slug: ASCII letters, digits, hyphens, underscores).
SLUG = re.compile(r"[-a-zA-Z0-9_]+")


def parse_w3c_datetime(value):
    """The aware datetime a W3C datetime names (its first instant), or ``None`` if it is not one."""
    # An unescaped "+" in a query string arrives as a space.
    match = _W3C.fullmatch(value.strip().replace(" ", "+"))
    if match is None:
        return None
    parts = match.groupdict()
    zone = parts["zone"]
    if zone in (None, "Z"):
        tz = datetime.timezone.utc
    else:
        hours, minutes = int(zone[1:3]), int(zone[4:6])
        if hours > 23 or minutes > 59:
            return None
        offset = datetime.timedelta(hours=hours, minutes=minutes)
        tz = datetime.timezone(-offset if zone[0] == "-" else offset)
    try:
        return datetime.datetime(
            int(parts["year"]), int(parts["month"] or 1), int(parts["day"] or 1),
            int(parts["hour"] or 0), int(parts["minute"] or 0), int(parts["second"] or 0),
            int((parts["fraction"] or "0")[:6].ljust(6, "0")), tzinfo=tz,
        ).astimezone(datetime.timezone.utc)
    except (ValueError, OverflowError):  # 2024-02-30, 25:00; 9999-12-31T23:00-01:00 is past the year 9999 in UTC
        return None


def refuse(name, message):
    raise ValidationError({name: [message]})


def datetime_param(request, name):
    """The datetime of the query parameter ``name``, or ``None`` if it is not given."""
    value = request.query_params.get(name)
    if value is None:
        return None
    moment = parse_w3c_datetime(value)
    if moment is None:
        refuse(name, _("%(value)r is not a W3C datetime, such as 2024-05-01T12:00:00Z or 2024-05-01.") % {"value": value})
    return moment


def choice_param(request, name, choices):
    """The value of the query parameter ``name`` if it is one of ``choices``; ``None`` if not given."""
    value = request.query_params.get(name)
    if value is None:
        return None
    if value not in choices:
        refuse(name, _("%(value)r is not one of: %(choices)s.") % {"value": value, "choices": ", ".join(choices)})
    return value


def set_param(request, sets):
    """The set (among the queryset ``sets``, those the user may see) whose slug the ``set``
    parameter gives; ``None`` if not given. A set the user may not see is unknown to it."""
    slug = request.query_params.get("set")
    if slug is None:
        return None
    # A slug is letters, digits, hyphens and underscores: anything else (a NUL, which
    # PostgreSQL's text cannot hold) is no set's, and is not sent to the database.
    found = sets.filter(slug=slug).first() if SLUG.fullmatch(slug) else None
    if found is None:
        refuse("set", _("No set you may see has the slug %(slug)r.") % {"slug": slug})
    return found
