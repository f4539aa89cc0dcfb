"""One entry point for bringing a set's documents up to date, shared by tasks and commands."""

from . import capabilities
from .builders.resourcelist import build_resourcelist

BUILDERS = {capabilities.RESOURCELIST: build_resourcelist}


def rebuild_set(resource_set, *, only=None, progress=None, batch_size=None):
    """Build every enabled capability of the set (or those in ``only``); returns the builds."""
    builds = []
    for capability, builder in BUILDERS.items():
        if resource_set.has_capability(capability) and (not only or capability in only):
            builds.append(builder(resource_set, progress=progress, batch_size=batch_size))
    return builds
