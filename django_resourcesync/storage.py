"""Where documents are written: the Django storage named by ``RESOURCESYNC["STORAGE"]``."""

import logging
import posixpath

from django.core.files import File
from django.core.files.storage import storages

from .conf import app_settings

logger = logging.getLogger(__name__)


def get_storage():
    return storages[app_settings.STORAGE]


def storage_name(*parts):
    return posixpath.join(app_settings.STORAGE_PREFIX, *(str(part) for part in parts))


def save(name, fileobj):
    """Save an open binary file under ``name``; returns the name the storage chose."""
    fileobj.seek(0)
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
