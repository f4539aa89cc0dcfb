"""The sizes of many stored files at once, without a request per file.

A file field among a source's ``fingerprint_fields`` stands for its file's name and size. Asking
the storage for each size is one ``os.stat`` per file on the filesystem, but one HEAD request
per file on S3: reconciling 100,000 files would make 100,000 requests. :class:`FileSizes` asks
the storage's listing instead where it has one:

- S3 (django-storages' ``S3Storage`` or anything with its ``bucket`` and ``_normalize_name``):
  ``ListObjectsV2`` pages of up to 1,000 keys, walked in key order beside the sorted names in
  use, each page starting at the next name not yet seen (``StartAfter``). A dense set of names
  costs one request per 1,000 files; a sparse one never more requests than names. The sizes
  are kept for the pass (a reconcile lists once): some 150 bytes of memory a file.
- the filesystem (``FileSystemStorage``): one ``os.stat`` per file, relative to the storage's
  folder opened once, without the storage's per-call path checks (a name that is not a plain
  relative path takes the storage's way). A walk of the folders with ``os.scandir`` costs a
  ``stat`` per file as well, plus the opening of each folder: more, for files spread over
  folders of a few files each (``upload_to`` by object);
- any other storage: its ``size()``, file by file.

This module imports nothing of the app: it sits below ``sources`` and ``tracking``.
"""

import os
import posixpath
import weakref

from django.core.files.storage import FileSystemStorage

#: Below this many names, a remote storage is asked file by file (a listing page would carry
#: up to 1,000 keys for one answer).
LIST_FROM = 20
PAGE = 1000


class FileSizes:
    """``size(name)`` of the files of one storage, read ahead for many names at once with
    :meth:`prepare`. Raises ``FileNotFoundError`` for a name the storage does not have."""

    def __init__(self, storage):
        self.storage = storage
        self.known = {}  # {name: size or None (not found)}, of the names listed
        kind = "other"
        cls = storage.__class__  # the storage's own class, through a lazy default_storage too
        if isinstance(storage, FileSystemStorage):
            kind = "filesystem"
        elif hasattr(cls, "_normalize_name") and hasattr(cls, "bucket") and getattr(storage, "bucket_name", None):
            kind = "s3"
        self.kind = kind
        if kind == "filesystem":
            self.root = os.path.abspath(storage.location)
            self.root_fd = None

    @property
    def lists_ahead(self):
        """Whether :meth:`prepare` reads a listing (worth handing it every name at once)."""
        return self.kind == "s3"

    def prepare(self, names):
        """Read the sizes of ``names`` ahead, in as few requests as the storage allows (kept
        until this object is dropped: a reconcile holds one for its whole pass)."""
        if self.kind != "s3":
            return
        wanted = sorted({name for name in names if name and name not in self.known})
        if len(wanted) < LIST_FROM:
            return
        self._list(wanted)

    def size(self, name):
        if name in self.known:
            size = self.known[name]
            if size is None:
                raise FileNotFoundError(name)
            return size
        if self.kind == "filesystem":
            return self._stat(name)
        return self.storage.size(name)

    # -- the filesystem ---------------------------------------------------------------------

    def _stat(self, name):
        if (
            not name or name[0] in "/.\\" or name[-1] == "/" or "/." in name or "//" in name or "\\" in name
            or "\x00" in name
        ):  # maybe not a plain relative path below the folder (or a hidden file): the storage's way,
            return self.storage.size(name)  # its own checks (and refusal of what leaves its folder)
        if self.root_fd is None and os.stat in os.supports_dir_fd:
            try:
                self.root_fd = os.open(self.root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            except OSError:
                self.root_fd = -1
            else:
                weakref.finalize(self, os.close, self.root_fd)
        if self.root_fd is not None and self.root_fd >= 0:
            # Relative to the folder, opened once: the kernel resolves the name alone.
            return os.stat(name, dir_fd=self.root_fd).st_size
        return os.stat(os.path.join(self.root, name)).st_size

    # -- S3 ---------------------------------------------------------------------------------

    def _list(self, wanted):
        """Walk the bucket's keys in order beside ``wanted`` (sorted): each page of the listing
        starts just before the first name no page has covered yet."""
        storage = self.storage
        keys = {}
        for name in wanted:
            try:
                keys[storage._normalize_name(_clean(name))] = name
            except Exception:  # refused by the storage (it would refuse size() too)
                continue
        ordered = sorted(keys)
        if not ordered:
            return
        client = storage.bucket.meta.client
        prefix = posixpath.commonprefix(ordered)
        index, start = 0, None
        while index < len(ordered):
            request = {"Bucket": storage.bucket_name, "Prefix": prefix, "MaxKeys": PAGE}
            if start is None:
                start = ordered[index][:-1]  # just before it: keys in between are harmless extras
            if start > prefix:
                request["StartAfter"] = start
            page = client.list_objects_v2(**request)
            contents = page.get("Contents", [])
            for item in contents:
                name = keys.get(item["Key"])
                if name is not None:
                    self.known[name] = item["Size"]
            last = contents[-1]["Key"] if contents else None
            if not page.get("IsTruncated") or last is None:
                break
            before = index
            while index < len(ordered) and ordered[index] <= last:
                index += 1
            # A page of keys that all sort before the next name goes on from its last key.
            start = last if index == before else None
        for name in keys.values():
            self.known.setdefault(name, None)  # listed, not there


def _clean(name):
    """A storage name as django-storages cleans it (forward slashes, no leading ``./``)."""
    try:
        from storages.utils import clean_name
    except ImportError:
        pass
    else:
        return clean_name(name)
    cleaned = posixpath.normpath(name.replace("\\", "/"))
    if name.endswith("/") and not cleaned.endswith("/"):
        cleaned += "/"
    return "" if cleaned == "." else cleaned
