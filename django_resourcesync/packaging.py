"""ZIP packages for Resource Dumps and Change Dumps, streamed straight into storage.

A package is written member by member through :class:`PackageWriter`: each bitstream is read in
chunks from the resource's file (or rendered bytes), hashed on the way, and written into the ZIP,
and the ZIP is written into the storage backend as it grows: a file opened for writing on the
filesystem, a multipart upload on S3. Nothing holds a package in memory, and nothing spools it on
local disk for a remote backend. The ZIP is written without seeking (sizes and CRCs follow each
member in a data descriptor) and with ZIP64 records where sizes need them, so zero-byte and
multi-gigabyte files both work.

Member names are made from the resource's URI by :class:`MemberNames`, which never yields an
absolute path, a ``..`` segment, a backslash, a control character, a duplicate, or a file where
another member needs a folder.
"""

import datetime
import hashlib
import os
import queue
import re
import threading
import zipfile
from urllib.parse import urlsplit

from django.core.files.storage import FileSystemStorage

from . import storage

CHUNK = 1024 * 1024
ZIP_MEDIA_TYPE = "application/zip"
MANIFEST = "manifest.xml"
# Characters kept in member names; everything else becomes "_" (the URI is percent-encoded
# ASCII already, so this mostly catches "?", ":", "*", "|" and the like).
_UNSAFE = re.compile(r"[^A-Za-z0-9._~%!$&'()+,;=@-]")
_MAX_SEGMENT = 120


class MemberNames:
    """Safe, unique member names for the bitstreams of one package.

    A name is built from the resource's URI (``resources/<host>/<path segments>``) and must
    unpack to a file of its own on every file system, Windows and macOS included:

    * names are compared regardless of case (those file systems do), so ``/A.txt`` and
      ``/a.txt`` do not unpack into one file;
    * a name that is taken, or that would need a folder where a file already is (``/about``
      and ``/about/team``), gets a ``~N`` suffix on the clashing segment (``a~2.txt``);
    * a segment that Windows takes for a device (``CON``, ``PRN``, ``AUX``, ``NUL``,
      ``COM0``-``COM9``, ``LPT0``-``LPT9``, ``CONIN$``, ``CONOUT$``, in any case and with any
      extension: ``aux.txt``, ``Con``) gets a ``_`` in front (``_aux.txt``);
    * trailing dots of a segment, which Windows drops (``name.`` would be ``name``), become
      ``_`` (``name_``).
    """

    _RESERVED = frozenset(
        {"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$", *(f"{d}{n}" for d in ("COM", "LPT") for n in range(10))}
    )
    _TRAILING = re.compile(r"[. ]+$")

    def __init__(self):
        self.files, self.folders = set(), set()  # lowercased

    @classmethod
    def _portable(cls, segment):
        """``segment`` as Windows can store it (the characters are safe already)."""
        segment = cls._TRAILING.sub(lambda m: "_" * len(m.group()), segment)
        return "_" + segment if segment.split(".", 1)[0].upper() in cls._RESERVED else segment

    def name(self, uri):
        parts = urlsplit(uri)
        segments = [parts.netloc] + parts.path.split("/")
        if parts.query:
            segments[-1] = f"{segments[-1]}_{parts.query}"
        cleaned = [
            self._portable(segment)
            for segment in (_UNSAFE.sub("_", segment)[:_MAX_SEGMENT] for segment in segments)
            if segment not in ("", ".", "..")
        ]
        if parts.path.endswith("/") or len(cleaned) < 2:
            cleaned.append("index")  # "/about/" names a file inside the folder "about"
        segments = ["resources", *cleaned]
        for depth in range(2, len(segments)):  # each folder on the way must not be a file
            folder = "/".join(segments[:depth])
            if folder.lower() in self.files:
                segments[depth - 1] = self._free(segments[:depth], self.files | self.folders)
        name = "/".join(segments)
        if name.lower() in self.files or name.lower() in self.folders or name.lower() == MANIFEST:
            segments[-1] = self._free(segments, self.files | self.folders)
            name = "/".join(segments)
        self.files.add(name.lower())
        self.folders.update("/".join(segments[:depth]).lower() for depth in range(1, len(segments)))
        return name

    @staticmethod
    def _free(segments, used):
        """A variant of the last of ``segments`` that makes a name not in ``used`` (lowercased)."""
        base = segments[-1]
        stem, dot, extension = base.rpartition(".") if "." in base[1:] else (base, "", "")
        number = 2
        while True:
            candidate = f"{stem}~{number}{dot}{extension}"
            if "/".join([*segments[:-1], candidate]).lower() not in used:
                return candidate
            number += 1


ZIP64_FROM = 1024**3


def zip_datetime(moment):
    """A ZIP member's timestamp (UTC; ZIP cannot say earlier than 1980); a member's own
    ``date_time`` passes as it is."""
    if moment is None:
        return (1980, 1, 1, 0, 0, 0)
    if isinstance(moment, tuple):
        return moment
    moment = moment.astimezone(datetime.timezone.utc)
    return max((moment.year, moment.month, moment.day, moment.hour, moment.minute, moment.second), (1980, 1, 1, 0, 0, 0))


class Digests:
    """Digests of a byte stream, computed on a thread of their own.

    hashlib lets go of the interpreter lock while it hashes a large buffer, so the digests are
    computed beside the reading, the CRC and the writing, on another core. Small writes are
    gathered into larger buffers first; at most a few megabytes wait in the queue.
    """

    GATHER = 256 * 1024

    def __init__(self, algorithms):
        self._hashes = {name: hashlib.new(name) for name in algorithms}
        self._queue = queue.Queue(maxsize=8)
        self._small = bytearray()
        self._thread = threading.Thread(target=self._run, name="resourcesync-digests", daemon=True)
        self._thread.start()
        self._result = None

    def _run(self):
        hashes = list(self._hashes.values())
        while (data := self._queue.get()) is not None:
            for digest in hashes:
                digest.update(data)

    def update(self, data):
        if len(data) < self.GATHER:
            self._small += data
            if len(self._small) < self.GATHER:
                return
            data, self._small = bytes(self._small), bytearray()
        elif self._small:
            self._queue.put(bytes(self._small))
            self._small = bytearray()
        self._queue.put(bytes(data))

    def hexdigests(self):
        """Finish; ``{algorithm: hex digest}``. Safe to call more than once."""
        if self._result is None:
            if self._small:
                self._queue.put(bytes(self._small))
            self._queue.put(None)
            self._thread.join()
            self._result = {name: digest.hexdigest() for name, digest in self._hashes.items()}
        return self._result


class _HashingSink:
    """A write-only stream that counts and hashes (sha-256) what passes through to ``raw``. It
    can tell but not seek, so :mod:`zipfile` writes data descriptors instead of seeking back."""

    def __init__(self, raw):
        self.raw = raw
        self.digests = Digests(["sha256"])
        self.length = 0

    def write(self, data):
        self.raw.write(data)
        self.digests.update(data)
        self.length += len(data)
        return len(data)

    def tell(self):
        return self.length

    def flush(self):
        flush = getattr(self.raw, "flush", None)
        if flush:
            flush()


def open_for_writing(name):
    """A binary file in storage, open for writing. On the filesystem this is the file itself
    (under a name no reader knows until the build is published); elsewhere the backend's own
    writable file (django-storages' S3 file uploads in parts as it is written)."""
    backend = storage.get_storage()
    if isinstance(backend, FileSystemStorage):
        path = backend.path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return open(path, "wb")
    return backend.open(name, "wb")


class PackageWriter:
    """Write one ZIP package into storage as ``name``."""

    def __init__(self, name):
        self.name = name
        self._raw = open_for_writing(name)
        self._sink = _HashingSink(self._raw)
        self._zip = zipfile.ZipFile(self._sink, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True)
        self.members = 0
        self.bitstream_bytes = 0

    @property
    def size(self):
        return self._sink.length

    def add(self, member, chunks, *, size_hint=None, modified=None, algorithms=("md5", "sha256")):
        """Stream one bitstream in; returns ``({algorithm: hex digest}, length)`` of what was
        written, for the ``algorithms`` asked for.

        ``size_hint`` is the expected length: members that may reach the 4 GiB limit of plain
        ZIP (or whose size is unknown) get ZIP64 records; small ones stay plain ZIP. With no
        ``algorithms`` (a member copied from another package), nothing is hashed.
        """
        info = zipfile.ZipInfo(member, date_time=zip_datetime(modified))
        info.compress_type = zipfile.ZIP_STORED
        info.external_attr = 0o644 << 16
        digests, length = (Digests(algorithms) if algorithms else None), 0
        large = size_hint is None or size_hint >= ZIP64_FROM
        try:
            with self._zip.open(info, mode="w", force_zip64=large) as out:
                for chunk in chunks:
                    if digests is not None:
                        digests.update(chunk)
                    length += len(chunk)
                    out.write(chunk)
        finally:
            found = digests.hexdigests() if digests is not None else {}
        self.members += 1
        self.bitstream_bytes += length
        return found, length

    def close(self, manifest):
        """Add ``manifest.xml`` (an open binary file) at the top level and finish the package;
        returns ``(sha256, length)`` of the whole package."""
        info = zipfile.ZipInfo(MANIFEST, date_time=zip_datetime(None))
        info.external_attr = 0o644 << 16
        large = manifest.seek(0, os.SEEK_END) >= ZIP64_FROM
        manifest.seek(0)
        with self._zip.open(info, mode="w", force_zip64=large) as out:
            for chunk in iter(lambda: manifest.read(CHUNK), b""):
                out.write(chunk)
        self._zip.close()
        self._raw.close()
        return self._sink.digests.hexdigests()["sha256"], self._sink.length

    def abort(self):
        """Throw the package away: whatever fails on the way (a full disk fails every write and
        close), the file written so far is deleted."""
        try:
            for step in (self._zip.close, self._raw.close, self._sink.digests.hexdigests):  # the last stops its thread
                try:
                    step()
                except Exception:  # the package is being thrown away anyway
                    pass
        finally:
            storage.delete_quietly([self.name])
