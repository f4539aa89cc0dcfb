#!/usr/bin/env python3
"""Set up and run the project with nothing but python3 on the machine.

    python3 dev.py demo     # virtualenv, install, database, sample data, documents, server on :8000
    python3 dev.py test     # virtualenv, install, services, the whole test suite (and the docs)

``test`` runs the linter (ruff) and builds the docs, then runs the suite twice: on the embedded
defaults (SQLite, files, tasks in process), then on the production stack: PostgreSQL, a real
Celery worker fed by Redis, documents in S3 (a local S3 endpoint, moto's server mode, started from
the virtualenv for the run and stopped after it). Where PostgreSQL or Redis are not running it
starts them, installing them from the system's packages first if they are missing (this needs root
and apt-get). ``python3 dev.py test --embedded-only`` runs only the first half and needs no
service. Arguments after ``--`` go to pytest.
"""

import argparse
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PYTHON = VENV / "bin" / "python"
PG_URL = os.environ.get("TEST_DATABASE_URL", "postgres://postgres:postgres@127.0.0.1:5432/resourcesync")
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
S3_URL = os.environ.get("TEST_S3_ENDPOINT_URL", "")
PRODUCTION_VARIABLES = (
    "TEST_DATABASE_URL", "TEST_S3_ENDPOINT_URL", "DATABASE_URL", "CELERY_BROKER_URL",
    "AWS_STORAGE_BUCKET_NAME", "AWS_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
)


def say(message):
    print(f"[dev] {message}", flush=True)


def run(*command, env=None, check=True, **kwargs):
    return subprocess.run([str(c) for c in command], cwd=ROOT, env=env, check=check, **kwargs)


def apt_install(*packages):
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        sys.exit(
            f"[dev] {', '.join(packages)} needed: install them (as root: apt-get install {' '.join(packages)}) and try again."
        )
    say(f"installing {' '.join(packages)} from the system's packages")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run("apt-get", "update", "-q", env=env, stdout=subprocess.DEVNULL)
    run("apt-get", "install", "-y", "-q", "--no-install-recommends", *packages, env=env, stdout=subprocess.DEVNULL)


def ensure_virtualenv():
    if not PYTHON.exists():
        say("creating the virtualenv .venv")
        if run(sys.executable, "-m", "venv", VENV, check=False).returncode != 0:
            shutil.rmtree(VENV, ignore_errors=True)
            version = f"{sys.version_info.major}.{sys.version_info.minor}"
            apt_install(f"python{version}-venv")
            run(sys.executable, "-m", "venv", VENV)
    stamp = VENV / ".installed"
    wanted = hashlib.sha256((ROOT / "setup.cfg").read_bytes()).hexdigest()
    if not stamp.exists() or stamp.read_text() != wanted:
        say("installing the project and its development dependencies")
        run(PYTHON, "-m", "pip", "install", "-q", "--upgrade", "pip")
        run(PYTHON, "-m", "pip", "install", "-q", "-e", ".[dev]")
        stamp.write_text(wanted)


def port_open(port, host="127.0.0.1"):
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def wait_for_port(port, what, seconds=60, process=None):
    deadline = time.monotonic() + seconds
    while not port_open(port):
        if time.monotonic() > deadline or (process is not None and process.poll() is not None):
            sys.exit(f"[dev] {what} did not start on port {port}")
        time.sleep(0.5)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_postgresql():
    if port_open(5432):
        return
    if not shutil.which("pg_ctlcluster"):
        apt_install("postgresql")
    clusters = sorted(Path("/etc/postgresql").glob("*/main"))
    if not clusters:
        sys.exit("[dev] PostgreSQL is installed but has no 'main' cluster: create one with pg_createcluster.")
    version = clusters[-1].parent.name
    say(f"starting PostgreSQL {version}")
    run("pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start", check=False)
    wait_for_port(5432, "PostgreSQL")
    # A fresh installation asks for a password on TCP connections: give the test user one.
    run("su", "postgres", "-c", "psql -q -c \"ALTER USER postgres PASSWORD 'postgres'\"", check=False, stdout=subprocess.DEVNULL)


def ensure_redis():
    if port_open(6379):
        return
    if not shutil.which("redis-server"):
        apt_install("redis-server")
        time.sleep(1)  # the package's own start, where the system runs one
        if port_open(6379):
            return
    say("starting Redis")
    run("redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "--port", "6379", "--save", "", "--appendonly", "no")
    wait_for_port(6379, "Redis")


def ensure_browser():
    """Debian's chromium and its driver, for the tests of what a person looks at (admin pages,
    readable documents); installed as root where missing, else those tests are skipped."""
    if shutil.which("chromium") and shutil.which("chromedriver"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        say("chromium and chromedriver are missing (as root: apt-get install chromium chromium-driver): browser tests skipped")
        return
    apt_install("chromium", "chromium-driver", "fonts-dejavu-core")


def demo(args):
    if port_open(args.port):
        sys.exit(f"[dev] port {args.port} is taken: stop what runs there, or choose another with --port")
    ensure_virtualenv()
    env = {k: v for k, v in os.environ.items() if k not in PRODUCTION_VARIABLES}
    env["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    env.setdefault("RESOURCESYNC_BASE_URL", f"http://127.0.0.1:{args.port}")
    base = env["RESOURCESYNC_BASE_URL"]
    manage = [PYTHON, "manage.py"]
    run(*manage, "migrate", "--no-input", "-v0", env=env)
    has_items = run(
        *manage, "shell", "-c", "from example_project.repository.models import Item; print(Item.objects.exists())",
        env=env, capture_output=True, text=True,
    ).stdout.strip().endswith("True")
    if not has_items:
        run(*manage, "seed_repository", "--items", args.items, env=env)
    login = run(*manage, "prepare_demo", "--base-url", base, env=env, capture_output=True, text=True).stdout.strip()
    run(*manage, "resourcesync_rebuild", env=env)
    say(f"the demo Source: {base}/.well-known/resourcesync")
    for line in login.splitlines():
        say(line)
    say("Ctrl-C stops it")
    try:
        # --insecure: the admin's styles and scripts are served with DEBUG off, as in the demo.
        server = run(*manage, "runserver", f"127.0.0.1:{args.port}", "--insecure", "--noreload", env=env, check=False)
    except KeyboardInterrupt:
        return
    sys.exit(server.returncode)


class S3Endpoint:
    """A local S3 endpoint for the run: moto's server mode, from the virtualenv."""

    def __init__(self):
        self.process = None
        self.url = S3_URL

    def __enter__(self):
        if not self.url:
            port = free_port()
            say(f"starting a local S3 endpoint on port {port}")
            self.process = subprocess.Popen(
                [PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            wait_for_port(port, "the S3 endpoint", process=self.process)
            self.url = f"http://127.0.0.1:{port}"
        return self.url

    def __exit__(self, *exc):
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def timed(what, *command, env, cwd=ROOT):
    say(what)
    started = time.monotonic()
    code = subprocess.run([str(c) for c in command], cwd=cwd, env=env, check=False).returncode
    say(f"{what}: {'passed' if code == 0 else f'FAILED (exit {code})'} in {time.monotonic() - started:.0f}s")
    return code


NEWEST_PYTHON, NEWEST_DJANGO = "3.13", "Django>=6.1,<6.2"
# What the suite needs of the checkout besides the package (which comes from the wheel).
SUITE_FILES = ("tests", "example_project", "docs", "manage.py", "dev.py", "setup.cfg", "pyproject.toml", "tox.ini", "README.md")


def find_python(version):
    """An interpreter of ``version`` that runs: on the PATH, or installed by pyenv (whose shim on
    the PATH may belong to a version not selected here); ``None`` if there is none."""
    candidates = [shutil.which(f"python{version}")]
    if shutil.which("pyenv"):
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip()
        candidates += sorted(Path(root).glob(f"versions/{version}*/bin/python{version}"), reverse=True) if root else []
    for candidate in filter(None, candidates):
        if subprocess.run([str(candidate), "-c", "import venv"], capture_output=True).returncode == 0:
            return str(candidate)
    return None


def wheel_suite(args, env):
    """The embedded suite on the newest Python and Django the package claims, with the package
    installed from a wheel built now into a fresh virtualenv (not imported from the checkout), the
    suite's files copied into a temporary folder with nothing beside them: a file or a dependency
    the wheel lacks (the official schemas too) fails there. Skipped, in one line, without that Python."""
    python = find_python(NEWEST_PYTHON)
    if python is None:
        say(f"no python{NEWEST_PYTHON} here: the suite from the wheel on Python {NEWEST_PYTHON} is not run")
        return 0
    with tempfile.TemporaryDirectory(prefix="resourcesync-wheel-") as folder:
        folder = Path(folder)
        say(f"building the wheel and installing it on Python {NEWEST_PYTHON} with {NEWEST_DJANGO}")
        run(PYTHON, "-m", "build", "--no-isolation", "--wheel", "--outdir", folder / "dist", env=env, stdout=subprocess.DEVNULL)
        (wheel,) = (folder / "dist").glob("*.whl")
        venv = folder / "venv"
        run(python, "-m", "venv", venv)
        installed = venv / "bin" / "python"
        run(installed, "-m", "pip", "install", "-q", "--upgrade", "pip", env=env)
        run(installed, "-m", "pip", "install", "-q", f"{wheel}[dev]", NEWEST_DJANGO, env=env)
        checkout = folder / "checkout"
        checkout.mkdir()
        for name in SUITE_FILES:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, checkout / name, ignore=shutil.ignore_patterns("__pycache__", "_build"))
            else:
                shutil.copy2(source, checkout / name)
        return timed(
            f"test suite from the wheel (Python {NEWEST_PYTHON}, {NEWEST_DJANGO}, embedded defaults)",
            installed, "-m", "pytest", "-p", "no:cacheprovider", *args.pytest_args,
            env=env, cwd=checkout,
        )


def test(args):
    ensure_virtualenv()
    pytest = [PYTHON, "-m", "pytest", *args.pytest_args]
    env = {k: v for k, v in os.environ.items() if k not in PRODUCTION_VARIABLES}
    say("lint: ruff check")
    run(PYTHON, "-m", "ruff", "check", ".", env=env)
    say("docs: sphinx-build -W")
    run(PYTHON, "-m", "sphinx", "-W", "-q", "-b", "html", "docs", "docs/_build/html", env=env)
    ensure_browser()
    embedded = timed("test suite, embedded defaults (SQLite, files, tasks in process)", *pytest, env=env)
    if args.embedded_only:
        sys.exit(embedded)
    embedded = wheel_suite(args, env) or embedded
    ensure_postgresql()
    ensure_redis()
    with S3Endpoint() as s3_url:
        production = timed(
            "test suite, production stack (PostgreSQL, a Celery worker on Redis, S3)", *pytest,
            env=dict(env, TEST_DATABASE_URL=PG_URL, TEST_REDIS_URL=REDIS_URL, TEST_S3_ENDPOINT_URL=s3_url),
        )
    sys.exit(embedded or production)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    demo_parser = commands.add_parser("demo", help="set up and run the demo Source")
    demo_parser.add_argument("--port", type=int, default=8000)
    demo_parser.add_argument("--items", type=int, default=200, help="items to seed into an empty database")
    demo_parser.set_defaults(func=demo)
    test_parser = commands.add_parser("test", help="set up and run the whole test suite")
    test_parser.add_argument("--embedded-only", action="store_true", help="only the half that needs no service")
    test_parser.add_argument("pytest_args", nargs="*", help="arguments for pytest (after --)")
    test_parser.set_defaults(func=test)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
