# ruff: noqa: F821 (the names this file extends are those of the settings above it)
# Added at the end of mysite/settings.py.
import os

INSTALLED_APPS += [
    "rest_framework",  # the app's REST API, its browsable pages and its schema page
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_resourcesync",
    "library",
]

# First: the Link header that points from each published resource to its set (discovery).
MIDDLEWARE.insert(0, "django_resourcesync.discovery.ResourceSyncLinkMiddleware")

# Where the documents are written (the "default" storage).
MEDIA_ROOT = BASE_DIR / "media"

RESOURCESYNC = {
    # The scheme and host every URI of the documents starts with: the site's public address.
    "BASE_URL": os.environ.get("SITE_URL", "http://127.0.0.1:8000"),
}
