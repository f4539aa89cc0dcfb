"""The ``RESOURCESYNC`` settings namespace.

Every option lives in one dict in the project's settings::

    RESOURCESYNC = {
        "BASE_URL": "https://repository.example.org",
        "STORAGE": "default",
    }

Read options through :data:`app_settings` (``app_settings.BASE_URL``). Unknown keys raise
``ImproperlyConfigured`` when the settings are first read; the system checks in
:mod:`django_resourcesync.checks` report them, and every value a site owner can get wrong, with a
hint.
"""

import logging
import re

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

logger = logging.getLogger(__name__)

DEFAULTS = {
    # Absolute base of every URI the documents contain: scheme and host, no trailing slash.
    "BASE_URL": None,
    # Alias in settings.STORAGES of the storage the documents are written to.
    "STORAGE": "default",
    # Folder inside that storage.
    "STORAGE_PREFIX": "resourcesync",
    # A <urlset> document holds at most this many entries and bytes (sitemaps.org limits).
    "MAX_ENTRIES_PER_DOCUMENT": 50_000,
    "MAX_DOCUMENT_BYTES": 50 * 1024 * 1024,
    # A dump package is closed before its bitstreams pass this many bytes (and at
    # MAX_ENTRIES_PER_DOCUMENT bitstreams). A single larger file gets a package of its own.
    "DUMP_PACKAGE_BYTES": 1024**3,
    # Rows fetched per database round trip in builds and scans.
    "BATCH_SIZE": 5_000,
    # Where the app's tasks run (see django_resourcesync.running): "auto" sends them to the site's
    # Celery workers when it has a Celery app with a broker that answers, and runs them in the
    # process otherwise (changes processed on a thread after each commit); "celery": always send;
    # "embedded": always run them in the process.
    "TASKS": "auto",
    # Hand the pending changes of autocommit saves, and the queueing of their processing, to a
    # thread of the process (see django_resourcesync.tracking.outbox); off: each save does both itself.
    "BACKGROUND_DISPATCH": True,
    # In the embedded mode, a process that serves requests processes the pending changes that no
    # thread of its own is processing (left by a process that was killed, or that ended before
    # its thread ran): at its first request, then every this many seconds. None: at the first only.
    "EMBEDDED_CATCH_UP_SECONDS": 60,
    # Builds of each capability kept in storage after they are replaced, so that a Destination
    # that fetched an index just before a switch-over can still fetch its parts.
    "KEEP_BUILDS": 1,
    # What a set that offers an archive keeps of the capability it archives: "count" (how many
    # builds, the current one included) and "age" (seconds); None for no limit. What leaves the
    # archive leaves storage.
    "ARCHIVE_RETENTION": {
        "resourcelist": {"count": 30, "age": None},
        "resourcedump": {"count": 3, "age": None},
        # Change Lists and Change Dump packages leave the live log after CHANGELIST_RETENTION;
        # their archives keep them (a list with its change events) this long after their until.
        "changelist": {"count": None, "age": 365 * 86400},
        "changedump": {"count": None, "age": 365 * 86400},
    },
    # Seconds a build lock lasts if its holder dies without releasing it (it is renewed while
    # the build runs).
    "BUILD_LOCK_TIMEOUT": 600,
    # Parts of a build made in one process (the rebuild command, eager mode) rendered at once on
    # PostgreSQL, each by a thread on its own connection (1: one after the other).
    "BUILD_THREADS": 2,
    # Times the task of one part of a parallel build may start (a retry after an error, or a
    # redelivery after its worker died) before the build is failed.
    "PART_ATTEMPTS": 3,
    # Seconds a part of a shared job (a reconcile in parts) may go without a sign of life from
    # its worker before another process takes it over.
    "PART_TIMEOUT": 60,
    # Seconds a stored file that no record refers to is left alone before the storage sweep
    # deletes it (a file being written now is recorded once it is whole).
    "SWEEP_GRACE_SECONDS": 3600,
    # Serve documents by redirecting to the storage URL instead of streaming them through Django.
    "SERVE_BY_REDIRECT": False,
    # When an open Change List closes: "hourly", "daily", "weekly" or a number of seconds
    # (periods are aligned on the epoch), and in any case at MAX_ENTRIES_PER_DOCUMENT entries.
    "CHANGELIST_PERIOD": "daily",
    # Seconds closed Change Lists (and their change events) are kept; None keeps them forever.
    "CHANGELIST_RETENTION": 30 * 86400,
    # Keep the bytes each change left, by sha-256, in the documents' storage (the version store),
    # for as long as a change event refers to them: Change Dumps then carry each change's bytes.
    # Off: nothing is kept, and Change Dump packages carry the bytes a resource has when packed
    # (only for changes whose bytes are still those).
    "KEEP_VERSIONS": True,
    # Push (WebSub): the hub Destinations subscribe at. None: the built-in hub at /resourcesync/hub.
    # An external hub's URL: notifications are sent to it instead (see HUB_PING).
    "HUB_URL": None,
    # How notifications reach an external hub: "fat" (the payload is POSTed, with Link headers
    # self, hub and resourcesync: the ResourceSync way) or "thin" (hub.mode=publish with hub.url
    # and hub.topic; the hub then fetches the topic, which answers with its latest notification).
    "HUB_PING": "fat",
    # The lease of a subscription at the built-in hub when the subscriber asks for none, and the
    # longest it grants (it re-subscribes before the lease ends).
    "HUB_LEASE_SECONDS": 10 * 86400,
    "HUB_MAX_LEASE_SECONDS": 30 * 86400,
    # Callbacks on loopback, private, link-local or reserved addresses are refused (the hub must
    # not be a way into the site's own network); True allows them (a demo on one machine).
    "HUB_ALLOW_PRIVATE_CALLBACKS": False,
    # Seconds a callback (or the external hub) has to answer one request.
    "HUB_TIMEOUT": 10,
    # Seconds a notification to the external hub is retried (a subscriber's: until its lease ends).
    "HUB_GIVE_UP_SECONDS": 86400,
    # Deliveries of one notification made at once (a thread each).
    "HUB_DELIVERY_THREADS": 16,
    # Verifications of intent made at once, a thread each (a callback that never answers holds
    # one for HUB_TIMEOUT), at most half of them for the requests of one client.
    "HUB_VERIFY_THREADS": 8,
    # The built-in hub's limits; past one, a request is answered 429 with Retry-After. None: no
    # limit. The (un)subscription requests one client may make (an IPv6 client counts by its
    # /64), as DRF writes rates; the subscriptions, made or being verified, whose callbacks are
    # on one host; the verifications waiting at once, all clients together.
    "HUB_REQUESTS_PER_CLIENT": "60/hour",
    "HUB_SUBSCRIPTIONS_PER_HOST": 100,
    "HUB_PENDING_VERIFICATIONS": 100,
    # Seconds notifications are kept for the admin (a channel's latest is kept while it exists).
    "NOTIFICATION_RETENTION": 7 * 86400,
    # URI of a document describing the Source as a whole (Source Description rs:ln describedby).
    "SOURCE_DESCRIBEDBY": None,
    # URI schemes an rs:ln href or profile may have; a link to any other (javascript:, data:,
    # file:) is not published. Add "urn", "ftp"... for links the site means to publish.
    "LINK_SCHEMES": ("http", "https"),
    # A stylesheet for the documents, so that a person opening one in a browser reads a table with
    # links instead of raw XML: an xml-stylesheet processing instruction at the top of every
    # document (Destinations' parsers skip it). None or False: no stylesheet; True: the app's own,
    # served at /resourcesync/resourcesync.xsl; a string: that URL (a browser applies only a
    # stylesheet from the document's own origin). Documents written before a change keep theirs
    # until they are rebuilt.
    "STYLESHEET": None,
    # A browser that opens a document (asking for HTML before XML) gets a page made from it on the
    # server: a table of its entries, with its dates and links (see django_resourcesync.pages).
    # Every other client gets the XML as published. False: everyone gets the XML.
    "HTML_PAGES": True,
    # The REST API (/resourcesync/api/): requests an anonymous client may make, per client
    # address (see TRUSTED_PROXIES), as DRF writes rates ("300/minute"); None: no limit.
    "API_ANON_RATE": "300/minute",
    # Failed authentications (a wrong password, an unknown or expired token) a client may make,
    # per IP address (per /64 for IPv6), as DRF writes rates; past it every authentication it
    # tries is a 429 until the period ends, a right one included. None: no limit.
    "AUTH_FAILURE_RATE": "20/hour",
    # The proxies in front of the site (load balancer, nginx): IP addresses or networks
    # ("10.0.0.0/8"), "unix" for one on a Unix socket. The X-Forwarded-For of a request that
    # comes from one of them names its client; with none (the default) a client is the address
    # of the connection, and the header is ignored.
    "TRUSTED_PROXIES": (),
    # Whether the public Source Description lists the sets for partners with a token too (their
    # Capability List URIs only; reading them still takes a token). False: they are not named
    # anywhere the public reads.
    "LIST_TOKEN_SETS": False,
    # The official schemas (resourcesync.xsd, sitemap.xsd, siteindex.xsd) against which the self-audit
    # validates every document it reads, besides the spec's rules. None: those the app ships; a
    # folder: that folder's; False: no schema, the spec's rules only.
    "AUDIT_SCHEMAS": None,
    # Modules (import strings) that register resource sources, besides the autodiscovered
    # ``resourcesync`` module of every installed app.
    "SOURCE_MODULES": [],
}

# (module, exception) for each RESOURCESYNC["SOURCE_MODULES"] entry that failed to import (in
# AppConfig.ready); reported by the system check resourcesync.E013 instead of breaking start-up.
source_module_errors = []


class AppSettings:
    """Attribute access to ``settings.RESOURCESYNC`` with defaults."""

    def __init__(self):
        self._cache = None

    @property
    def user_settings(self):
        return getattr(settings, "RESOURCESYNC", None) or {}

    def unknown_keys(self):
        return sorted(set(self.user_settings) - set(DEFAULTS))

    def _load(self):
        user = self.user_settings
        if not isinstance(user, dict):
            raise ImproperlyConfigured("settings.RESOURCESYNC must be a dict.")
        unknown = self.unknown_keys()
        if unknown:
            raise ImproperlyConfigured(
                f"Unknown key(s) in settings.RESOURCESYNC: {', '.join(unknown)}. "
                f"Known keys: {', '.join(sorted(DEFAULTS))}."
            )
        merged = dict(DEFAULTS)
        merged.update(user)
        if merged["BASE_URL"]:
            merged["BASE_URL"] = str(merged["BASE_URL"]).rstrip("/")
        return merged

    def __getattr__(self, name):
        if name not in DEFAULTS:
            raise AttributeError(f"Unknown ResourceSync setting: {name!r}")
        if self._cache is None:
            self._cache = self._load()
        return self._cache[name]

    def reload(self):
        self._cache = None


app_settings = AppSettings()


def archive_retention(capability):
    """``(count, age)`` of ``ARCHIVE_RETENTION`` for the archived ``capability``: how many of
    its documents (the current ones included) and how old (seconds); ``None`` for no limit."""
    rules = app_settings.ARCHIVE_RETENTION or {}
    # A capability the project's dict does not name keeps its default.
    rule = rules.get(capability, DEFAULTS["ARCHIVE_RETENTION"].get(capability)) or {}
    return rule.get("count"), rule.get("age")


#: A rate as DRF's throttles read it: a positive number of requests, "/", and a period whose
#: first letter is s, m, h or d ("300/minute", "10/s").
_RATE = re.compile(r"[1-9][0-9]*/[smhd][a-z]*")


def is_rate(value):
    """Whether ``value`` is a request rate DRF's throttles can read (``"300/minute"``); checked
    here, below the API and the system checks that both need it."""
    return isinstance(value, str) and _RATE.fullmatch(value) is not None


def rate_setting(name):
    """The rate the setting ``name`` gives (``None``: no limit); its default, with a warning in
    the log, while it is not a rate (the system check resourcesync.E026 reports it)."""
    rate = getattr(app_settings, name)
    if rate is None or is_rate(rate):
        return rate
    logger.warning("RESOURCESYNC[%r] = %r is not a rate; using %s", name, rate, DEFAULTS[name])
    return DEFAULTS[name]


def _reload(*, setting, **kwargs):
    if setting in ("RESOURCESYNC", "STORAGES"):
        app_settings.reload()


setting_changed.connect(_reload)
