"""Cursor pagination: a client follows ``next`` to the end and sees every row once.

Cursors, not page numbers, because the tables the API lists grow while they are read (the change
log above all): a page number shifts when rows are added in front of it, a cursor does not. The
change log is read oldest first, as a Change List lists it.
"""

from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination


class CursorPages(CursorPagination):
    """Pages of ``page_size`` rows (at most 1,000, default 100), oldest first. The first field of
    ``ordering`` is a number, unless ``position_is_text`` (see ``decode_cursor``)."""

    ordering = "id"
    position_is_text = False
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000

    def decode_cursor(self, request):
        # A cursor the client mangled is its error, not a missing page: 400, saying which
        # parameter. Its position is a value of the first ordering field: where that is a
        # number, anything else would fail in the database; a slug holds no NUL.
        try:
            cursor = super().decode_cursor(request)
            if cursor is not None and cursor.position is not None:
                if self.position_is_text:
                    if "\x00" in cursor.position:
                        raise ValueError(cursor.position)
                else:
                    int(cursor.position)
            return cursor
        except (NotFound, ValueError):
            raise ValidationError({self.cursor_query_param: [self.invalid_cursor_message]}) from None


class NewestFirst(CursorPages):
    """Builds: the newest first, as the admin lists them."""

    ordering = "-id"


class BySlug(CursorPages):
    """Sets, by slug: a cursor needs an ordering whose first field is unique (many sets may
    share a position), or past a thousand of them it cannot move on."""

    ordering = "slug"
    position_is_text = True
