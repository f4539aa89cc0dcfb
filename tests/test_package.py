"""The distributions people install: every file of the package in them, metadata that passes
``twine check``, and a minimal project that runs with the app installed and nothing else."""

import hashlib
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

import django_resourcesync

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "django_resourcesync"
FROM_CHECKOUT = Path(django_resourcesync.__file__).resolve().parent == PACKAGE
#: The official schemas the app ships, byte for byte as published (origins and licences in their
#: folder's README.md).
OFFICIAL_SCHEMAS = {
    "resourcesync.xsd": "e60e46a515ccaf3ef1c9a3a0492cddf1c4ff9fc481eaefb95639038dbfeaeab3",
    "sitemap.xsd": "fbec77e84467050d5667394a57cc5cdfe1239d80aca1d61e9e0827173c3d9df9",
    "siteindex.xsd": "221d53c28d58c732e62bef159b112adaef79bc68f9f4a1965ae5be5e5c1edd29",
}


def package_files():
    """The package's files as the checkout has them (what git tracks or would)."""
    return {
        path.relative_to(ROOT).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo")
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``(wheel, sdist, what the build printed)``."""
    if not FROM_CHECKOUT:
        pytest.skip("the app is installed, not imported from the checkout: its distributions are built from the checkout")
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(out)],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return wheel, sdist, done.stdout + done.stderr


@pytest.fixture(scope="module")
def distributions(built):
    return built[:2]


@pytest.mark.slow
def test_the_build_finds_every_folder_of_the_package_without_a_warning(built):
    """setuptools warns of each folder of data (templates, static files, schemas) that looks
    like a package it was not told of, and means to leave such folders out one day."""
    log = built[2]
    assert "would be ignored" not in log, log[max(0, log.find("would be ignored") - 300):][:3000]


@pytest.mark.slow
def test_the_wheel_and_the_sdist_carry_every_file_of_the_package(distributions):
    wheel, sdist = distributions
    wanted = package_files()
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = {name for name in archive.namelist() if name.startswith("django_resourcesync/")}
    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split("/")[0]
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if name.startswith(f"{top}/django_resourcesync/")}
        in_sdist = {name for name in in_sdist if (ROOT / name).is_file()}
        assert {f"{top}/{name}" for name in ("LICENSE", "README.md", "CHANGELOG.md", "setup.cfg")} <= set(archive.getnames())
    assert in_wheel == wanted, (sorted(wanted - in_wheel), sorted(in_wheel - wanted))
    assert in_sdist == wanted, (sorted(wanted - in_sdist), sorted(in_sdist - wanted))
    schemas = {f"django_resourcesync/schemas/{name}" for name in [*OFFICIAL_SCHEMAS, "README.md"]}
    assert schemas <= in_wheel and schemas <= in_sdist


def test_the_app_ships_the_official_schemas_unmodified_and_says_where_they_come_from():
    """What the audit validates against out of the box (from the checkout, or from the installed
    package in the suite run from the wheel): the three published files, nothing else."""
    from django_resourcesync.audit import rules

    shipped = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in rules.SCHEMAS.glob("*.xsd")}
    assert shipped == OFFICIAL_SCHEMAS
    notice = (rules.SCHEMAS / "README.md").read_text()
    for name, digest in OFFICIAL_SCHEMAS.items():
        assert name in notice and digest in notice, name
    for published in ("http://www.openarchives.org/rs/1.1/resourcesync.xsd", "https://www.sitemaps.org/schemas/sitemap/0.9/"):
        assert published in notice
    assert notice.count("Creative Commons Attribution-ShareAlike") == 2


@pytest.mark.slow
def test_the_distributions_pass_twine_check(distributions):
    command = [sys.executable, "-m", "twine", "check", "--strict", *map(str, distributions)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_metadata_claims_what_is_tested():
    """The classifiers, python_requires and tox's environments name the same versions."""
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    classifiers = config["metadata"]["classifiers"].split("\n")
    pythons = sorted(c.rsplit(" ", 1)[1] for c in classifiers if c.startswith("Programming Language :: Python :: 3."))
    djangos = sorted(c.rsplit(" ", 1)[1] for c in classifiers if c.startswith("Framework :: Django :: "))
    assert config["options"]["python_requires"] == f">={pythons[0]}"
    tox = (ROOT / "tox.ini").read_text()
    for python in pythons:
        assert f"{python.replace('.', '')}" in tox.split("envlist =", 1)[1].split("\n", 1)[0], python
    for django in djangos:
        assert f"django{django.replace('.', '')}: Django>={django}" in tox, django


def test_a_minimal_project_with_the_app_checks_and_serves_its_source_description(tmp_path):
    """A site owner's first steps: the app in INSTALLED_APPS, BASE_URL, the URLs included."""
    (tmp_path / "minimal_settings.py").write_text(textwrap.dedent('''
        SECRET_KEY = "minimal"
        DEBUG = False
        ALLOWED_HOSTS = ["testserver", "repository.example.org"]
        INSTALLED_APPS = [
            "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
            "django.contrib.sessions", "django.contrib.messages", "django_resourcesync",
        ]
        MIDDLEWARE = [
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ]
        TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True, "OPTIONS": {
            "context_processors": ["django.template.context_processors.request", "django.contrib.auth.context_processors.auth",
                                   "django.contrib.messages.context_processors.messages"]}}]
        ROOT_URLCONF = "minimal_urls"
        DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "minimal.sqlite3"}}
        USE_TZ = True
        CELERY_TASK_ALWAYS_EAGER = True
        RESOURCESYNC = {"BASE_URL": "https://repository.example.org"}
    '''))
    (tmp_path / "minimal_urls.py").write_text(
        'from django.contrib import admin\nfrom django.urls import include, path\n'
        'urlpatterns = [path("admin/", admin.site.urls), path("", include("django_resourcesync.urls"))]\n'
    )
    script = textwrap.dedent('''
        import django
        from django.core.management import call_command
        django.setup()
        call_command("check")  # warns that no source is registered yet: a first step, not an error
        call_command("migrate", verbosity=0)
        from django.test import Client
        response = Client().get("/.well-known/resourcesync")
        print(response.status_code, response["Content-Type"], response.content.decode()[:400])
    ''')
    env = {"DJANGO_SETTINGS_MODULE": "minimal_settings", "PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    status, content_type, body = done.stdout.strip().split(" ", 2)
    assert status == "200" and content_type == "application/xml"
    assert 'capability="description"' in body and "<urlset" in body


def runtime_requirements():
    """The distributions a plain ``pip install django-resourcesync`` brings: those setup.cfg
    requires (no extra), and theirs, as installed here."""
    import configparser
    from importlib import metadata

    from packaging.requirements import Requirement

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    wanted = [line for line in config["options"]["install_requires"].splitlines() if line and not line.startswith("#")]
    found, seen = set(), set()
    while wanted:
        requirement = Requirement(wanted.pop())
        name = requirement.name.lower().replace("_", "-")
        if name in seen or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            wanted += metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        found.add(name)
    return found


def test_every_module_the_app_imports_as_it_loads_comes_with_a_plain_install():
    """``pip install django-resourcesync`` with no extra: no module of the app (the audit's
    command, the pages) fails with a ModuleNotFoundError. Imports inside functions (S3,
    django-celery-beat) belong to extras and are left out."""
    import ast
    from importlib import metadata

    providers = metadata.packages_distributions()
    installed = runtime_requirements()
    missing = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top == "django_resourcesync":
                    continue
                names = {name.lower().replace("_", "-") for name in providers.get(top, [])}
                if not names & installed:
                    missing.setdefault(top, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not missing, missing
