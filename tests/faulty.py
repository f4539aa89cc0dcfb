"""Faults and the checks a Source must pass after them, for tests/test_faults.py.

- :class:`DiskFullStorage`: a filesystem storage whose disk fills up after a byte budget
  (``disk.fill(after=N)``): writes past it fail with ``OSError(ENOSPC)``, the bytes that fitted
  written, as a real full disk does. ``disk.open`` is the same for the files that
  ``packaging.open_for_writing`` opens itself with ``open()`` (tests patch ``packaging.open``).
- :class:`FlakyStorage`: a filesystem storage whose saves, deletions, opens and writes fail at
  random calls (seeded, ``flaky.start(seed, rate)``) with an ``OSError`` or botocore's
  ``ClientError``, the errors django-storages' S3 backend lets through.
- :func:`check_source`: everything a Destination can reach from ``/.well-known/resourcesync``
  fetched and validated (every package's bytes against the hash listed for it, every member
  against its manifest), the storage swept and compared with the records, and each Resource
  List compared with what the site shows the public. :func:`change_site` makes random changes
  through the ORM, as a site's users do (signals track them).
- ``python -m tests.faulty`` (with ``DJANGO_SETTINGS_MODULE`` set) is a driver process for a
  site run as separate processes: it reads one JSON request a line and answers one JSON line,
  so that checks and changes between kills cost no Django start-up.
"""

if __name__ == "__main__":  # a driver process: Django first, then the modules that need it
    import django

    django.setup()

import datetime
import errno
import hashlib
import io
import json
import os
import random
import re
import sys
import threading
import traceback
import zipfile
from urllib.parse import unquote

from django.core.files.base import ContentFile, File
from django.core.files.storage import FileSystemStorage
from django.db import connections, transaction
from django.test import Client

from django_resourcesync import storage as documents_storage
from django_resourcesync import sweep as sweeping
from django_resourcesync.conf import app_settings
from django_resourcesync.models import (
    Build,
    BuildLock,
    ChangeDumpPackage,
    ChangeList,
    Document,
    ResourceSet,
    Version,
)
from django_resourcesync.tracking import outbox
from example_project.repository.models import Collection, Item, ItemFile
from tests.xmlcheck import RS, SM, check_document, entries, link, md

BASE = "http://testserver"
CAPABILITIES = ["resourcelist", "changelist", "resourcedump", "changedump"]


# --- A full disk ------------------------------------------------------------------------------


class Disk:
    """The space left on the documents' disk: unlimited until :meth:`fill`."""

    def __init__(self):
        self.lock = threading.Lock()
        self.free()

    def fill(self, *, after):
        """Let ``after`` more bytes be written, then refuse every write."""
        with self.lock:
            self.left, self.refusals = after, []

    def free(self):
        with self.lock:
            self.left, self.refusals = None, []

    def take(self, size, name):
        """How many of ``size`` bytes fit; notes a refusal when not all do."""
        with self.lock:
            if self.left is None:
                return size
            fits = min(size, self.left)
            self.left -= fits
            if fits < size:
                self.refusals.append(str(name))
            return fits

    def open(self, path, mode="r", *args, **kwargs):
        """``open()`` on this disk: a file opened for writing fails once the disk is full."""
        handle = open(path, mode, *args, **kwargs)  # noqa: SIM115 - returned open, as open() does
        return _LimitedFile(handle, self, path) if any(flag in mode for flag in "wax+") else handle


disk = Disk()


def _no_space(name):
    return OSError(errno.ENOSPC, "No space left on device", str(name))


class _WrappedFile:
    """A binary file open for writing, whose writes a fault may cut short."""

    def __init__(self, handle, name):
        self._handle, self.name = handle, name

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self._handle.close()


class _WrappedContent(File):
    """The content of a storage save, whose chunks a fault may cut short."""

    def __init__(self, content, name):
        super().__init__(content.file if hasattr(content, "file") else content, name=content.name)
        self._content, self._target = content, name


class _LimitedFile(_WrappedFile):
    """A binary file being written on :data:`disk`."""

    def __init__(self, handle, disk, name):
        super().__init__(handle, name)
        self._disk = disk

    def write(self, data):
        fits = self._disk.take(len(data), self.name)
        self._handle.write(bytes(data[:fits]))
        if fits < len(data):
            self._handle.flush()  # what fitted is on the disk, as with a real one
            raise _no_space(self.name)
        return len(data)


class _ChargedContent(_WrappedContent):
    """The content of a save, charged to :data:`disk` chunk by chunk as it is written."""

    def chunks(self, chunk_size=None):
        for chunk in self._content.chunks(chunk_size):
            fits = disk.take(len(chunk), self._target)
            yield chunk[:fits]
            if fits < len(chunk):
                raise _no_space(self._target)


class DiskFullStorage(FileSystemStorage):
    """A filesystem storage on :data:`disk`."""

    def _save(self, name, content):
        return super()._save(name, _ChargedContent(content, name))

    def _open(self, name, mode="rb"):
        if any(flag in mode for flag in "wax+"):
            os.makedirs(os.path.dirname(self.path(name)), exist_ok=True)
            return File(disk.open(self.path(name), mode), name=name)
        return super()._open(name, mode)


# --- A flaky object store ---------------------------------------------------------------------


class Flaky:
    """Which calls of a :class:`FlakyStorage` fail: none until :meth:`start`."""

    def __init__(self):
        self.stop()

    def start(self, seed, rate):
        self.random, self.rate, self.injected = random.Random(seed), rate, []

    def stop(self):
        self.random, self.rate, self.injected = None, 0, []

    #: A write of a part of a file fails this many times less often than a call (a package is
    #: written in many small pieces).
    WRITES = 10

    def strike(self, operation, name):
        """Raise, at random, the error a storage call may end with."""
        rate = self.rate / self.WRITES if operation == "write" else self.rate
        if self.random is None or self.random.random() >= rate:
            return
        self.injected.append((operation, str(name)))
        if self.random.random() < 0.5:
            raise OSError(errno.EIO, f"Input/output error ({operation})", str(name))
        from botocore.exceptions import ClientError

        raise ClientError({"Error": {"Code": "InternalError", "Message": "We encountered an internal error. Please try again."}},
                          {"save": "PutObject", "create": "CreateMultipartUpload", "write": "UploadPart",
                           "delete": "DeleteObject", "open": "GetObject"}[operation])

    def open(self, path, mode="r", *args, **kwargs):
        """``open()`` on the flaky store: opening and every write may fail."""
        if any(flag in mode for flag in "wax+"):
            self.strike("create", path)
            return _FlakyFile(open(path, mode, *args, **kwargs), self, path)
        return open(path, mode, *args, **kwargs)


flaky = Flaky()


class _FlakyFile(_WrappedFile):
    def __init__(self, handle, flaky, name):
        super().__init__(handle, name)
        self._flaky = flaky

    def write(self, data):
        self._flaky.strike("write", self.name)
        return self._handle.write(data)


class _FlakyContent(_WrappedContent):
    def chunks(self, chunk_size=None):
        for chunk in self._content.chunks(chunk_size):
            yield chunk
            flaky.strike("write", self._target)  # after a part of the file is written


class FlakyStorage(FileSystemStorage):
    def _save(self, name, content):
        flaky.strike("save", name)
        return super()._save(name, _FlakyContent(content, name))

    def delete(self, name):
        flaky.strike("delete", name)
        return super().delete(name)

    def _open(self, name, mode="rb"):
        if any(flag in mode for flag in "wax+"):
            os.makedirs(os.path.dirname(self.path(name)), exist_ok=True)
            return File(flaky.open(self.path(name), mode), name=name)
        flaky.strike("open", name)
        return super()._open(name, mode)


# --- What a Destination sees ------------------------------------------------------------------


def _loc(element):
    return element.find(f"{{{SM}}}loc").text


def _hashes(meta):
    """``{"md5": hex, "sha-256": hex}`` of an ``rs:md hash`` attribute."""
    return dict(token.split(":", 1) for token in (meta or {}).get("hash", "").split())


def _moment(value):
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))  # noqa: FURB162 - Python 3.10 reads no "Z"


def key(uri):
    """A URI as compared here: percent-escapes decoded (the site and the app may escape alike
    characters differently)."""
    return unquote(uri)


class Served:
    """Everything reachable from the Source Description, fetched through the site's URLconf and
    checked: every document against the schemas and the spec's rules, every package against
    the hash and length listed for it, every member against its manifest. ``problems`` lists
    what failed; ``bodies`` keeps what was served, by URI."""

    def __init__(self, client=None, *, capabilities=None):
        self.client = client or Client()
        self.capabilities = capabilities  # those walked (default: all)
        self.problems = []
        self.bodies = {}
        self.resources = {}  # slug: {uri: sha-256} of its Resource List
        self.at = {}  # slug: the Resource List's at
        self.changes = {}  # slug: [(datetime, uri, change, sha-256)] of its Change Lists, oldest first
        self.packages = 0
        self._walk()

    def get(self, uri):
        response = self.client.get(uri.removeprefix(BASE))
        body = b"".join(response.streaming_content) if response.streaming else response.content
        self.bodies[uri] = body
        return response.status_code, body

    def _document(self, uri, capability):
        status, body = self.get(uri)
        if status != 200:
            raise AssertionError(f"answers {status}")
        return check_document(body, capability)

    def _tree(self, uri, capability):
        """The ``<urlset>`` documents of ``uri``: itself, or the parts its index lists."""
        doc = self._document(uri, capability)
        if doc.tag != f"{{{SM}}}sitemapindex":
            return [doc]
        parts = []
        for sitemap in entries(doc):
            part = self._document(_loc(sitemap), capability)
            assert part.tag == f"{{{SM}}}urlset", f"{_loc(sitemap)}: an index in an index"
            assert link(part, "index") == uri, f"{_loc(sitemap)} does not link to its index"
            parts.append(part)
        return parts

    def _checked(self, uri, check, *args):
        """``check(*args)``, or ``None`` with the problem noted if it fails."""
        try:
            return check(*args)
        except Exception as exc:  # noqa: BLE001 - a problem to report, whatever it is
            self.problems.append(f"{uri}: {type(exc).__name__}: {exc}")
            return None

    def _walk(self):
        start = f"{BASE}/.well-known/resourcesync"
        description = self._checked(start, self._document, start, "description")
        for entry in entries(description) if description is not None else []:
            capability_list = _loc(entry)
            slug = capability_list.rstrip("/").split("/")[-2]
            listed = self._checked(capability_list, self._document, capability_list, "capabilitylist")
            for item in entries(listed) if listed is not None else []:
                capability, uri = md(item)["capability"], _loc(item)
                if self.capabilities is not None and capability not in self.capabilities:
                    continue
                docs = self._checked(uri, self._tree, uri, capability)
                if docs is None:
                    continue
                if capability == "resourcelist":
                    self.at[slug] = _moment(md(docs[0])["at"])
                    self.resources[slug] = {_loc(e): _hashes(md(e)).get("sha-256") for doc in docs for e in entries(doc)}
                elif capability == "changelist":
                    self.changes[slug] = [
                        (_moment(md(e)["datetime"]), _loc(e), md(e)["change"], _hashes(md(e)).get("sha-256"))
                        for doc in docs for e in entries(doc)
                    ]
                else:
                    for doc in docs:
                        for package in entries(doc):
                            self._checked(_loc(package), self._package, package, capability)

    def _package(self, entry, capability):
        meta = md(entry)
        status, package = self.get(_loc(entry))
        assert status == 200, f"listed, answers {status}"
        assert int(meta["length"]) == len(package), f"{len(package)} bytes served, {meta['length']} listed"
        assert meta["hash"] == f"sha-256:{hashlib.sha256(package).hexdigest()}", "the bytes served are not those listed"
        (contents,) = [ln.get("href") for ln in entry.findall(f"{{{RS}}}ln") if ln.get("rel") == "contents"]
        status, manifest = self.get(contents)
        assert status == 200, f"its manifest {contents} answers {status}"
        archive = zipfile.ZipFile(io.BytesIO(package))
        assert archive.testzip() is None, "a member is damaged"
        # The packed copy names no stylesheet (opened from the unpacked ZIP, a browser would find none).
        served = re.sub(rb"<\?xml-stylesheet [^?]*\?>\n", b"", manifest, count=1)
        assert archive.read("manifest.xml") == served, "the manifest served is not the one packaged"
        for item in entries(check_document(manifest, f"{capability}-manifest")):
            item_md = md(item)
            if "path" in item_md:
                data = archive.read(item_md["path"][1:])
                expected = _hashes(item_md)
                assert int(item_md["length"]) == len(data), f"{item_md['path']}: length"
                assert expected.get("sha-256") == hashlib.sha256(data).hexdigest(), f"{item_md['path']}: sha-256"
                assert expected.get("md5", hashlib.md5(data).hexdigest()) == hashlib.md5(data).hexdigest(), (
                    f"{item_md['path']}: md5"
                )
        self.packages += 1

    def replayed(self, slug, at=None):
        """The Resource List (or one served before, ``at`` and ``{uri: sha-256}``) with every
        change listed since its ``at`` applied: the state a Destination arrives at."""
        at, state = at or (self.at[slug], self.resources[slug])
        state = dict(state)
        for moment, uri, change, sha256 in self.changes.get(slug, []):
            if moment >= at:
                if change == "deleted":
                    state.pop(uri, None)
                else:
                    state[uri] = sha256
        return state


# --- What the site shows the public -----------------------------------------------------------


def public_state(slug, *, hashes=False, client=None):
    """``{uri: sha-256 or None}`` of what the site serves the public in the demo set ``slug``:
    the files of public items ("bitstreams"), their metadata records ("metadata"), their
    landing pages ("pages"). With ``hashes``, every one is fetched from the site and hashed."""
    if slug == "bitstreams":
        paths = [f.get_absolute_url() for f in ItemFile.objects.filter(item__is_public=True).select_related("item")]
    elif slug == "metadata":
        paths = [item.get_metadata_url() for item in Item.objects.filter(is_public=True)]
    elif slug == "pages":
        paths = [item.get_absolute_url() for item in Item.objects.filter(is_public=True)]
    else:
        raise ValueError(slug)
    client = client or Client()
    state = {}
    for path in paths:
        digest = None
        if hashes:
            response = client.get(path)
            assert response.status_code == 200, f"{path} answers {response.status_code}"
            body = b"".join(response.streaming_content) if response.streaming else response.content
            digest = hashlib.sha256(body).hexdigest()
        state[BASE + path] = digest
    return state


def keyed(state):
    return {key(uri): value for uri, value in state.items()}


def difference(listed, public):
    """``{"extra": [...], "missing": [...], "other bytes": [...]}`` of a listed state against
    the public one (hashes compared where the public one has them); empty lists if equal."""
    listed, public = keyed(listed), keyed(public)
    return {
        "extra": sorted(set(listed) - set(public)),
        "missing": sorted(set(public) - set(listed)),
        "other bytes": sorted(uri for uri in set(listed) & set(public) if public[uri] is not None and listed[uri] != public[uri]),
    }


# --- The storage, against the records ---------------------------------------------------------


def recorded_files():
    """``{storage name: (size, sha-256)}`` of every file a record refers to."""
    files = {}
    for name, size, sha256 in Document.objects.filter(withdrawn__isnull=True).values_list("storage_name", "size", "sha256"):
        files[name] = (size, sha256)
    for name, size, sha256 in ChangeList.objects.exclude(storage_name="").values_list("storage_name", "size", "sha256"):
        files[name] = (size, sha256)
    for package in ChangeDumpPackage.objects.filter(withdrawn__isnull=True):
        files[package.storage_name] = (package.size, package.sha256)
        files[package.manifest_storage_name] = (package.manifest_size, package.manifest_sha256)
    # The version store: each file is named by, and must hash to, the sha-256 of its bytes.
    for name, length, sha256 in Version.objects.values_list("storage_name", "length", "sha256"):
        files[name] = (length, sha256)
    return files


def stored_files():
    """The storage names of every file under the app's folder of its (filesystem) storage."""
    location = documents_storage.get_storage().location
    root = os.path.join(location, app_settings.STORAGE_PREFIX)
    found = set()
    for folder, _subfolders, names in os.walk(root):
        found.update(os.path.relpath(os.path.join(folder, name), location).replace(os.sep, "/") for name in names)
    return found


def storage_problems(*, sweep=True):
    """``{"orphans", "missing", "damaged"}``: files no record refers to (after a sweep with no
    grace, with ``sweep``), records whose file is not there, files whose bytes are not those
    recorded."""
    if sweep:
        sweeping.sweep(grace=0)
    recorded, stored = recorded_files(), stored_files()
    location = documents_storage.get_storage().location
    damaged = []
    for name in sorted(set(recorded) & stored):
        with open(os.path.join(location, name), "rb") as handle:
            data = handle.read()
        if (len(data), hashlib.sha256(data).hexdigest()) != recorded[name]:
            damaged.append(name)
    return {"orphans": sorted(stored - set(recorded)), "missing": sorted(set(recorded) - stored), "damaged": damaged}


# --- Everything at once -----------------------------------------------------------------------


def builds_left_running():
    return list(Build.objects.filter(status=Build.Status.RUNNING).values_list("pk", "resource_set__slug", "capability"))


def check_source(*, sweep=True, public=True):
    """Every check after a fault: what is served is whole and valid, the storage holds the
    recorded files and nothing else (after a sweep), and, with ``public``, each Resource List
    lists what the site shows the public. Returns ``(problems, served)``."""
    served = Served()
    problems = list(served.problems)
    files = storage_problems(sweep=sweep)
    for kind, names in files.items():
        if kind != "orphans" or sweep:
            problems += [f"storage: {kind}: {name}" for name in names]
    if public:
        for resource_set in ResourceSet.objects.public():  # what the public reads (a set for partners is not)
            if resource_set.has_capability("resourcelist"):
                if resource_set.slug not in served.resources:
                    problems.append(f"{resource_set.slug}: no Resource List served")
                    continue
                for kind, uris in difference(served.resources[resource_set.slug], public_state(resource_set.slug)).items():
                    problems += [f"{resource_set.slug} Resource List: {kind}: {uri}" for uri in uris]
    return problems, served


def property_problems(before, served=None):
    """The property of tests/test_consistency.py on what is served: the Resource Lists served
    in ``before`` (a :class:`Served`), plus the changes the Change Lists served now list since
    their ``at``, equal what the site shows the public now, bytes included."""
    served = served or Served(capabilities={"resourcelist", "changelist"})
    problems = list(served.problems)
    for slug, resources in before.resources.items():
        state = served.replayed(slug, at=(before.at[slug], resources))
        for kind, uris in difference(state, public_state(slug, hashes=True)).items():
            problems += [f"{slug} Resource List + changes since {before.at[slug]}: {kind}: {uri}" for uri in uris]
    return problems


# --- What the site's users do -----------------------------------------------------------------


def change_site(rng, *, private=3, public=2, edits=3, new_files=2, new_items=2, deletions=1):
    """Random changes through the ORM, in one transaction (the signals track them): items made
    private or public again, titles and files edited, items added with a file, one deleted.
    Returns what was done, counted."""
    done = dict.fromkeys(["private", "public", "edited", "new files", "new items", "deleted"], 0)
    with transaction.atomic():
        shown = list(Item.objects.filter(is_public=True).order_by("pk"))
        hidden = list(Item.objects.filter(is_public=False).order_by("pk"))
        for item in rng.sample(shown, min(private, len(shown))):
            item.is_public = False
            item.save()
            done["private"] += 1
        for item in rng.sample(hidden, min(public, len(hidden))):
            item.is_public = True
            item.save()
            done["public"] += 1
        items = list(Item.objects.order_by("pk"))
        for item in rng.sample(items, min(edits, len(items))):
            item.title = f"Edited {rng.randrange(10**9)}"
            item.save()
            done["edited"] += 1
        files = list(ItemFile.objects.order_by("pk"))
        for row in rng.sample(files, min(new_files, len(files))):
            row.file.save(f"v{rng.randrange(10**6)}.txt", ContentFile(rng.randbytes(rng.randrange(1, 3000))), save=True)
            done["new files"] += 1
        collection = Collection.objects.order_by("pk").first()
        for _ in range(new_items):
            item = Item.objects.create(collection=collection, title=f"Added {rng.randrange(10**9)}", creator="Fault injection")
            row = ItemFile(item=item, name=f"added-{item.pk}.txt", media_type="text/plain")
            row.file.save(f"added-{item.pk}.txt", ContentFile(rng.randbytes(rng.randrange(1, 3000))), save=True)
            done["new items"] += 1
        items = list(Item.objects.order_by("pk"))
        for item in rng.sample(items, min(deletions, len(items))):
            item.delete()
            done["deleted"] += 1
    return done


# --- The driver process -----------------------------------------------------------------------


class Driver:
    """The commands ``python -m tests.faulty`` answers."""

    def __init__(self):
        self.before = None

    def enable(self, capabilities=CAPABILITIES):
        ResourceSet.objects.update(capabilities=capabilities)
        return sorted(ResourceSet.objects.values_list("slug", flat=True))

    def change(self, seed):
        done = change_site(random.Random(seed))
        # The site's process processes its changes on a thread (the embedded mode): they are
        # done before the test goes on, as they were when they were processed in the saves.
        assert outbox.dispatcher.flush(timeout=120), "the changes were processed"
        return done

    def state(self):
        return {
            "running": builds_left_running(),
            "locks": list(BuildLock.objects.values_list("resource_set__slug", "capability", "pid")),
            "last_build": Build.objects.order_by("-pk").values_list("pk", flat=True).first() or 0,
        }

    def builds(self, after):
        return [
            list(row)
            for row in Build.objects.filter(pk__gt=after).order_by("pk").values_list("pk", "capability", "status", "error")
        ]

    def check(self, sweep=True, public=True):
        problems, served = check_source(sweep=sweep, public=public)
        return {"problems": problems, "documents": len(served.bodies), "packages": served.packages}

    def snapshot(self):
        """Keep the Resource Lists served now, for :meth:`replay`."""
        self.before = Served()
        return {"problems": self.before.problems, "at": {slug: str(at) for slug, at in self.before.at.items()}}

    def replay(self):
        return {"problems": property_problems(self.before)}


def main():
    replies = sys.stdout
    sys.stdout = sys.stderr  # whatever the app prints stays out of the replies
    driver = Driver()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply = {"ok": True, "result": getattr(driver, request["command"])(**request.get("arguments", {}))}
        except BaseException:  # noqa: BLE001 - reported to the test
            reply = {"ok": False, "error": traceback.format_exc()}
        finally:
            connections.close_all()
        replies.write(json.dumps(reply, default=str) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
