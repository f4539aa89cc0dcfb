"""Withdrawal: once a resource leaves a set, no package keeps serving its bytes.

A resource leaves a set when its object is deleted, made private or filtered out; change tracking
then writes its ``deleted`` event and calls :func:`withdraw` in the same transaction, under the
set's lock. Every package that may hold its bytes is withdrawn there and then:

- a **Resource Dump** package is found by the key its record had (a dump build's parts are ranges
  of record keys): the package and its manifest answer 410 Gone from then on and leave storage
  once the transaction commits, and the published dump's document is written again without them
  (the next rebuild packs a whole dump again). A retired build that holds one is removed at once:
  retired builds are served only while they hold nothing withdrawn;
- a **Change Dump** package is found by the change events it packed: it is withdrawn the same
  way, left out of the Change Dump, and packed again (without what left the set) by the next
  ``resourcesync.package_changes`` or rebuild;
- the **version store** forgets the bytes of its changes (unless another resource's changes have
  the same bytes): they are never packed again.

A dump being built meanwhile checks, before it publishes, the :class:`Withdrawal` rows written
since it started (:func:`withdraw_from_build`, :func:`withdrawn_since`): they are kept while such
a build runs, and pruned by the storage sweep.
"""

import logging

from django.dispatch import receiver
from django.utils import timezone

from .. import capabilities, versions
from ..models import Build, Withdrawal
from ..signals import resources_left
from . import changedump, resourcedump

logger = logging.getLogger(__name__)

DUMPS = (capabilities.RESOURCEDUMP, capabilities.CHANGEDUMP)


@receiver(resources_left, dispatch_uid="resourcesync_withdraw")
def withdraw(sender, resource_set, leaving, in_use=(), **kwargs):
    """Withdraw every package of the set that holds the bytes of ``leaving``, ``{object_pk:
    record id}`` of resources that have just left it (under the set's lock)."""
    if not leaving:
        return
    now = timezone.now()
    builds = list(Build.objects.filter(resource_set=resource_set, capability__in=DUMPS).exclude(status=Build.Status.FAILED))
    if any(build.status == Build.Status.RUNNING for build in builds):
        # Checked by the running build before it publishes.
        Withdrawal.objects.bulk_create(
            [
                Withdrawal(resource_set=resource_set, object_pk=key, resource_id=record_id, at=now)
                for key, record_id in leaving.items()
            ]
        )
    for build in builds:
        if build.capability == capabilities.RESOURCEDUMP and build.status in (Build.Status.PUBLISHED, Build.Status.RETIRED):
            resourcedump.withdraw_from_build(build, leaving.values(), now, rewrite_after_commit=True)
    changedump.withdraw_packages_holding(resource_set, list(leaving), now)
    versions.forget_withdrawn(resource_set, list(leaving), in_use=in_use)
