"""Settings of the demo repository site.

Everything has an embedded default (SQLite, files under var/, tasks run in process) and can be
switched to a production stack through the environment:

- ``RESOURCESYNC_BASE_URL``: absolute base of the published URIs (default http://127.0.0.1:8000);
- ``DATABASE_URL``: ``postgres://user:password@host:port/name`` (default: SQLite in var/);
- ``CELERY_BROKER_URL``: e.g. ``redis://127.0.0.1:6379/0`` (default: the app runs its tasks in process);
- ``AWS_STORAGE_BUCKET_NAME``: documents and dump packages in this S3 bucket through
  django-storages (default: files in var/resourcesync), with ``AWS_S3_ENDPOINT_URL`` (an
  S3-compatible service; default Amazon S3), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``
  (default: boto3's own lookup: its configuration files, an instance role) and
  ``AWS_S3_REGION_NAME``;
- ``DJANGO_DEBUG``: ``1`` for debug mode;
- ``EXAMPLE_VAR_DIR``: where the SQLite database and media files live (default ./var).

With django-celery-beat installed (the ``beat`` extra), beat's schedules are kept in the
database and edited in the admin; ``CELERY_BEAT_SCHEDULE`` below seeds them.
"""

import importlib.util
import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from celery.schedules import crontab

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("EXAMPLE_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver,[::1]").split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_resourcesync",
    "example_project.repository",
]

MIDDLEWARE = [
    # First, so that it sees the final response (a 304 included): Link: <...>; rel="resourcesync".
    "django_resourcesync.discovery.ResourceSyncLinkMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # 304 for a resource fetched again unchanged (the views send Last-Modified).
    "django.middleware.http.ConditionalGetMiddleware",
]

ROOT_URLCONF = "example_project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django_resourcesync.context_processors.resourcesync",
            ],
        },
    },
]

WSGI_APPLICATION = "example_project.wsgi.application"


def database_from_url(url):
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"DATABASE_URL: only postgres:// URLs are supported, not {parts.scheme}://")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": database_from_url(os.environ["DATABASE_URL"])}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "db.sqlite3",
            # Transactions take the write lock when they begin, and wait for it (up to 20 s):
            # writers queue up instead of failing with "database is locked". A write-ahead log:
            # readers (the demo's pages) go on while a batch of changes is written, and a commit
            # appends to the log instead of rewriting pages across the file and waiting for the
            # disk twice (synchronous=NORMAL: a power cut may lose the last commits, never the
            # database's consistency).
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en"
USE_I18N = True

STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "static"
MEDIA_URL = "/media/"
MEDIA_ROOT = VAR_DIR / "media"

STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "resourcesync": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": VAR_DIR / "resourcesync", "base_url": "/resourcesync-files/"},
    },
}


def s3_storage_from_environment(environ):
    """The documents' storage on the S3 bucket the AWS_* variables name, or ``None``."""
    if not environ.get("AWS_STORAGE_BUCKET_NAME"):
        return None
    options = {
        "bucket_name": environ["AWS_STORAGE_BUCKET_NAME"],
        "endpoint_url": environ.get("AWS_S3_ENDPOINT_URL") or None,
        "access_key": environ.get("AWS_ACCESS_KEY_ID") or None,
        "secret_key": environ.get("AWS_SECRET_ACCESS_KEY") or None,
        "region_name": environ.get("AWS_S3_REGION_NAME") or None,
        "file_overwrite": False,
    }
    return {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": options}


STORAGES["resourcesync"] = s3_storage_from_environment(os.environ) or STORAGES["resourcesync"]

RESOURCESYNC = {
    "BASE_URL": os.environ.get("RESOURCESYNC_BASE_URL", "http://127.0.0.1:8000"),
    "STORAGE": "resourcesync",
    "STORAGE_PREFIX": "documents",
    # A page of this site about the Source (rs:ln rel="describedby" of the Source Description).
    "SOURCE_DESCRIBEDBY": "/about/resourcesync/",
    # The built-in hub takes callbacks on this machine too, so that push can be tried with a
    # subscriber on localhost. A site on the Internet leaves this off (the default).
    "HUB_ALLOW_PRIVATE_CALLBACKS": os.environ.get("RESOURCESYNC_HUB_ALLOW_PRIVATE_CALLBACKS", "1") == "1",
    # A person opening a document in a browser reads a table with links.
    "STYLESHEET": True,
}

# The REST API (/resourcesync/api/) authenticates as the site does: a session (the admin's
# login), HTTP Basic, or a token (``manage.py drf_create_token <user>``).
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.BasicAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "django-resourcesync",
    "DESCRIPTION": "What the ResourceSync Source publishes: sets, builds, documents, changes.",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Celery: with no broker configured, the app runs its tasks in this process (the embedded
# default: changes are processed on a thread after each commit, off the request).
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "")
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", "")
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1

# What `celery -A example_project beat` runs (see docs/schedules.rst).
CELERY_BEAT_SCHEDULE = {
    "resourcesync-rebuild-all": {"task": "resourcesync.rebuild_all", "schedule": crontab(hour=2, minute=30)},
    "resourcesync-process-changes": {"task": "resourcesync.process_changes", "schedule": 60.0},
    "resourcesync-close-changelists": {"task": "resourcesync.close_changelists", "schedule": crontab(minute=5)},
    "resourcesync-package-changes": {"task": "resourcesync.package_changes", "schedule": crontab(hour=0, minute=10)},
    "resourcesync-sweep-storage": {"task": "resourcesync.sweep_storage", "schedule": crontab(minute=35)},
    "resourcesync-deliver-due": {"task": "resourcesync.deliver_due", "schedule": 60.0},
    "resourcesync-audit": {"task": "resourcesync.audit", "schedule": crontab(hour=4, minute=0)},
}

# With django-celery-beat (the ``beat`` extra), schedules live in the database, edited in the admin.
if importlib.util.find_spec("django_celery_beat"):
    INSTALLED_APPS.append("django_celery_beat")
    CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_resourcesync": {"handlers": ["console"], "level": "WARNING"}},
}
