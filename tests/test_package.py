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


def setup_cfg():
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return config


def requirement_lines(text):
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def version_key(version):
    return tuple(int(part) for part in version.split("."))


def claimed_versions():
    """``(pythons, djangos)`` the classifiers name, oldest first."""
    classifiers = setup_cfg()["metadata"]["classifiers"].split("\n")
    pythons = [c.rsplit(" ", 1)[1] for c in classifiers if c.startswith("Programming Language :: Python :: 3.")]
    djangos = [c.rsplit(" ", 1)[1] for c in classifiers if c.startswith("Framework :: Django :: ")]
    return sorted(pythons, key=version_key), sorted(djangos, key=version_key)


def tox_environments():
    """tox's envlist, its braces expanded: ``{"py311-django52", ...}``."""
    import re

    def expand(text):
        brace = re.search(r"{([^{}]*)}", text)
        if brace is None:
            return {text.strip()}
        return {e for choice in brace.group(1).split(",") for e in expand(text[:brace.start()] + choice + text[brace.end():])}

    line = (ROOT / "tox.ini").read_text().split("envlist =", 1)[1].split("\n", 1)[0]
    return {env for factor in re.split(r",(?![^{]*})", line) for env in expand(factor)}


def test_the_metadata_claims_what_is_tested():
    """The classifiers, python_requires, tox's environments, the docs and the wheel pass of
    dev.py name the same versions of Python and Django."""
    import importlib.util

    from packaging.requirements import Requirement

    config = setup_cfg()
    pythons, djangos = claimed_versions()
    assert config["options"]["python_requires"] == f">={pythons[0]}"
    (django,) = [Requirement(line) for line in requirement_lines(config["options"]["install_requires"])
                 if Requirement(line).name == "Django"]
    assert str(django.specifier) == f">={djangos[0]}"
    tox = (ROOT / "tox.ini").read_text()
    environments = tox_environments()
    for python in pythons:
        assert any(env.startswith(f"py{python.replace('.', '')}-") for env in environments), python
    for version in djangos:
        major, minor = version_key(version)
        assert f"django{major}{minor}: Django>={version},<{major}.{minor + 1}" in tox, version
        assert any(env.endswith(f"-django{major}{minor}") for env in environments), version
    assert {env.split("-")[0] for env in environments} == {f"py{p.replace('.', '')}" for p in pythons}
    # The newest of each, together: the suite's pass on the app installed from a wheel.
    spec = importlib.util.spec_from_file_location("dev_script", ROOT / "dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    major, minor = version_key(djangos[-1])
    assert (dev.NEWEST_PYTHON, dev.NEWEST_DJANGO) == (pythons[-1], f"Django>={djangos[-1]},<{major}.{minor + 1}")
    assert f"py{pythons[-1].replace('.', '')}-django{major}{minor}" in environments
    readme = (ROOT / "README.md").read_text()
    assert f"on Python {pythons[-1]} and Django {djangos[-1]}" in readme
    install = (ROOT / "docs" / "install.rst").read_text().split("Requirements\n", 1)[1].split("\n\n", 2)[1]
    assert f"* Python {', '.join(pythons[:-1])} or {pythons[-1]};" in install, install
    assert f"* Django {djangos[0]} LTS, {', '.join(djangos[1:-1])} or {djangos[-1]}" in install, install


def test_the_dev_extra_installs_with_every_django_the_app_supports():
    """Nothing the development tools bring holds Django below a version the app claims (as
    django-celery-beat 2.9 does below 6.1: it is the ``beat`` extra, not part of ``dev``)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    config = setup_cfg()
    lines = requirement_lines(config["options"]["install_requires"])
    lines += requirement_lines(config["options.extras_require"]["dev"])
    _pythons, djangos = claimed_versions()
    holding = []
    for name in installed_closure(lines):
        for line in metadata.requires(name) or []:
            requirement = Requirement(line)
            if requirement.name.lower() != "django" or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
                continue
            holding += [(name, str(requirement.specifier), v) for v in djangos if not requirement.specifier.contains(f"{v}.0")]
    assert not holding, holding
    dev = [Requirement(line).name for line in requirement_lines(config["options.extras_require"]["dev"])]
    assert "django-celery-beat" not in dev


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


def installed_closure(lines):
    """The distributions that the requirements ``lines`` bring, and theirs (with the extras they
    ask for), as installed here."""
    from importlib import metadata

    from packaging.requirements import Requirement

    wanted = [(line, {""}) for line in lines]
    found, seen = set(), set()
    while wanted:
        line, extras = wanted.pop()
        requirement = Requirement(line)
        if requirement.marker and not any(requirement.marker.evaluate({"extra": extra}) for extra in extras):
            continue
        name = requirement.name.lower().replace("_", "-")
        if (name, frozenset(requirement.extras)) in seen:
            continue
        seen.add((name, frozenset(requirement.extras)))
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        found.add(name)
        wanted += [(dependency, {"", *requirement.extras}) for dependency in requires]
    return found


def test_every_module_the_app_imports_as_it_loads_comes_with_a_plain_install():
    """``pip install django-resourcesync`` with no extra: no module of the app (the audit's
    command, the pages) fails with a ModuleNotFoundError. Imports inside functions (S3,
    django-celery-beat) belong to extras and are left out."""
    import ast
    from importlib import metadata

    providers = metadata.packages_distributions()
    installed = installed_closure(requirement_lines(setup_cfg()["options"]["install_requires"]))
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
