"""Builders render capability documents into storage and publish them atomically.

A build writes every file of a new version under names no reader knows yet (the build's id is
part of each name), records them as :class:`~django_resourcesync.models.Document` rows, and then
switches readers over in one database transaction: the new build becomes ``published`` and the one
before it ``retired``. A reader therefore sees either the old index and old parts or the new index
and new parts, never a mixture, and a failed build leaves the published version untouched. Retired
builds stay in storage for ``KEEP_BUILDS`` generations, so a Destination that fetched an index just
before a switch-over can still fetch its parts.
"""

from ..exceptions import BuildAbandoned, BuildInProgress
from .context import BuildContext, current_build, left_out_report
from .locks import HEARTBEAT_SECONDS, HEARTBEAT_TTL_SECONDS, HOST, build_lock

__all__ = [
    "HEARTBEAT_SECONDS", "HEARTBEAT_TTL_SECONDS", "HOST", "BuildAbandoned", "BuildContext", "BuildInProgress", "build_lock",
    "current_build", "left_out_report",
]
