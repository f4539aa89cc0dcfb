import importlib

import pytest

from django_resourcesync.models import ResourceSet


@pytest.fixture(autouse=True)
def documents_storage(settings, tmp_path):
    """Each test writes documents and media into its own folder."""
    settings.MEDIA_ROOT = str(tmp_path / "media")
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "media")}},
        "resourcesync": {
            "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "documents")}
        },
    }
    return tmp_path / "documents"


@pytest.fixture(autouse=True)
def fresh_cache():
    """Each test starts with an empty cache: what one test counted (throttles, failed
    authentications) does not count against the next."""
    from django.core.cache import caches

    for cache in caches.all():
        cache.clear()


@pytest.fixture(autouse=True)
def fresh_push_offers():
    """Which sets offer a notification channel is read again in each test (its database is new),
    and the push thread has nothing left of a test when the next starts."""
    from django_resourcesync import push

    push.forget_offers()
    yield
    # What a test left to the app's push thread (a retry due later) must not reach the next
    # test's database.
    push.runner.cancel()
    push.runner.idle(timeout=30)


@pytest.fixture
def seed(db):
    """``seed(n)`` adds n public items with files, as ``manage.py seed_repository`` does."""
    from django.core.management import call_command

    def do_seed(n, **options):
        call_command("seed_repository", items=n, verbosity=0, **options)

    return do_seed


def demo_set(slug):
    """The example project's set (created by its data migration; again after a flush)."""
    demo = importlib.import_module("example_project.repository.migrations.0002_resource_sets")
    pages = importlib.import_module("example_project.repository.migrations.0003_landing_pages")
    partners = importlib.import_module("example_project.repository.migrations.0005_partner_set")

    values = dict(next(s for s in [*demo.SETS, pages.PAGES, partners.SET] if s["slug"] == slug))
    return ResourceSet.objects.get_or_create(
        slug=values.pop("slug"), defaults={**values, "capabilities": ["resourcelist", "changelist"]}
    )[0]


@pytest.fixture
def bitstreams(db):
    return demo_set("bitstreams")


@pytest.fixture
def metadata(db):
    return demo_set("metadata")


@pytest.fixture
def sizes_from_the_storage(monkeypatch):
    """The example's files set as a source whose model records no file size (no
    ``fingerprint_file_sizes``): each file's size completes its fingerprint from the storage (a
    stat, S3's listing), and a file rewritten in place with another size is found. Name it
    before the fixtures that build the set, so that the set is built with these fingerprints."""
    from django.apps import apps

    source = apps.get_app_config("resourcesync").sources.get("bitstreams")
    monkeypatch.setattr(type(source), "fingerprint_file_sizes", {})
    source.__dict__.pop("_fingerprint_digest", None)
    yield source
    source.__dict__.pop("_fingerprint_digest", None)


@pytest.fixture
def admin_client(client, db):
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_superuser("admin", "admin@example.org", "pw"))
    return client


@pytest.fixture
def pages(db):
    return demo_set("pages")


@pytest.fixture
def committing(django_capture_on_commit_callbacks):
    """``with committing():`` runs the code under it as if each transaction committed (on-commit
    hooks execute)."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


@pytest.fixture
def full_disk_for_metadata():
    """The documents' storage refuses the metadata set's files, as a full disk would."""
    from unittest import mock

    from django_resourcesync import storage

    save = storage.save

    def full_disk(name, fileobj):
        if "/metadata/" in name:
            raise OSError(28, "No space left on device")
        return save(name, fileobj)

    with mock.patch.object(storage, "save", full_disk):
        yield


def publish_versions(seed, committing, items, capabilities=None):
    """The example's files set, publishing prior versions (with ``capabilities``, if given),
    with ``items`` items, published once."""
    from django_resourcesync.rebuild import rebuild_set

    resource_set = demo_set("bitstreams")
    if capabilities is not None:
        resource_set.capabilities = list(capabilities)
    resource_set.prior_versions = True
    resource_set.save()
    with committing():
        seed(items)
    rebuild_set(resource_set)
    return resource_set


from .browser import browser  # noqa: E402,F401  (the fixture of the tests in a real browser)
