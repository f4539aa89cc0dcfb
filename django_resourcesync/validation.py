"""What makes a resource set publishable, checked before it is saved, whoever writes it.

The admin's set form and the REST API both write sets; both call :func:`validate_resource_set`,
so a set the one refuses the other refuses too, with the same words. The model's own field
validators (slug, filter shape, capability names, description URL) run before it, as Django and
DRF run them on each field; this is what needs the registered sources and the database.
"""

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.translation import gettext as _

from . import capabilities as table
from .sources import registry


def validate_resource_set(*, source, lookups, capabilities):
    """Raise :exc:`~django.core.exceptions.ValidationError`, a dict of messages by field
    (``source``, ``lookups``, ``capabilities``), if a set with these values cannot publish:

    - ``source`` is not a registered source;
    - it offers a dump (which holds the resources' bytes) of a source that gives no bytes;
    - the source's queryset rejects the filter ``lookups``. The filter is run once, so that what
      the database refuses (a bad regular expression, say) is an error here rather than a failed
      build later, in a savepoint, so that on PostgreSQL the error does not break the caller's
      transaction. A filter over no rows may not be checked (SQLite): its first build then fails
      and says why.

    A value that is ``None`` (its field failed its own validation already) is not checked, nor is
    a ``lookups`` that is not a dict (the model's validator says so).
    """
    errors = {}
    if source is not None and source not in registry:
        errors["source"] = _("%(source)s is not a registered source. Registered sources: %(names)s.") % {
            "source": source, "names": ", ".join(registry.names()) or "none",
        }
    if source in registry:
        dumps = table.needing_bytes(capabilities or [])
        if dumps and not registry.get(source).gives_bytes:
            names = ", ".join(str(table.get(name).label) for name in dumps)
            errors["capabilities"] = _(
                "The source %(source)s gives no bytes (neither a file nor content), so it cannot offer %(dumps)s: "
                "a dump holds the resources' bytes."
            ) % {"source": source, "dumps": names}
        if isinstance(lookups, dict):
            try:
                with transaction.atomic():
                    registry.get(source).queryset(lookups).exists()
            except Exception as exc:  # whatever a filter the ORM cannot build raises (IndexError, say)
                errors["lookups"] = _("The source rejects this filter: %(error)s") % {"error": exc}
    if errors:
        raise ValidationError(errors)
