"""Test settings: the example project, with its files in a throw-away folder.

- ``TEST_DATABASE_URL`` (``postgres://…``) runs the suite on PostgreSQL; unset, on SQLite.
- ``TEST_CELERY_BROKER_URL`` gives a real broker (a worker started by a test uses it);
  unset, tasks run in process.
- ``TEST_FILES_DIR`` puts media and documents in that folder (a worker started by a test shares
  the test's folder this way).
- ``TEST_REDIS_URL`` and ``TEST_S3_ENDPOINT_URL`` are read by the tests that start a worker or use
  S3 (tests/test_worker.py, tests/test_s3.py, tests/test_stack.py).

The production variables of the example project (``DATABASE_URL``, ``CELERY_BROKER_URL``,
``AWS_STORAGE_BUCKET_NAME``) are ignored here: the variables above choose the stack.
"""

import atexit
import os
import shutil
import tempfile

if "EXAMPLE_VAR_DIR" not in os.environ:  # a worker a test starts is given the test's
    os.environ["EXAMPLE_VAR_DIR"] = tempfile.mkdtemp(prefix="resourcesync-tests-")
    atexit.register(shutil.rmtree, os.environ["EXAMPLE_VAR_DIR"], ignore_errors=True)
for name in ("DATABASE_URL", "CELERY_BROKER_URL", "AWS_STORAGE_BUCKET_NAME"):
    os.environ.pop(name, None)  # the suite's own TEST_* variables choose the stack

from example_project.settings import *  # noqa: E402,F401,F403
from example_project.settings import database_from_url  # noqa: E402

if os.environ.get("TEST_DATABASE_URL"):
    DATABASES = {"default": database_from_url(os.environ["TEST_DATABASE_URL"])}
else:
    # A file, as a site's SQLite database is: the threads of the process (the live server, the
    # hub's) then take turns on it, where an in-memory database shared between them would
    # answer "database table is locked".
    DATABASES["default"]["TEST"] = {"NAME": os.path.join(os.environ["EXAMPLE_VAR_DIR"], "test.sqlite3")}

if os.environ.get("TEST_CELERY_BROKER_URL"):
    CELERY_BROKER_URL = os.environ["TEST_CELERY_BROKER_URL"]
    CELERY_RESULT_BACKEND = os.environ.get("TEST_CELERY_RESULT_BACKEND", CELERY_BROKER_URL)
    CELERY_TASK_ALWAYS_EAGER = False
else:
    # Tasks run where they are sent, so a test reads their outcome as soon as its save commits
    # (tests/test_embedded.py runs the embedded mode, with its thread, on purpose).
    CELERY_TASK_ALWAYS_EAGER = True

if os.environ.get("TEST_FILES_DIR"):
    MEDIA_ROOT = os.path.join(os.environ["TEST_FILES_DIR"], "media")
    STORAGES = {
        **STORAGES,
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": MEDIA_ROOT}},
        "resourcesync": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": os.path.join(os.environ["TEST_FILES_DIR"], "documents")},
        },
    }

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
RESOURCESYNC = {
    "BASE_URL": "http://testserver",
    "STORAGE": "resourcesync",
    "STORAGE_PREFIX": "documents",
    # The test process processes what it left pending when a test says so, not on a timer: the
    # catch-up is tested with servers of their own (tests/test_embedded.py).
    "EMBEDDED_CATCH_UP_SECONDS": None,
}
