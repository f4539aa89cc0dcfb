"""Where documents are written: the Django storage named by ``RESOURCESYNC["STORAGE"]``."""

import contextlib
import logging
import os
import posixpath
import tempfile
import uuid

from django.core.files import File
from django.core.files.storage import FileSystemStorage, storages

from .conf import app_settings

logger = logging.getLogger(__name__)


def get_storage():
    return storages[app_settings.STORAGE]


def storage_name(*parts):
    return posixpath.join(app_settings.STORAGE_PREFIX, *(str(part) for part in parts))


#: The folder of the app's storage folder where documents are written before they are saved
#: (see :func:`scratch_file`); no set's, since a slug has no dot.
SCRATCH = ".scratch"


class _ScratchFile(File):
    """A document written into the scratch folder, which a filesystem storage moves into place
    when it saves it (as it moves an upload Django spooled to a file) instead of copying it."""

    def temporary_file_path(self):
        return self.name


@contextlib.contextmanager
def scratch_file():
    """A binary file to write a document into before it is saved with :func:`save` (or
    :func:`save_or_remove`). On a filesystem storage it is made in the app's folder of the
    storage, so that saving it is a rename, not a second copy of the document (a Resource List
    of 50,000 entries is some 25 MB); what a killed process leaves there, the sweep removes
    (no record refers to it). Elsewhere (S3, say), an anonymous temporary file, uploaded when
    saved. Either is gone once the block ends."""
    store = get_storage()
    if not isinstance(store, FileSystemStorage):
        with tempfile.TemporaryFile() as tmp:
            yield tmp
        return
    folder = store.path(storage_name(SCRATCH))
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, uuid.uuid4().hex)
    # Made as the storage makes a file (the mode the umask leaves), not with mkstemp's 0600: it
    # becomes the published file. FILE_UPLOAD_PERMISSIONS, if set, applies when it is saved.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    scratch = _ScratchFile(os.fdopen(fd, "w+b"), name=path)
    try:
        yield scratch
    finally:
        scratch.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # not saved (an error), or saved by a copy


def save(name, fileobj):
    """Save an open binary file (or a :func:`scratch_file`) under ``name``; returns the name
    the storage chose."""
    fileobj.seek(0)
    if isinstance(fileobj, _ScratchFile):
        fileobj.flush()
        return get_storage().save(name, fileobj)
    return get_storage().save(name, File(fileobj, name=posixpath.basename(name)))


def save_or_remove(name, fileobj):
    """:func:`save`, and should it fail (a full disk, a storage error), remove whatever part of
    the file was written before the error is raised: a failed write leaves nothing behind."""
    name = get_storage().get_available_name(name)  # the name it will have: the one to remove
    try:
        return save(name, fileobj)
    except BaseException:
        delete_quietly([name])
        raise


def delete_quietly(names):
    """Delete files, logging (not raising) what fails: used to clean up after builds."""
    storage = get_storage()
    for name in names:
        try:
            storage.delete(name)
        except Exception:  # a cleanup failure must not hide the error being handled
            logger.exception("Could not delete %s from storage", name)
