"""Test settings: the example project, with its files in a throw-away folder.

``TEST_DATABASE_URL`` (``postgres://…``) runs the suite on PostgreSQL; unset, on SQLite.
"""

import os
import tempfile

os.environ.setdefault("EXAMPLE_VAR_DIR", tempfile.mkdtemp(prefix="resourcesync-tests-"))
os.environ.pop("CELERY_BROKER_URL", None)

from example_project.settings import *  # noqa: E402,F401,F403
from example_project.settings import database_from_url  # noqa: E402

if os.environ.get("TEST_DATABASE_URL"):
    DATABASES = {"default": database_from_url(os.environ["TEST_DATABASE_URL"])}

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
RESOURCESYNC = {
    "BASE_URL": "http://testserver",
    "STORAGE": "resourcesync",
    "STORAGE_PREFIX": "documents",
}
