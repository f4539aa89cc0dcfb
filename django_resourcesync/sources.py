"""The publishing API: say which objects are resources and what each one publishes.

Modelled on :class:`django.contrib.sitemaps.Sitemap`: subclass :class:`ResourceSource`, set
``model`` or override ``items()``, and describe each object with hooks that may be attributes or
methods taking the object. Register the class in a ``resourcesync.py`` module of your app::

    from django_resourcesync import sources

    @sources.register
    class BitstreamSource(sources.ResourceSource):
        name = "bitstreams"
        def items(self):
            return Bitstream.objects.filter(item__is_public=True)
        def file(self, obj):
            return obj.file

Only what ``items()`` returns is ever published: leave out whatever the site does not show to the
public there.
"""

import hashlib
import logging
import mimetypes
import os
import re
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from functools import cached_property

from django.core.exceptions import ImproperlyConfigured
from django.core.files.storage import FileSystemStorage, Storage
from django.db import DatabaseError, connections, models
from django.db.models.fields.files import FieldFile

from . import bulk, fingerprints
from .entries import CHANGEFREQS, Entry, Representation, clean_link, clean_links, normalise_media_type
from .exceptions import AlreadyRegistered, NotRegistered, UnpublishableResource
from .rendering import render_location
from .uris import absolute_uri, encode_uri

# Kept importable from here, the publishing API's module, for sites and their tests.
__all__ = [
    "AlreadyRegistered", "Entry", "NotRegistered", "Representation", "ResourceSource", "SourceRegistry", "UnpublishableResource",
    "ViewSource", "absolute_uri", "clean_link", "clean_links", "encode_uri", "normalise_media_type", "register", "registry",
]

logger = logging.getLogger(__name__)

READ_CHUNK = 1024 * 1024
#: Files :meth:`ResourceSource.prefetch` opens at a time, and how much of each it asks for
#: (the rest comes by the system's own read-ahead as the file is read).
PREFETCH_THREADS = 16
PREFETCH_BYTES = 8 * 1024 * 1024
#: A file asked for in more than this (on average) was looked for on the disk, not in memory.
PREFETCH_SLOW_SECONDS = 100e-6
#: Threads that read and hash files ahead of the thread that describes them
#: (:meth:`ResourceSource.read_ahead`), and how many files each of their tasks takes.
READ_AHEAD_THREADS = 3
READ_AHEAD_CHUNK = 64
#: A content coding token (RFC 9110: gzip, br, deflate...).
ENCODING_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")


def _advise(path):
    """Open ``path`` and tell the operating system its bytes will be read soon (no error)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, PREFETCH_BYTES, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def _advise_all(paths):
    for path in paths:
        _advise(path)


def _digest_files(paths):
    """``[(md5, sha256, length) or (where, exc)]`` of the files ``paths``, read and hashed (on a
    thread of the read-ahead pool: opening and reading let the interpreter go, and so does
    hashing a chunk of more than 2 KiB)."""
    found = []
    for path in paths:
        try:
            handle = open(path, "rb")  # noqa: SIM115 - closed below
        except (OSError, ValueError) as exc:
            found.append(("open", exc))
            continue
        md5, sha256, length = hashlib.md5(), hashlib.sha256(), 0
        try:
            with handle:
                while chunk := handle.read(READ_CHUNK):
                    md5.update(chunk)
                    sha256.update(chunk)
                    length += len(chunk)
        except OSError as exc:
            found.append(("read", exc))
            continue
        found.append((md5.hexdigest(), sha256.hexdigest(), length))
    return found


_pool = {"pid": None, "executor": None}
_pool_lock = threading.Lock()


def _read_ahead_pool():
    """The process's read-ahead threads, started when first needed (again in a forked child,
    which has none of its parent's threads)."""
    with _pool_lock:
        if _pool["pid"] != os.getpid():
            _pool["executor"] = ThreadPoolExecutor(READ_AHEAD_THREADS, thread_name_prefix="resourcesync-read")
            _pool["pid"] = os.getpid()
        return _pool["executor"]


def _reads_as_opened(f):
    """Whether the bytes of the ``FieldFile`` ``f`` are those of the file at its storage's path,
    read as Django's own filesystem storage opens it: a committed file not yet opened, of a
    ``FileSystemStorage`` that opens, and finds, its files the default way."""
    if type(f).open is not FieldFile.open or not getattr(f, "_committed", False) or getattr(f, "_file", None) is not None:
        return False
    storage = f.storage
    kind = storage.__class__  # the class of the storage a LazyObject (default_storage) wraps
    return (
        isinstance(storage, FileSystemStorage) and kind.open is Storage.open and kind._open is FileSystemStorage._open
        and kind.path is FileSystemStorage.path
    )


class ReadAhead:
    """The bytes of one object's file, being read and hashed by the read-ahead pool
    (:meth:`ResourceSource.read_ahead`)."""

    __slots__ = ("source", "name", "task", "index")

    def __init__(self, source, name, task, index):
        self.source, self.name, self.task, self.index = source, name, task, index

    def representation(self, obj):
        """The :class:`Representation` of ``obj``'s file, as :meth:`ResourceSource.representation`
        gives it (the same failures, with the same words)."""
        found = self.task.result()[self.index]
        if found[0] == "open":
            raise UnpublishableResource(f"cannot read {self.name}: {found[1]}") from found[1]
        if found[0] == "read":
            raise UnpublishableResource(f"cannot read the bytes of {obj!r}: {found[1]}") from found[1]
        md5, sha256, length = found
        return Representation(md5, sha256, length, self.source._declared_media_type(obj))


class ResourceSource:
    """Base class of a source of resources. Override what differs from the defaults.

    ``items()``
        A queryset of the objects that are published resources (default: every object of
        ``model``). Filter out here whatever the public site does not show.
    ``fingerprint(obj)``
        A cheap value that changes whenever the bytes do; the bytes are read and hashed again
        only when it changes. Default: the file's name, size and ``lastmod``; with no file,
        ``lastmod``. Return ``None`` to read the bytes on every pass.
    ``fingerprint_fields``
        Instead of ``fingerprint()``: the fields (lookups, as for ``values_list()``) the
        fingerprint is made of, read straight from the database, so that reconciling a set does
        not build its objects (see :meth:`fingerprint_of_values`).

    The hooks below take the object, and may also be plain attributes (as in Django's
    ``Sitemap``):

    ``location(obj)``
        A path or absolute URI; default ``obj.get_absolute_url()``. Paths are made absolute with
        ``RESOURCESYNC["BASE_URL"]``.
    ``lastmod(obj)``
        An aware datetime, or ``None``.
    ``file(obj)``
        A ``FieldFile`` whose bytes are the resource; hashes, length and type come from it. An
        object whose file cannot be read is left out of the lists (it could not be served).
    ``content(obj)``
        The bytes of the resource (or ``(bytes, media_type)``), when they are not a file.
        :class:`ViewSource` renders them from the site's own view. ``None``: the bytes are not
        known, and the resource is listed without hashes and length.
    ``media_type(obj)``
        Media type; default: guessed from the file name, or given by ``content()``.
    ``links(obj)``
        A list of dicts with ``rel``, ``href`` and optional ``type``, ``length``, ``hash``,
        ``modified``, ``pri``, ``encoding``, ``profile``, ``path`` (spec section 14).
    ``changefreq(obj)``
        One of always, hourly, daily, weekly, monthly, yearly, never.
    ``encoding(obj)``
        The content encoding the resource is served with (``gzip``, say), when it is; the
        hashes and length are those of the bytes as served (``rs:md encoding``).

    One hook takes many objects at once, and must be a method:

    ``contents(objects)``
        Optional, a faster way to ``content()`` where the site can render many objects together
        (their data in one query, say). Given a list of objects, returns ``{obj.pk: content}``,
        each value what ``content(obj)`` returns for that object, exactly: the same bytes (those
        served at ``location(obj)``, middleware included) and media type. Called once per
        batch, with the objects whose bytes must be read (their fingerprint changed, or they
        have no record yet; not those with a ``file()``). An object missing from the answer (or
        whose value is ``None``) goes through ``content(obj)``, as does every object when it
        returns ``None`` (the default) or raises: leave out an object that cannot be rendered
        there, and ``content()`` renders it, or says why it cannot be published. ``content()``
        is still needed: for those objects, and for the bytes of dumps.

    Each save is a change, and its change event has the bytes of the state it left, even when
    the object changed again before its change was processed (a worker outage): see
    :meth:`saved_state`.
    """

    name = None
    model = None
    changefreq = None
    #: Whether :meth:`fingerprint` changes whenever anything the entry shows does (URI, lastmod,
    #: links, bytes, media type), not only the bytes. Then reconciling (and rebuilding) skips
    #: describing again an object whose fingerprint has not changed: much faster, and correct
    #: only if the promise holds.
    fingerprint_covers_entry = False
    #: The fields (lookups, as for ``values_list()``, related ones included) the fingerprint is
    #: made of; :meth:`fingerprint_of_values` turns their values into it, and ``fingerprint()``
    #: is not called. Empty: ``fingerprint(obj)`` makes it.
    fingerprint_fields = ()
    #: ``{file field: size field}``: where the model records the size of a file among
    #: ``fingerprint_fields``, the lookup of that size (``{"file": "file_size"}``). The size is
    #: then read in the database with the other fields, and the storage is not asked for it.
    fingerprint_file_sizes = {}
    #: Other models whose saves and deletes can change this source's entries (for example the
    #: item of a file, when ``items()`` leaves out the files of private items). A mapping
    #: ``{Model: "lookup"}`` gives the lookup from the source's objects to the related one
    #: (``{Item: "item"}`` for files pointing at their item); with a plain list of models, say
    #: which objects each change affects in :meth:`affected`.
    related_models = ()

    def items(self):
        if self.model is None:
            raise ImproperlyConfigured(f"{type(self).__name__} sets neither `model` nor `items()`.")
        return self.model._default_manager.all()

    def location(self, obj):
        return obj.get_absolute_url()

    def lastmod(self, obj):
        return None

    def file(self, obj):
        return None

    def content(self, obj):
        return None

    def contents(self, objects):
        """``{obj.pk: content}`` of many ``objects`` at once, or ``None`` where the source cannot
        (then each goes through :meth:`content`). See the class's list of hooks."""
        return None

    def media_type(self, obj):
        return None

    def links(self, obj):
        return []

    def encoding(self, obj):
        return None

    def fingerprint(self, obj):
        if self.fingerprint_fields:
            # One object alone (change tracking reads the values of a batch in one query).
            queryset = self.items().filter(pk=obj.pk)
            if self.fingerprints_in_database(queryset.db):
                return self.fingerprints_of_queryset(queryset).get(str(obj.pk))
            values = queryset.values_list(*self.fingerprint_fields).first()
            return None if values is None else self.fingerprint_of_values(values)
        lastmod = self._get("lastmod", obj)
        f = self._get("file", obj)
        if f:
            try:
                return f"{f.name}:{f.size}:{lastmod}"
            except (OSError, ValueError):
                return None
        return lastmod.isoformat() if lastmod else None

    def fingerprint_of_values(self, values):
        """The fingerprint of an object from the values of its ``fingerprint_fields`` (a tuple,
        in their order): a digest of them, where a file field stands for its file's name and
        size (the bytes of a file can change under the same name). ``None`` when a file cannot
        be read.

        Not called where the database makes the digest (SQLite and PostgreSQL, every field a
        column of the object or of a to-one relation, this method not overridden): see
        :meth:`fingerprints_in_database`."""
        values = list(values)
        for index, storage in self._fingerprint_files:
            name = values[index]
            if name:
                try:
                    values[index] = (name, storage.size(name))
                except (OSError, ValueError, NotImplementedError):
                    return None
        return hashlib.sha256(repr(values).encode()).hexdigest()

    @cached_property
    def _fingerprint_files(self):
        """``(index, storage)`` of the file fields among ``fingerprint_fields``."""
        files = []
        for index, lookup in enumerate(self.fingerprint_fields):
            path = self._lookup_path(lookup)
            if path and isinstance(path[-1], models.FileField):
                files.append((index, path[-1].storage))
        return files

    # -- fingerprints made by the database -------------------------------------------------

    @cached_property
    def _fingerprint_digest(self):
        """``(lookups, [(file lookup, storage)])``: what the database digests (``fingerprint_fields``,
        file fields as their names, and the sizes ``fingerprint_file_sizes`` names), and the file
        fields whose sizes the storage gives; ``None`` where the database cannot digest them."""
        fields = self.fingerprint_fields
        if not fields or isinstance(fields, str):
            return None
        if type(self).fingerprint_of_values is not ResourceSource.fingerprint_of_values:
            return None  # the site shapes the value itself
        sizes = dict(self.fingerprint_file_sizes or {})
        lookups = [*fields, *sizes.values()]
        if fingerprints.digest(self.item_model, lookups) is None:
            return None
        files = [(fields[index], storage) for index, storage in self._fingerprint_files if fields[index] not in sizes]
        return lookups, files

    def fingerprints_in_database(self, using):
        """Whether the fingerprints of this source's objects are digests the database makes of
        ``fingerprint_fields`` (plus each file's size, from the storage or a size field), so that
        a reconcile compares them with the record without reading the values out."""
        return self._fingerprint_digest is not None and connections[using].vendor in fingerprints.VENDORS

    def fingerprint_expression(self, using="default"):
        """The SQL expression of the database's part of the fingerprint (see
        :meth:`fingerprints_in_database`) on database ``using``, and the lookups of the file
        fields whose sizes complete it."""
        lookups, files = self._fingerprint_digest
        expression = fingerprints.digest(self.item_model, lookups, connections[using].vendor)
        return expression, [lookup for lookup, _storage in files]

    def fingerprint_with_sizes(self, digest, names, sizes):
        """The fingerprint from the database's digest and the names of the files (in the order
        of :meth:`fingerprint_expression`'s lookups), their sizes read through ``sizes``, a
        list of :class:`~django_resourcesync.listing.FileSizes` (:meth:`file_sizes`); ``None``
        when a file's size cannot be had."""
        if not names:
            return digest
        parts = []
        for name, listing in zip(names, sizes):
            if not name:
                parts.append("")
                continue
            try:
                parts.append(str(listing.size(name)))
            except (OSError, ValueError, NotImplementedError):
                return None
        return f"{digest}:{','.join(parts)}"

    def file_sizes(self):
        """A :class:`~django_resourcesync.listing.FileSizes` per file field whose size completes
        the fingerprint (one for the fields of one storage)."""
        from .listing import FileSizes

        shared = {}
        return [shared.setdefault(id(storage), FileSizes(storage)) for _lookup, storage in self._fingerprint_digest[1]]

    def fingerprints_of_queryset(self, queryset, sizes=None):
        """``{key: fingerprint or None}`` of the objects of ``queryset`` (of this source's
        model), made by the database where :meth:`fingerprints_in_database`, else from the
        values of ``fingerprint_fields`` by :meth:`fingerprint_of_values`."""
        if not self.fingerprints_in_database(queryset.db):
            rows = queryset.values_list("pk", *self.fingerprint_fields)
            return {str(pk): self.fingerprint_of_values(values) for pk, *values in rows}
        expression, files = self.fingerprint_expression(queryset.db)
        rows = list(queryset.values_list("pk", expression, *files))
        if sizes is None:
            sizes = self.file_sizes()
        for index, listing in enumerate(sizes):
            listing.prepare(row[2 + index] for row in rows)
        return {str(pk): self.fingerprint_with_sizes(digest, names, sizes) for pk, digest, *names in rows}

    def _lookup_path(self, lookup):
        """The fields a lookup of the source's objects passes (``"item__collection__name"``:
        three), or ``None`` where one part is not a field ("pk", a transform, an annotation)."""
        return fingerprints.lookup_path(self.item_model, lookup)

    def saved_state(self, obj):
        """What processing needs of the state a save of ``obj`` left, should the object change
        again before that save is processed: a small JSON-able dict, or ``None`` for nothing.
        Called in the saving transaction, for every save: keep it cheap (no reading of files,
        no queries). Default: the storage name of the object's file. The bytes of that state
        are then read from that name, as long as the file is neither deleted nor overwritten
        before its change is processed (Django's storages keep a replaced file, under its own
        name, unless told to overwrite)."""
        f = self._get("file", obj)
        name = getattr(f, "name", None) if f else None
        return {"file": name} if name else None

    def state_bitstream(self, obj, state):
        """``(chunks, media_type)`` of the bytes of an earlier state of ``obj``, from what
        :meth:`saved_state` kept of it, or ``None`` when they cannot be had (nothing was kept,
        the file is gone)."""
        name = (state or {}).get("file")
        f = self._get("file", obj) if name else None
        if not f:
            return None
        try:
            handle = f.storage.open(name, "rb")
        except (OSError, ValueError):
            return None

        def read():
            with handle:
                while chunk := handle.read(READ_CHUNK):
                    yield chunk

        declared = self._get("media_type", obj)
        return read(), normalise_media_type(declared) if declared else mimetypes.guess_type(name)[0]

    def affected(self, instance):
        """Primary keys of this source's objects whose entries may change when ``instance``, an
        object of one of ``related_models``, is saved or deleted. Default: the objects that
        point at it through the lookup given in ``related_models``."""
        if self._related_lookup(type(instance)) is None:
            return []
        return self.affected_by(type(instance), [instance.pk])

    def affected_by(self, model, pks):
        """:meth:`affected` for many objects of a related model at once: the lookup given in
        ``related_models`` in one query, else ``affected()`` of each object."""
        return [key for keys in self.affected_by_each(model, pks).values() for key in keys]

    # -- the machinery below is not meant to be overridden --------------------------------

    def affected_by_each(self, model, pks):
        """``{related key: [keys]}``: :meth:`affected_by` told apart by the related object, so
        that each change is dated by the related object's own. A site's own ``affected_by`` is
        called once for them all; what it finds goes with the last of ``pks`` (the newest)."""
        pks = list(pks)
        if type(self).affected_by is not ResourceSource.affected_by:
            return {str(pks[-1]): list(self.affected_by(model, pks))} if pks else {}
        lookup = self._related_lookup(model)
        if lookup is None:
            return {str(obj.pk): list(self.affected(obj)) for obj in model._default_manager.filter(pk__in=pks).iterator()}
        # Every object that points at them, in the set or not: one that left it is compared too.
        found = {}
        for key, related in bulk.filter_in(self.item_model._base_manager.all(), lookup, pks).values_list("pk", lookup):
            found.setdefault(str(related), []).append(key)
        return found

    def state_of_save(self, obj):
        """:meth:`saved_state`, never failing a save: ``{}`` (a save whose state is not kept)
        when it fails or gives nothing."""
        try:
            return dict(self.saved_state(obj) or {})
        except Exception:
            logger.warning("%s.saved_state() failed for %r; its change is recorded without it", type(self).__name__, obj,
                           exc_info=True)
            return {}

    def batch_contents(self, objects):
        """``{str(pk): content}`` of the objects of ``objects`` that :meth:`contents` answered
        for, in one call; the values as it gave them (checked where they are used, object by
        object). Objects with a file are not asked about (their bytes are the file's). Empty
        when the source has no such hook, or when it fails: the objects then take the way of
        :meth:`content`, one by one, which reports what is wrong with each."""
        if type(self).contents is ResourceSource.contents:
            return {}
        asked = [obj for obj in objects if not self._has_file(obj)]
        if not asked:
            return {}
        try:
            answer = self.contents(asked)
            # None (no bytes known) is left to content() too: entry() reads an object it is
            # given no representation for, and content() says the same, or better.
            answer = {str(key): content for key, content in (answer or {}).items() if content is not None}
        except DatabaseError:
            raise  # the transaction is broken: the batch fails (nothing is lost)
        except Exception:
            logger.warning("%s.contents() failed for a batch of %d objects; each is rendered alone", type(self).__name__,
                           len(asked), exc_info=True)
            return {}
        return {str(obj.pk): answer[str(obj.pk)] for obj in asked if str(obj.pk) in answer}

    def _has_file(self, obj):
        """Whether ``file(obj)`` gives a file (or fails: reported where the object is described)."""
        try:
            return bool(self._get("file", obj))
        except DatabaseError:
            raise
        except Exception:
            return True

    @property
    def gives_bytes(self):
        """Whether the source can give any resource's bytes: its ``file`` or ``content`` is its
        own. One that gives none lists resources without hashes and cannot offer dumps."""
        return any(getattr(type(self), hook) not in (getattr(ResourceSource, hook), None) for hook in ("file", "content"))

    @cached_property
    def item_model(self):
        """The model of the source's objects: ``model`` when it is given (``items()`` is not
        called), else the model of the queryset ``items()`` returns."""
        if self.model is not None:
            return self.model
        return self.items().model

    def tracked_models(self):
        """The models whose saves and deletes change tracking listens to for this source."""
        return [self.item_model, *self.related_models]

    def related_label(self, model):
        """How pending changes name a model: ``""`` for the source's own, else its label."""
        if model._meta.concrete_model is self.item_model._meta.concrete_model:
            return ""
        return model._meta.concrete_model._meta.label_lower

    def _related_lookup(self, model):
        if not isinstance(self.related_models, Mapping):
            return None
        concrete = model._meta.concrete_model
        for related, lookup in self.related_models.items():
            if related._meta.concrete_model is concrete:
                return lookup
        return None

    def _get(self, name, obj, default=None):
        attr = getattr(self, name, None)
        value = attr(obj) if callable(attr) else attr
        return default if value is None else value

    def queryset(self, lookups=None):
        qs = self.items()
        if lookups:
            qs = qs.filter(**lookups)
        return qs

    def entry(self, obj, known=None):
        """Describe ``obj``. ``known`` is a :class:`Representation` still valid for its bytes
        (the fingerprint did not change), or ``None`` to read them."""
        uri = absolute_uri(self._get("location", obj))
        changefreq = self._get("changefreq", obj)
        if changefreq not in CHANGEFREQS:
            changefreq = None
        links = [link for link in map(clean_link, self._get("links", obj, [])) if link]
        representation = known if known is not None else self.representation(obj)
        encoding = self._get("encoding", obj)
        encoding = str(encoding) if encoding and ENCODING_RE.match(str(encoding)) else None
        entry = Entry(uri=uri, lastmod=self._get("lastmod", obj), changefreq=changefreq, links=links, encoding=encoding)
        if representation is not None:
            entry.md5, entry.sha256 = representation.md5, representation.sha256
            entry.length = representation.length
            entry.media_type = self._declared_media_type(obj) or representation.media_type
        return entry

    def _declared_media_type(self, obj):
        """The media type known without reading the bytes: declared, or guessed from a file name."""
        declared = self._get("media_type", obj)
        if declared:
            return normalise_media_type(declared)
        f = self._get("file", obj)
        return normalise_media_type(mimetypes.guess_type(f.name)[0]) if f else None

    def bitstream(self, obj):
        """``(chunks, content_type)``: an iterator over the resource's bytes and the media type
        that came with them, or ``None`` when the source knows no bytes for ``obj``.

        Raises :class:`UnpublishableResource` when the bytes should exist but cannot be had (a
        missing file, a page that does not answer 200).
        """
        f = self._get("file", obj)
        if f:
            try:
                f.open("rb")
            except (OSError, ValueError) as exc:
                raise UnpublishableResource(f"cannot read {getattr(f, 'name', f)}: {exc}") from exc

            def read():
                try:
                    yield from f.chunks(READ_CHUNK)
                finally:
                    f.close()

            return read(), None
        return self.content_bitstream(self._get("content", obj))

    @staticmethod
    def content_bitstream(content):
        """``(chunks, content_type)`` of what :meth:`content` (or one value of :meth:`contents`)
        returned; ``None`` for ``None``."""
        if content is None:
            return None
        content_type = None
        if isinstance(content, tuple):
            content, content_type = content
        if isinstance(content, str):
            content = content.encode("utf-8")
        return iter([content]), content_type

    def prefetch(self, objects):
        """Ask the operating system to start reading these objects' files (on the local
        filesystem) before they are needed, so that reading and hashing them one after the
        other, or packing them, finds them in memory. The files are opened ``PREFETCH_THREADS``
        at a time: on a disk whose folders are no longer in memory, finding a file costs more
        than reading it, and the disk finds several at once as fast as one. Nothing here fails:
        an object whose file cannot be found is reported where it is read."""
        if not hasattr(os, "posix_fadvise"):
            return
        paths = []
        for obj in objects:
            try:
                f = self._get("file", obj)
                path = f.path if f else None
            except DatabaseError:
                raise
            except (NotImplementedError, ValueError):  # remote storage, or no file
                return
            except Exception:  # noqa: BLE001 - reported where the object is read
                continue
            if path:
                paths.append(path)
        # Files whose folders are in memory answer in microseconds, and threads would cost ten
        # times the system calls: they are asked for one after the other, a few at a time, until
        # a few take the disk's time; the rest then in threads.
        asked = 0
        while asked < len(paths):
            few = paths[asked : asked + 2 * PREFETCH_THREADS]
            started = time.perf_counter()
            _advise_all(few)
            asked += len(few)
            if time.perf_counter() - started > len(few) * PREFETCH_SLOW_SECONDS:
                break
        rest = paths[asked:]
        if not rest:
            return
        # A thread a share of the paths, every PREFETCH_THREADS-th, so that the files are asked
        # for in about their order (a task a path would cost more than the system calls).
        shares = [rest[start::PREFETCH_THREADS] for start in range(PREFETCH_THREADS)]
        with ThreadPoolExecutor(PREFETCH_THREADS, thread_name_prefix="resourcesync-prefetch") as pool:
            for _done in pool.map(_advise_all, shares):
                pass

    def read_ahead(self, objects):
        """``{str(pk): ReadAhead}`` of those of ``objects`` whose bytes are a file of the local
        filesystem, opened the default way: their files read and hashed from now on by a pool of
        threads (a few files a task, in order), beside the thread that describes them; each
        :meth:`ReadAhead.representation` is what :meth:`representation` would give. Empty where
        the source reads its bytes its own way (its ``bitstream()`` or ``representation()``
        overridden). An object whose file cannot be told now is left to :meth:`representation`,
        which reports what is wrong with it."""
        own = type(self)
        if (own.bitstream is not ResourceSource.bitstream or own.representation is not ResourceSource.representation
                or own.representation_of is not ResourceSource.representation_of):
            return {}
        wanted = []
        for obj in objects:
            try:
                f = self._get("file", obj)
                if not f or not isinstance(f, FieldFile) or not _reads_as_opened(f):
                    continue
                wanted.append((str(obj.pk), f.name, f.path))
            except DatabaseError:
                raise
            except Exception:  # noqa: BLE001 - reported where the object is read
                continue
        if not wanted:
            return {}
        pool = _read_ahead_pool()
        ahead = {}
        for start in range(0, len(wanted), READ_AHEAD_CHUNK):
            few = wanted[start : start + READ_AHEAD_CHUNK]
            task = pool.submit(_digest_files, [path for _key, _name, path in few])
            for index, (key, name, _path) in enumerate(few):
                ahead[key] = ReadAhead(self, name, task, index)
        return ahead

    def representation(self, obj):
        """Read and hash the resource's bytes; ``None`` when the source knows no bytes for it.
        Raises :class:`UnpublishableResource` as :meth:`bitstream` does."""
        return self.representation_of(obj, self.bitstream(obj))

    def representation_of(self, obj, found):
        """Hash ``found``, the bitstream of ``obj`` (:meth:`bitstream`, or
        :meth:`content_bitstream` of what :meth:`contents` gave), with the media type declared
        first; ``None`` for ``None``."""
        if found is None:
            return None
        chunks, content_type = found
        try:
            return Representation.of_chunks(chunks, self._declared_media_type(obj) or content_type)
        except OSError as exc:
            raise UnpublishableResource(f"cannot read the bytes of {obj!r}: {exc}") from exc


class ViewSource(ResourceSource):
    """A source whose resources are pages of the site: the bytes are those its view returns.

    ``content()`` requests ``location(obj)`` through Django's full request handling (URLconf,
    middleware, view) as an anonymous visitor would, so what is listed is exactly what a
    Destination will fetch. A page that does not answer 200 is left out of the lists.
    """

    def fingerprint(self, obj):
        # A page may show data from other objects than ``obj``: without a fingerprint the
        # site defines, render it on every pass.
        return super().fingerprint(obj) if self.fingerprint_fields else None

    def content(self, obj):
        return render_location(self._get("location", obj))


class SourceRegistry:
    """Registered sources, by name."""

    def __init__(self):
        self._sources = {}
        self._tracking = {}
        #: ``{name: exception}``: the sources that could not say which models they publish (their
        #: ``items()`` raised, or ran a query, when asked at start-up). Reported by the system
        #: check ``resourcesync.E029``; their sets are left unpublished, the others go on.
        self.failures = {}

    def models_of(self, source):
        """The models whose changes ``source`` tracks, or ``[]`` when it cannot say (the failure
        is kept in :attr:`failures`). Asked without letting the source reach a database: the app
        never runs a source's queries to start up."""
        if source.name in self.failures:
            return []
        try:
            with _no_queries():
                return source.tracked_models()
        except Exception as exc:
            self.failures[source.name] = exc
            logger.error("Source %r cannot say what it publishes: %s: %s; its sets are left unpublished",
                         source.name, type(exc).__name__, exc)
            return []

    def register(self, source_class=None, *, name=None):
        """Register a :class:`ResourceSource` subclass; usable as a decorator."""

        def do_register(cls):
            if not (isinstance(cls, type) and issubclass(cls, ResourceSource)):
                raise ImproperlyConfigured(f"{cls!r} is not a ResourceSource subclass.")
            key = name or cls.name or cls.__name__.lower()
            if key in self._sources:
                raise AlreadyRegistered(f"A resource source named {key!r} is already registered.")
            cls.name = key
            self._sources[key] = cls()
            self.failures.pop(key, None)
            self._tracking.clear()
            return cls

        return do_register(source_class) if source_class is not None else do_register

    def unregister(self, name):
        try:
            del self._sources[name]
        except KeyError:
            raise NotRegistered(name) from None
        self.failures.pop(name, None)
        self._tracking.clear()

    def get(self, name):
        try:
            return self._sources[name]
        except KeyError:
            raise NotRegistered(name) from None

    def names(self):
        return sorted(self._sources)

    def sources(self):
        return [self._sources[name] for name in self.names()]

    def sources_tracking(self, model):
        """The sources whose entries a save or delete of ``model`` can change."""
        concrete = model._meta.concrete_model
        if concrete not in self._tracking:
            self._tracking[concrete] = [
                source
                for source in self.sources()
                if any(tracked._meta.concrete_model is concrete for tracked in self.models_of(source))
            ]
        return self._tracking[concrete]

    def __contains__(self, name):
        return name in self._sources


class QueryAtStartUp(ImproperlyConfigured):
    """A source ran a query where the app only asked which model it publishes."""


def _refuse(execute, sql, params, many, context):
    raise QueryAtStartUp(
        "items() ran a query when called; it must return a queryset without evaluating it "
        "(or set `model` on the source)"
    )


def _refuse_connecting():
    _refuse(None, None, None, None, None)


@contextmanager
def _no_queries():
    """Neither a query nor a connection (the database may not be there yet: ``migrate``,
    ``check`` before it is created)."""
    with ExitStack() as stack:
        for connection in connections.all():
            stack.enter_context(connection.execute_wrapper(_refuse))
            if connection.connection is None:
                connection.ensure_connection = _refuse_connecting
                stack.callback(vars(connection).pop, "ensure_connection", None)
        yield


registry = SourceRegistry()
register = registry.register
