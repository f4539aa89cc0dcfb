"""Fingerprints computed by the database: a digest of a source's ``fingerprint_fields`` as an SQL
expression, so that a reconcile compares them with the recorded ones where the data is.

Each value is written as an SQL literal (SQLite's ``quote()``, PostgreSQL's ``quote_nullable()``:
text quoted with its quotes doubled, numbers as they are, a null as ``NULL``), the literals
joined with commas and digested with MD5 (PostgreSQL's own ``md5()``; on SQLite the Python
function Django registers, about 1.5 µs a row). A quoted literal ends where its quotes say, so
the text is a one-to-one image of the values: no comma inside a value can make two different
rows read the same. The digest is the database's: the
same values give the same digest in one database, not necessarily across two (a site that moves
to another database describes every object once, and writes no change event for an object whose
entry did not change).

This module imports nothing of the app: it sits below ``sources``.
"""

from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.db.models import F, Func
from django.db.models.functions import MD5

#: Databases whose digest of the fields is used; elsewhere fingerprints are made in Python.
VENDORS = ("sqlite", "postgresql")

#: Field types whose text form in the database is a faithful image of the value.
PLAIN = (
    models.IntegerField, models.CharField, models.TextField, models.DateTimeField, models.DateField,
    models.TimeField, models.BooleanField, models.DecimalField, models.FloatField, models.UUIDField,
    models.FileField, models.DurationField,
)


def lookup_path(model, lookup):
    """The fields a lookup of ``model``'s objects passes (``"item__collection__name"``: three),
    or ``None`` where one part is not a field ("pk", a transform, an annotation)."""
    path = []
    for part in lookup.split("__"):
        try:
            field = model._meta.get_field(part)
        except FieldDoesNotExist:
            return None
        path.append(field)
        model = field.related_model or model
    return path


def is_plain(model, lookup):
    """Whether ``lookup`` reads one column of a to-one path of plain fields."""
    path = lookup_path(model, lookup)
    if not path:
        return False
    *through, last = path
    if any(not (field.many_to_one or field.one_to_one) or not field.concrete for field in through):
        return False
    if last.is_relation:
        return (last.many_to_one or last.one_to_one) and last.concrete and isinstance(last.target_field, PLAIN)
    return last.concrete and isinstance(last, PLAIN)


class _Quoted(Func):
    """One value as an SQL literal: quoted and escaped text, a number, ``NULL``."""

    output_field = models.TextField()

    def as_sqlite(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, function="QUOTE", **extra)

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, function="QUOTE_NULLABLE", **extra)


class _Joined(Func):
    """The literals, a comma after each (a literal holds no bare comma: the text is one-to-one)."""

    arg_joiner = " || ',' || "
    template = "(%(expressions)s)"
    output_field = models.TextField()


def digest(model, lookups, vendor="postgresql"):
    """The SQL expression of the digest of ``lookups`` (fields of ``model``, as for
    ``values_list()``), or ``None`` where one of them is not a plain column of a to-one path."""
    lookups = list(lookups)
    if not lookups or not all(isinstance(lookup, str) and is_plain(model, lookup) for lookup in lookups):
        return None
    return MD5(_Joined(*(_Quoted(F(lookup)) for lookup in lookups)))
