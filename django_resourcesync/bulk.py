"""Bulk inserts without the ORM's per-object work, for the tables that change tracking fills.

``bulk_create`` builds a model instance per row and prepares every value through its field;
change tracking writes tens of thousands of rows of a few plain columns at a time, so it hands
tuples straight to multi-row ``INSERT`` statements instead, with the few conversions the
database needs (datetimes, JSON) looked up once per column.
"""

import functools
import json

from django.core.exceptions import FieldDoesNotExist
from django.db import connections, models
from django.db.models import F, Lookup
from django.db.models.expressions import RawSQL

#: Rows per INSERT statement at most (fewer where the database limits parameters).
ROWS_PER_STATEMENT = 500
#: Rows from which COPY pays on PostgreSQL (it takes more round trips than one INSERT).
COPY_FROM = 50


def _converter(field, connection):
    kind = field.get_internal_type()
    if kind == "DateTimeField":
        return _remembering(connection.ops.adapt_datetimefield_value)
    if kind == "JSONField":
        return lambda value: field.get_db_prep_save(value, connection)
    return None  # text, numbers and foreign keys go as they are


def _remembering(convert):
    """``convert`` for a column whose rows often share a value (the datetime of the events of
    one batch, of the records written together): each value converted once."""
    return functools.lru_cache(maxsize=256)(convert)


@functools.lru_cache(maxsize=None)
def _statement(model, fields, using):
    """The start of the INSERT, the placeholders of one row, ``(index, converter)`` of the
    columns whose values need converting, and how many rows one statement may carry (the
    database's limit on parameters)."""
    connection = connections[using]
    meta = model._meta
    columns = [meta.get_field(name.removesuffix("_id") if name.endswith("_id") else name) for name in fields]
    quote = connection.ops.quote_name
    target = f"{quote(meta.db_table)} ({', '.join(quote(field.column) for field in columns)})"
    placeholders = f"({', '.join(['%s'] * len(columns))})"
    converters = tuple(
        (index, convert) for index, convert in enumerate(_converter(field, connection) for field in columns) if convert
    )
    per_statement = max(1, min(ROWS_PER_STATEMENT, connection.ops.bulk_batch_size(columns, [None] * ROWS_PER_STATEMENT)))
    return target, placeholders, converters, per_statement


def _converted(rows, converters):
    """``rows`` as a list, their values in the columns of ``converters`` converted."""
    if not converters:
        return rows if isinstance(rows, list) else list(rows)
    rows = [list(row) for row in rows]
    for index, convert in converters:
        for row in rows:
            if row[index] is not None:
                row[index] = convert(row[index])
    return rows


def insert(model, fields, rows, using):
    """Insert ``rows`` (tuples of values for the attributes ``fields``, foreign keys by their
    ``_id``) into ``model``'s table, in the current transaction of database ``using``: by
    ``COPY`` on PostgreSQL (psycopg 3) for more than a few rows, else a multi-row INSERT per few
    hundred rows."""
    target, placeholders, converters, per_statement = _statement(model, tuple(fields), using)
    rows = _converted(rows, converters)
    if not rows:
        return
    connection = connections[using]
    with connection.cursor() as cursor:
        raw = cursor.cursor
        if len(rows) >= COPY_FROM and connection.vendor == "postgresql" and hasattr(raw, "copy"):
            with raw.copy(f"COPY {target} FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            return
        for start in range(0, len(rows), per_statement):
            batch = rows[start : start + per_statement]
            cursor.execute(
                f"INSERT INTO {target} VALUES " + ", ".join([placeholders] * len(batch)),
                [value for row in batch for value in row]
            )


def rewrite(model, fields, rows, using, *, same=()):
    """Write ``rows`` again in place: tuples of the key and the values of ``fields`` (as
    :func:`insert` takes them) of rows of ``model`` that exist, in the current transaction of
    database ``using``; ``same`` names the fields whose values the rows already have.

    On PostgreSQL the rows are deleted and copied in again: an UPDATE that changes an indexed
    column writes a new version of the row into every index anyway, and COPY is the quickest way
    in. Elsewhere one UPDATE of the other fields is run for every row: it writes only the
    indexes of the columns it sets (a row deleted and inserted again would write them all)."""
    if not rows:
        return
    connection = connections[using]
    if connection.vendor == "postgresql":
        filter_in(model._base_manager.using(using), "pk", [row[0] for row in rows]).delete()
        insert(model, (model._meta.pk.attname, *fields), rows, using)
        return
    kept = [index for index, name in enumerate(fields) if name not in same]
    fields = tuple(fields[index] for index in kept)
    _target, _placeholders, converters, _per_statement = _statement(model, fields, using)
    rows = _converted([[*(row[index + 1] for index in kept), row[0]] for row in rows], converters)
    meta = model._meta
    quote = connection.ops.quote_name
    columns = [meta.get_field(name.removesuffix("_id") if name.endswith("_id") else name).column for name in fields]
    assignments = ", ".join(f"{quote(column)} = %s" for column in columns)
    with connection.cursor() as cursor:
        cursor.executemany(f"UPDATE {quote(meta.db_table)} SET {assignments} WHERE {quote(meta.pk.column)} = %s", rows)


def filter_in(queryset, name, values):
    """``queryset.filter(<name>__in=values)`` for thousands of values, which the ORM prepares
    one at a time: the values go as one parameter instead (an array on PostgreSQL, a JSON array
    on SQLite). ``name`` is a field of the queryset's model (``"pk"`` too) or a foreign key of
    it; lookups across relations, other fields and other databases take the ORM's way.

    On PostgreSQL the test is ``column = ANY(array)``, not ``column IN (SELECT unnest(array))``:
    the planner knows an array's length, not a subquery's, and on a table it has not analyzed
    since thousands of rows came in (the pending changes, just after a bulk ``changed()``) the
    subquery's form made it compare every row with every value (seconds for each batch)."""
    values = [value for value in values if value is not None]  # as the ORM's __in does
    try:
        field = queryset.model._meta.pk if name == "pk" else queryset.model._meta.get_field(name)
    except FieldDoesNotExist:
        field = None
    if isinstance(field, models.ForeignKey):
        field = field.target_field  # compared by the key it holds
    connection = connections[queryset.db]
    vendor = connection.vendor
    if vendor == "sqlite" and not connection.features.supports_json_field:  # no JSON1
        vendor = None
    if isinstance(field, models.IntegerField):  # auto fields too
        prepared, array_type = [int(value) for value in values], "bigint"
    elif isinstance(field, models.CharField):
        # text, not varchar(n): a cast to the column's type would cut longer values to size.
        prepared, array_type = [str(value) for value in values], "text"
    else:
        prepared = None
    if prepared is None or vendor not in ("postgresql", "sqlite"):
        return queryset.filter(**{f"{name}__in": values})
    if vendor == "postgresql":
        return queryset.filter(_EqualsAny(F(name), (prepared, array_type)))
    source = RawSQL("SELECT value FROM json_each(%s)", [json.dumps(prepared)])
    return queryset.filter(**{f"{name}__in": source})


class _EqualsAny(Lookup):
    """``column = ANY(%s::<type>[])`` on PostgreSQL, the right-hand side ``(values, type)``."""

    lookup_name = "resourcesync_equals_any"
    prepare_rhs = False

    def get_prep_lookup(self):
        return self.rhs

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        values, array_type = self.rhs
        return f"{lhs} = ANY(%s::{array_type}[])", (*lhs_params, values)
