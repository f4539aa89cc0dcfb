"""The documentation's "Your first site" page (docs/first_site.rst), run as a site owner runs it.

Every snippet of that page is a file of ``docs/first_site/``: the settings, URLs, model, view,
admin and source are copied into a project made by ``django-admin startproject``, and the
commands are run as written, in order, with the app installed from a wheel (built here from the
checkout, unless it is installed from one already) and no Celery app. The server is a real
``runserver`` on a free port. Everything lives in temporary folders.
"""

import contextlib
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from http.cookiejar import CookieJar
from importlib import metadata
from pathlib import Path

import pytest

import django_resourcesync

from .helpers import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "first_site"
#: The address the page's snippets use; the test's server runs elsewhere, named by SITE_URL.
DOCUMENTED = "http://127.0.0.1:8000"
#: What the project is made of besides what startproject writes: the page's files, and where each goes.
PROJECT_FILES = {
    "urls.py": "mysite/urls.py",
    "library/models.py": "library/models.py",
    "library/views.py": "library/views.py",
    "library/admin.py": "library/admin.py",
    "library/resourcesync.py": "library/resourcesync.py",
}
#: Files the checkout builds the wheel from.
BUILD_FILES = ("setup.cfg", "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "CHANGELOG.md")
NS = {"sm": "http://www.sitemaps.org/schemas/sitemap/0.9", "rs": "http://www.openarchives.org/rs/terms/"}
ADMIN = ("admin", "admin@example.org", "a long pass phrase, 7 words")


def installed_from_a_wheel():
    """Whether the app imported here is an installed distribution, not the checkout or an
    editable install of it (whose ``direct_url.json`` says ``editable``)."""
    if Path(django_resourcesync.__file__).resolve().parent == ROOT / "django_resourcesync":
        return False
    try:
        direct_url = metadata.distribution("django-resourcesync").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return False
    return not (direct_url and json.loads(direct_url).get("dir_info", {}).get("editable"))


def install_the_wheel(tmp):
    """``(folder to put first on PYTHONPATH or None, folder the app is imported from)``."""
    if installed_from_a_wheel():
        return None, Path(django_resourcesync.__file__).resolve().parent
    source = tmp / "checkout"
    shutil.copytree(ROOT / "django_resourcesync", source / "django_resourcesync",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in BUILD_FILES:
        shutil.copy2(ROOT / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp / "dist")],
        cwd=source, capture_output=True, text=True,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("*.whl")
    site = tmp / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        capture_output=True, text=True,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return site, site / "django_resourcesync"


def script(name):
    """A snippet of the page that is a list of commands, as the page shows it."""
    return (DOCS / name).read_text()


class Site:
    """The project of the page, and how to run its commands."""

    def __init__(self, tmp, python_path, base):
        self.tmp, self.base = tmp, base
        self.work = tmp / "work"
        self.project = self.work / "mysite"
        self.work.mkdir()
        # `python` is this interpreter, whose environment has the app's dependencies; the
        # venv's django-admin comes next.
        tools = tmp / "bin"
        tools.mkdir()
        (tools / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (tools / "python").chmod(0o755)
        self.env = {
            "PATH": os.pathsep.join([str(tools), str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
            "HOME": str(tmp),
            "LANG": "C.UTF-8",
            "SITE_URL": base,
        }
        if python_path:
            self.env["PYTHONPATH"] = str(python_path)

    def run(self, name, cwd=None):
        """Run the page's commands ``name`` in bash, stopping at the first that fails: ``(exit
        code, what they printed)``."""
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", str(DOCS / name)], cwd=cwd or self.project, env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
        )
        return done.returncode, done.stdout

    def ok(self, name, cwd=None):
        code, output = self.run(name, cwd)
        assert code == 0, f"{name} failed:\n{output}"
        return output

    def in_a_terminal(self, name, answers):
        """Run the page's commands ``name`` in a terminal of their own, typing each reply of
        ``answers``, ``[(prompt, reply)]``, when its prompt shows: what they printed."""
        pid, terminal = pty.fork()
        if pid == 0:  # the child: run the commands, nothing else
            try:
                os.chdir(self.project)
                os.execve("/bin/bash", ["bash", "-e", str(DOCS / name)], self.env)
            finally:
                os._exit(127)
        output, seen, answers = b"", 0, list(answers)
        try:
            while True:
                ready, _, _ = select.select([terminal], [], [], 120)
                assert ready, f"{name} stopped answering:\n{output.decode(errors='replace')}"
                try:
                    chunk = os.read(terminal, 4096)
                except OSError:  # the terminal closed: the commands are done
                    break
                if not chunk:
                    break
                output += chunk
                if answers and answers[0][0].encode() in output[seen:]:
                    os.write(terminal, answers.pop(0)[1].encode() + b"\n")
                    seen = len(output)
        finally:
            _, status = os.waitpid(pid, 0)
            os.close(terminal)
        text = output.decode(errors="replace")
        assert os.waitstatus_to_exitcode(status) == 0 and not answers, f"{name}:\n{text}"
        return text

    def local(self, url):
        """A URL of the page, on the test's server."""
        assert url.startswith(DOCUMENTED), url
        return self.base + url[len(DOCUMENTED):]


def get(url, opener=None):
    with (opener or urllib.request.build_opener()).open(url, timeout=60) as response:
        return response.status, response.read().decode(), response.headers


def changes(xml, base):
    """``[(path, change)]`` of a Change List's entries, in its order."""
    root = ET.fromstring(xml)
    return [
        (url.find("sm:loc", NS).text.removeprefix(base), url.find("rs:md", NS).get("change"))
        for url in root.findall("sm:url", NS)
    ]


@pytest.fixture(scope="module")
def first_site(tmp_path_factory):
    """The page followed step by step, up to its server running; what each step printed."""
    tmp = tmp_path_factory.mktemp("first-site")
    python_path, app = install_the_wheel(tmp)
    port = free_port()
    site = Site(tmp, python_path, f"http://127.0.0.1:{port}")
    site.app = app
    out = site.outputs = {}

    # pip install: the wheel stands in for the registry; the page names the distribution it is of.
    assert script("install.sh").split() == ["pip", "install", metadata.metadata("django-resourcesync")["Name"]]
    site.ok("start.sh", cwd=site.work)
    with open(site.project / "mysite" / "settings.py", "a") as settings:
        settings.write("\n\n" + script("settings.py"))
    for name, target in PROJECT_FILES.items():
        shutil.copy2(DOCS / name, site.project / target)

    site.ok("migrate.sh")
    out["check"] = site.run("check.sh")
    out["admin"] = site.in_a_terminal("admin.sh", [
        ("Username", ADMIN[0]), ("Email address", ADMIN[1]), ("Password:", ADMIN[2]), ("Password (again)", ADMIN[2]),
    ])
    out["documents"] = site.ok("documents.sh")
    out["create_set"] = site.ok("create_set.sh")
    out["rebuild"] = site.ok("rebuild.sh")

    assert script("serve.sh").split() == ["python", "manage.py", "runserver"]
    log = open(tmp / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=site.project, env=site.env, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        while True:  # until it answers (or has stopped)
            try:
                get(f"{site.base}/.well-known/resourcesync")
                break
            except OSError:
                assert server.poll() is None, (tmp / "server.log").read_text()
                time.sleep(0.2)
        out["audit"] = site.run("audit.sh")
        out["changes"] = site.ok("changes.sh")
        yield site
    finally:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=30)
        server.kill()  # a no-op once it has ended
        server.wait()
        log.close()


def test_the_app_runs_from_the_wheel_not_from_the_checkout(first_site):
    done = subprocess.run(
        [sys.executable, "-c", "import django_resourcesync; print(django_resourcesync.__file__)"],
        cwd=first_site.project, env=first_site.env, capture_output=True, text=True, check=True,
    )
    imported = Path(done.stdout.strip()).resolve()
    assert imported.parent == first_site.app.resolve()
    assert ROOT not in imported.parents


def test_the_project_has_no_celery_app(first_site):
    assert not list(first_site.project.rglob("celery.py"))
    assert "celery" not in (first_site.project / "mysite" / "settings.py").read_text().lower()


def test_check_passes_and_says_the_tasks_run_embedded(first_site):
    """No error, no warning (W010 was the REST API's apps missing); I001 as the page shows it."""
    code, output = first_site.outputs["check"]
    assert code == 0, output
    assert "resourcesync.I001" in output and "embedded" in output
    assert "WARNINGS" not in output and "ERRORS" not in output
    assert output.strip() == script("check.txt").strip()


def test_the_admin_user_logs_in_and_the_set_form_ticks_the_resource_list(first_site):
    jar = urllib.request.HTTPCookieProcessor(CookieJar())
    browser = urllib.request.build_opener(jar)
    _, page, _ = get(f"{first_site.base}/admin/login/", browser)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    form = {"csrfmiddlewaretoken": token, "username": ADMIN[0], "password": ADMIN[2], "next": "/admin/"}
    with browser.open(f"{first_site.base}/admin/login/", urllib.parse.urlencode(form).encode(), timeout=60) as answer:
        assert answer.url.endswith("/admin/"), answer.url
    _, page, _ = get(f"{first_site.base}/admin/resourcesync/resourceset/add/", browser)
    ticked = set(re.findall(r'<input type="checkbox" name="capabilities" value="(\w+)"[^>]*\bchecked\b', page))
    assert ticked == {"resourcelist"}
    _, page, _ = get(f"{first_site.base}/admin/library/document/", browser)
    assert "Annual report" in page
    _, page, _ = get(f"{first_site.base}/admin/resourcesync/resourceset/", browser)
    assert "embedded" in page and "Documents" in page


def test_the_rebuild_publishes_the_public_documents(first_site):
    (made,) = [line for line in first_site.outputs["rebuild"].splitlines() if line.startswith("Built ")]
    assert re.sub(r"\d+\.\ds$", "0.1s", made) == script("rebuild.txt").strip()


def test_the_documented_urls_answer(first_site):
    urls = [line.split()[-1] for line in script("fetch.sh").splitlines() if line.strip()]
    assert urls and all(line.startswith("curl ") for line in script("fetch.sh").splitlines() if line.strip())
    for url in urls:
        status, body, headers = get(first_site.local(url))
        assert status == 200 and headers["Content-Type"].startswith("application/xml"), url
        assert "<urlset" in body or "<sitemapindex" in body
    _, description, _ = get(f"{first_site.base}/.well-known/resourcesync")
    assert f"<loc>{first_site.base}/resourcesync/documents/capabilitylist.xml</loc>" in description


def test_a_published_document_links_to_its_set(first_site):
    status, body, headers = get(f"{first_site.base}/documents/2.txt")
    assert status == 200
    assert f'<{first_site.base}/resourcesync/documents/capabilitylist.xml>; rel="resourcesync"' in headers["Link"]


def test_the_audit_of_the_published_source_passes(first_site):
    code, output = first_site.outputs["audit"]
    assert code == 0, output
    (summary,) = [line for line in output.splitlines() if " checked at " in line]
    assert summary.replace(first_site.base, DOCUMENTED) == script("audit.txt").strip()


def test_the_changes_are_in_the_change_list_with_no_celery(first_site):
    """Made by a script that exits at once: the app processed them on its thread before the
    process ended, and the running server serves them."""
    status, body, _ = get(f"{first_site.base}/resourcesync/documents/changelist.xml")
    assert status == 200
    found = changes(body, first_site.base)
    documented = changes((DOCS / "changelist.xml").read_text(), DOCUMENTED)
    # The same changes; their order is the change log's own concern (tests/test_changes.py).
    assert sorted(found) == sorted(documented)
    assert {change for _, change in found} == {"created", "updated", "deleted"}


def test_the_audit_passes_after_the_changes_too(first_site):
    """As a Destination takes them: the Resource List, then the Change List's entries after it."""
    code, output = first_site.run("audit.sh")
    assert code == 0, output
