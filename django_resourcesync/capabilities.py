"""The capabilities a set can offer (spec section 7, ``rs:md/@capability``): one table.

Each entry says everything the rest of the app needs to know of a capability: its name in the
documents, the document a Capability List points at, the label people read, the module that
builds it, whether it is rendered in parts, how it is served and what its documents link to.
Rebuilds, tasks, the Capability List, the URLs, the views and the admin read this table; adding
a capability is one entry here and its builder module (see docs/architecture.rst).

A builder (a module, or an object of a module named ``module:attribute``) provides
``update(resource_set, *, progress, batch_size, parallel, lock)``, which brings the capability's
documents up to date and returns the builds it made, and ``published(resource_set)``, when its
document last changed (``None`` while it has none); a capability
served ``"live"`` also provides ``serve(resource_set, name)`` (see
:class:`~django_resourcesync.served.Served`); one built ``in_parts`` provides what
:mod:`~django_resourcesync.builders.parts` asks of it.

A builder whose ``published()`` reads the database also provides ``published_expression()``:
the same date as an expression of a set's row, so that :func:`with_published` reads it for any
number of sets in the one query that fetches them (the Source Description, the REST API's list
of sets); its ``published()`` reads it from there (:func:`published_value`).
"""

import functools
from dataclasses import dataclass
from importlib import import_module

from django.utils.translation import gettext_lazy as _

DESCRIPTION = "description"
CAPABILITYLIST = "capabilitylist"
RESOURCELIST = "resourcelist"
CHANGELIST = "changelist"
RESOURCEDUMP = "resourcedump"
CHANGEDUMP = "changedump"
RESOURCEDUMP_MANIFEST = "resourcedump-manifest"
CHANGEDUMP_MANIFEST = "changedump-manifest"
RESOURCELIST_ARCHIVE = "resourcelist-archive"
RESOURCEDUMP_ARCHIVE = "resourcedump-archive"
CHANGELIST_ARCHIVE = "changelist-archive"
CHANGEDUMP_ARCHIVE = "changedump-archive"
FRAMEWORK_NOTIFICATION = "framework-notification"
CHANGE_NOTIFICATION = "change-notification"

#: Files in storage written by builds, served as they are.
STORED = "stored"
#: Rendered from the database on each request (with conditional GET).
LIVE = "live"


@dataclass(frozen=True)
class Capability:
    name: str  #: ``rs:md/@capability``
    document: str  #: what the Capability List points at, under the set's URL prefix
    label: str  #: for people (admin, forms)
    builder_path: str  #: the dotted path of the module that builds it, or ``module:attribute``
    served: str = STORED  #: :data:`STORED` or :data:`LIVE`
    in_parts: bool = False  #: rendered in parts (by Celery workers when there are some)
    build_lock: bool = True  #: rebuilt under the set's build lock for it
    lists_resources: bool = False  #: lists the set's resources: its builds report left-out objects
    needs_bytes: bool = False  #: packs the resources' bytes: only for a source that gives them
    channel: bool = False  #: a notification channel (a WebSub topic), not a document framework notifications tell of

    @property
    def builder(self):
        """The builder (named by path: the table sits below the modules it names): a module,
        or ``module:attribute``, an object of the module with the same functions."""
        module, _, attribute = self.builder_path.partition(":")
        found = import_module(module)
        return getattr(found, attribute) if attribute else found

    @property
    def annotation(self):
        """The name of the value :func:`with_published` gives each set for it."""
        return "published_" + self.name.replace("-", "_")

    @property
    def folder(self):
        """The folder of the documents it has besides its main one (``changelist/3.xml``)."""
        return self.document.removesuffix(".xml")


#: In the order a Capability List names them.
TABLE = (
    Capability(RESOURCELIST, "resourcelist.xml", _("Resource List"), "django_resourcesync.builders.resourcelist",
               in_parts=True, lists_resources=True),
    Capability(CHANGELIST, "changelist.xml", _("Change List"), "django_resourcesync.builders.changelist",
               served=LIVE, build_lock=False),
    Capability(RESOURCEDUMP, "resourcedump.xml", _("Resource Dump"), "django_resourcesync.builders.resourcedump",
               in_parts=True, lists_resources=True, needs_bytes=True),
    Capability(CHANGEDUMP, "changedump.xml", _("Change Dump"), "django_resourcesync.builders.changedump", served=LIVE,
               needs_bytes=True),
    Capability(RESOURCELIST_ARCHIVE, "resourcelist-archive.xml", _("Resource List Archive"),
               "django_resourcesync.builders.archive:resourcelist", served=LIVE, build_lock=False),
    Capability(RESOURCEDUMP_ARCHIVE, "resourcedump-archive.xml", _("Resource Dump Archive"),
               "django_resourcesync.builders.archive:resourcedump", served=LIVE, build_lock=False),
    Capability(CHANGELIST_ARCHIVE, "changelist-archive.xml", _("Change List Archive"),
               "django_resourcesync.builders.archive:changelist", served=LIVE, build_lock=False),
    Capability(CHANGEDUMP_ARCHIVE, "changedump-archive.xml", _("Change Dump Archive"),
               "django_resourcesync.builders.archive:changedump", served=LIVE, build_lock=False),
    Capability(FRAMEWORK_NOTIFICATION, "framework-notification", _("Framework Notification"),
               "django_resourcesync.builders.channel", served=LIVE, build_lock=False, channel=True),
    Capability(CHANGE_NOTIFICATION, "change-notification", _("Change Notification"),
               "django_resourcesync.builders.channel", served=LIVE, build_lock=False, channel=True),
)
BY_NAME = {capability.name: capability for capability in TABLE}

#: Each archive capability, and the capability whose documents it archives.
ARCHIVES = {
    RESOURCELIST_ARCHIVE: RESOURCELIST, RESOURCEDUMP_ARCHIVE: RESOURCEDUMP,
    CHANGELIST_ARCHIVE: CHANGELIST, CHANGEDUMP_ARCHIVE: CHANGEDUMP,
}

# The capabilities a set can offer, for model and form choices.
CAPABILITY_CHOICES = [(capability.name, capability.label) for capability in TABLE]


def get(name):
    return BY_NAME[name]


def needing_bytes(names):
    """The capabilities among ``names`` that pack bytes (the dumps)."""
    return [name for name in names if name in BY_NAME and BY_NAME[name].needs_bytes]


def with_published(queryset):
    """The sets of ``queryset``, each fetched with the date each capability's document last
    changed (the builders' ``published_expression()``), in the same query whatever their number:
    ``published()`` then asks the database nothing more of them (see :func:`published_value`).
    Read at once: a value does not follow the builds published after the query. (Also
    ``ResourceSet.objects.with_published()``.)"""
    return queryset.annotate(**_published_expressions())


@functools.cache
def _published_expressions():
    """The expressions, made once: making them is a good part of what a request for the Source
    Description costs."""
    return {
        capability.annotation: capability.builder.published_expression()
        for capability in TABLE if hasattr(capability.builder, "published_expression")
    }


def published_value(resource_set, name, expression):
    """What the expression ``expression()`` makes (a builder's ``published_expression`` for the
    capability ``name``) is for ``resource_set``: read with the set if it was fetched by
    :func:`with_published`, else in a query of its own."""
    annotation = get(name).annotation
    if hasattr(resource_set, annotation):
        return getattr(resource_set, annotation)
    sets = type(resource_set)._default_manager.filter(pk=resource_set.pk)
    return sets.annotate(**{annotation: expression()}).values_list(annotation, flat=True).first()
