"""Fingerprints computed by the database: a digest of a source's ``fingerprint_fields`` as an SQL
expression, so that a reconcile compares them with the recorded ones where the data is.

Each value is written as an SQL literal (SQLite's ``quote()``, PostgreSQL's ``quote_nullable()``:
text quoted with its quotes doubled, numbers as they are, a null as ``NULL``), the literals
joined with commas. A quoted literal ends where its quotes say, so the text is a one-to-one image
of the values: no comma inside a value can make two different rows read the same. PostgreSQL
digests that text with its own ``md5()``. On SQLite a digest is a Python function Django
registers, called once a row (about 1.5 µs, a third of a reconcile with nothing changed): there
a text of at most ``SHORT`` characters is its own fingerprint, marked with a leading ``=`` (no
MD5 digest starts so), and only a longer one is digested. The fingerprint is the database's: the
same values give the same one in one database, not necessarily across two (a site that moves to
another database describes every object once, and writes no change event for an object whose
entry did not change).

This module imports nothing of the app: it sits below ``sources``.
"""

import hashlib

from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.db.models import F, Func, OuterRef, Q
from django.db.models.functions import MD5

#: Databases whose digest of the fields is used; elsewhere fingerprints are made in Python.
VENDORS = ("sqlite", "postgresql")

#: On SQLite, the longest text of the values that is kept as it is rather than digested (a
#: fingerprint is stored in 512 characters, with room left for the sizes of files).
SHORT = 256

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


class _ShortOrDigest(Func):
    """SQLite: the text itself, marked with ``=``, when it has at most ``SHORT`` characters,
    else its MD5 digest (the text's SQL, a few ``quote()`` and concatenations, is repeated: far
    cheaper than a call of a Python function)."""

    output_field = models.TextField()

    def as_sql(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        digested, digest_params = compiler.compile(MD5(self.source_expressions[0]))
        return (
            f"(CASE WHEN LENGTH({sql}) <= {SHORT} THEN '=' || {sql} ELSE {digested} END)",
            (*params, *params, *digest_params),
        )


def digest(model, lookups, vendor="postgresql"):
    """The SQL expression of the fingerprint of ``lookups`` (fields of ``model``, as for
    ``values_list()``) on the database ``vendor``, or ``None`` where one of them is not a plain
    column of a to-one path."""
    lookups = list(lookups)
    if not lookups or not all(isinstance(lookup, str) and is_plain(model, lookup) for lookup in lookups):
        return None
    text = _Joined(*(_Quoted(F(lookup)) for lookup in lookups))
    return _ShortOrDigest(text) if vendor == "sqlite" else MD5(text)


def digested_form(fingerprint):
    """The form a short SQLite fingerprint (``=`` and the text) had before such texts were kept
    as they are: their MD5 digest, sizes of files following as they do. ``None`` for another."""
    if not fingerprint or not fingerprint.startswith("="):
        return None
    text, sizes = fingerprint[1:], ""
    # The sizes follow the last literal (a number, NULL or a quoted text) after a colon.
    head, colon, tail = text.rpartition(":")
    if colon and (tail == "" or all(part == "" or part.isdigit() for part in tail.split(","))):
        text, sizes = head, colon + tail
    return hashlib.md5(text.encode()).hexdigest() + sizes


#: The annotations of the objects' query that :func:`recorded_is` refers to.
FINGERPRINT, TEXT = "_rs_fingerprint", "_rs_fingerprint_text"


def annotations(expression):
    """What to annotate the objects' query with (``{name: expression}``) so that a query of
    their records can test :func:`recorded_is`: the fingerprint ``expression`` (:func:`digest`),
    and on SQLite its text as well."""
    found = {FINGERPRINT: expression}
    if isinstance(expression, _ShortOrDigest):
        found[TEXT] = expression.source_expressions[0]
    return found


def recorded_is(expression):
    """The condition, on a query of records inside the objects' query (annotated with
    :func:`annotations`), that a record's ``fingerprint`` is its object's. On SQLite the text of
    the values is made once a row rather than three times (its length, the fingerprint, the
    comparison): that is most of what the comparison costs."""
    if isinstance(expression, _ShortOrDigest):
        return _RecordedIs(F("fingerprint"), OuterRef(TEXT))
    return Q(fingerprint=OuterRef(FINGERPRINT))


class _RecordedIs(Func):
    """SQLite: whether the recorded fingerprint (the first expression) is that of the text (the
    second) as :class:`_ShortOrDigest` makes it: ``=`` and the text, as long as that is short,
    else the text's digest, which is only made when the record holds a digest."""

    output_field = models.BooleanField()
    conditional = True

    def as_sql(self, compiler, connection, **extra):
        recorded, recorded_params = compiler.compile(self.source_expressions[0])
        text, text_params = compiler.compile(self.source_expressions[1])
        digested, digest_params = compiler.compile(MD5(self.source_expressions[1]))
        return (
            f"(({recorded} = '=' || {text} AND LENGTH({recorded}) <= {SHORT + 1}) "
            f"OR (LENGTH({recorded}) = 32 AND LENGTH({text}) > {SHORT} AND {recorded} = {digested}))",
            (*recorded_params, *text_params, *recorded_params, *recorded_params, *text_params, *recorded_params,
             *digest_params),
        )
