"""Capability names (spec section 7, ``rs:md/@capability``) and which ones this app builds."""

from django.utils.translation import gettext_lazy as _

DESCRIPTION = "description"
CAPABILITYLIST = "capabilitylist"
RESOURCELIST = "resourcelist"
CHANGELIST = "changelist"
RESOURCEDUMP = "resourcedump"
CHANGEDUMP = "changedump"
RESOURCEDUMP_MANIFEST = "resourcedump-manifest"
CHANGEDUMP_MANIFEST = "changedump-manifest"

# The capabilities a set can offer, in the order a Capability List names them.
CAPABILITY_CHOICES = [
    (RESOURCELIST, _("Resource List")),
    (CHANGELIST, _("Change List")),
    (RESOURCEDUMP, _("Resource Dump")),
    (CHANGEDUMP, _("Change Dump")),
]
