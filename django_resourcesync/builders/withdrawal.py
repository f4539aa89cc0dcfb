"""Withdrawal: once a resource leaves a set, nothing the set serves lists it or its bytes.

A resource leaves a set when its object is deleted, made private or filtered out; change tracking
then writes its ``deleted`` event and calls :func:`withdraw` in the same transaction, under the
set's lock. Every document that lists it and every package that may hold its bytes is dealt with
there and then, so that the commit that records its deletion also takes it out of what is served:

- a **Resource List** (the published one, and those kept for the archive) is written again
  without its entry: the part that lists it (found by the key its record had: a build's parts
  are ranges of record keys), or the one document. It keeps its URI and its ``at``: it still
  tells of the set at that time, but for what has left it since, whose deletions are in the
  Change List;
- a **Resource Dump** is packed again: each package of the published build that held its bytes
  is copied, without them, into a package of its own name (``part-NNNNN-rN.zip``) with its
  manifest cut the same way, and the dump's document is written again over them, so the dump
  keeps covering the Resource List. The old package and its manifest answer 410 Gone from the
  commit and leave storage. Should that fail (a full disk), the build is removed (no dump rather
  than one that does not cover the list) until the next rebuild. A retired build (kept for the
  archive) that holds it is removed whole: it leaves the archive;
- a **Change Dump** package is found by the change events it packed: it is withdrawn (410),
  left out of the Change Dump, and packed again (without what left the set) by the next
  ``resourcesync.package_changes`` or rebuild;
- the **version store** forgets the bytes of its changes (unless another resource's changes have
  the same bytes): they are never packed again.

A Resource List or Resource Dump being built meanwhile checks, before it publishes, the
:class:`Withdrawal` rows written since its snapshot time (``before_publish`` of each): they are
kept while such a build runs, and pruned by the storage sweep.
"""

import logging

from django.db import transaction
from django.dispatch import receiver
from django.utils import timezone

from .. import capabilities, versions
from ..models import Build, Withdrawal
from ..signals import resources_left
from . import changedump, resourcedump, resourcelist

logger = logging.getLogger(__name__)

#: The capabilities whose builds list resources or hold their bytes.
HOLDING = (capabilities.RESOURCELIST, capabilities.RESOURCEDUMP, capabilities.CHANGEDUMP)


@receiver(resources_left, dispatch_uid="resourcesync_withdraw")
def withdraw(sender, resource_set, leaving, uris=None, in_use=(), moved=None, **kwargs):
    """Take ``leaving``, ``{object_pk: record id}`` of resources that have just left the set,
    out of every list and package of the set that holds them, and the old URIs of those that
    ``moved`` (the same) out of the lists and Resource Dumps (``uris``: ``{object_pk: URI}`` they
    had), under the set's lock."""
    moved = moved or {}
    if not leaving and not moved:
        return
    uris = uris or {}
    now = timezone.now()
    builds = list(
        Build.objects.filter(resource_set=resource_set, capability__in=HOLDING).exclude(status=Build.Status.FAILED)
    )
    if any(build.status == Build.Status.RUNNING for build in builds):
        # Checked by the running build before it publishes.
        Withdrawal.objects.bulk_create([
            Withdrawal(resource_set=resource_set, object_pk=key, resource_id=record_id, uri=uris.get(key, ""), at=now)
            for key, record_id in (*leaving.items(), *moved.items())
        ])
    record_ids = [*leaving.values(), *moved.values()]
    locs = [uris[key] for key in (*leaving, *moved) if key in uris]
    for build in builds:
        if build.status == Build.Status.RUNNING:
            continue
        if build.capability == capabilities.RESOURCELIST:
            resourcelist.cut_from_build(build, record_ids, locs)
        elif build.capability == capabilities.RESOURCEDUMP:
            _withdraw_from_dump(build, record_ids, locs)
    if leaving:
        changedump.withdraw_packages_holding(resource_set, list(leaving), now)
        versions.forget_withdrawn(resource_set, list(leaving), in_use=in_use)


def _withdraw_from_dump(build, record_ids, locs):
    try:
        with transaction.atomic():
            resourcedump.withdraw_from_build(build, record_ids, locs)
    except Exception:
        # Rather no Resource Dump than one that serves what left the set, or that leaves out
        # what the Resource List lists: the next rebuild packs a whole one again.
        logger.exception("%s could not be packed again without resources that left the set; removed", build)
        build.delete()  # its files leave storage once this commits (see signals.py)
