import pytest

from django_resourcesync.models import ResourceSet


@pytest.fixture(autouse=True)
def documents_storage(settings, tmp_path):
    """Each test writes documents and media into its own folder."""
    settings.MEDIA_ROOT = str(tmp_path / "media")
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "media")}},
        "resourcesync": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "documents")}},
    }
    return tmp_path / "documents"


@pytest.fixture
def seed(db):
    """``seed(n)`` adds n public items with files, as ``manage.py seed_repository`` does."""
    from django.core.management import call_command

    def do_seed(n, **options):
        call_command("seed_repository", items=n, verbosity=0, **options)

    return do_seed


@pytest.fixture
def bitstreams(db):
    return ResourceSet.objects.get(slug="bitstreams")


@pytest.fixture
def metadata(db):
    return ResourceSet.objects.get(slug="metadata")
