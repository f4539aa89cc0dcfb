"""Bulk inserts without the ORM's per-object work, for the tables that change tracking fills.

``bulk_create`` builds a model instance per row and prepares every value through its field;
change tracking writes tens of thousands of rows of a few plain columns at a time, so it hands
tuples straight to the driver's ``executemany`` instead, with the few conversions the database
needs (datetimes, JSON) looked up once per column.
"""

import functools

from django.db import connections

BATCH = 2000


def _converter(field, connection):
    kind = field.get_internal_type()
    if kind == "DateTimeField":
        return connection.ops.adapt_datetimefield_value
    if kind == "JSONField":
        return lambda value: field.get_db_prep_save(value, connection)
    return None  # text, numbers and foreign keys go as they are


@functools.lru_cache(maxsize=None)
def _statement(model, fields, using):
    connection = connections[using]
    meta = model._meta
    columns = [meta.get_field(name.removesuffix("_id") if name.endswith("_id") else name) for name in fields]
    quote = connection.ops.quote_name
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(field.column) for field in columns)}) "
        f"VALUES ({', '.join(['%s'] * len(columns))})"
    )
    converters = tuple(_converter(field, connection) for field in columns)
    return sql, converters if any(converters) else None


def insert(model, fields, rows, using):
    """Insert ``rows`` (tuples of values for the attributes ``fields``, a tuple, foreign keys by
    their ``_id``) into ``model``'s table, in the current transaction of database ``using``."""
    sql, converters = _statement(model, tuple(fields), using)
    if converters:
        rows = [tuple(value if convert is None or value is None else convert(value) for value, convert in zip(row, converters)) for row in rows]
    elif not isinstance(rows, list):
        rows = list(rows)
    with connections[using].cursor() as cursor:
        for start in range(0, len(rows), BATCH):
            cursor.executemany(sql, rows[start : start + BATCH])
