"""The test settings with the broken sources of :mod:`tests.broken.sources` registered."""

from tests.settings import *  # noqa: F403

RESOURCESYNC = {**RESOURCESYNC, "SOURCE_MODULES": ["tests.broken.sources"]}  # noqa: F405
