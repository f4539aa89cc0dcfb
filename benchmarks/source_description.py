"""Benchmark: answering ``/.well-known/resourcesync`` with 3 and with 100 sets, against serving
the same bytes as a static file through Django.

Run from the repository root::

    .venv/bin/python benchmarks/source_description.py                       # 3 and 100 sets
    .venv/bin/python benchmarks/source_description.py --sets 3,100,1000 --requests 2000
    .venv/bin/python benchmarks/source_description.py --database-url postgres://postgres:postgres@127.0.0.1:5432/bench_sd

It migrates a fresh database (SQLite in a temporary ``EXAMPLE_VAR_DIR``; with ``--database-url``
that PostgreSQL database, dropped and created again: give a throwaway name), deletes the
example's own sets and creates the benchmark's cheaply, as rows (not timed): each offers a
Resource List, a Change List, a Resource Dump and the Resource List Archive, and has a published
Resource List build and an open Change List, so that every set is listed and its Capability List
has something to say. The sets are added up to each size in turn.

At each size it sends, through Django's request handler with the example project's middleware
and URLconf, in alternating rounds so that both see the same machine:

- **ours**: ``GET /.well-known/resourcesync``, a plain GET (200), and the same with the
  ``If-None-Match`` of the answer (a client polling: 304);
- **static**: the same bytes, written once to a file, served by ``django.views.static.serve``
  (a plain GET, and one with ``If-Modified-Since``: 304). The floor that Django itself sets.

It prints, per size and kind of request, p50 and p95 in milliseconds of each, the ratio of the
p50s (ours / static), and the queries one request of ours makes (the same at every size is what
is wanted). Every answer of ours is checked to be the expected status and bytes. Nothing is
asserted; the target (issue 43) is a p50 of at most 10 ms for 3 sets.
"""

import argparse
import datetime
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _steps import recreate_database, setup_django_example

TARGET_MS = 10.0


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def add_sets(up_to):
    """Sets ``bench-<n>`` up to ``up_to`` of them, each with a published Resource List and an
    open Change List, inserted as rows."""
    from django.utils import timezone

    from django_resourcesync.models import Build, ChangeList, ResourceSet

    have = ResourceSet.objects.count()
    now = timezone.now() - datetime.timedelta(minutes=5)
    made = ResourceSet.objects.bulk_create([
        ResourceSet(name=f"Bench {n}", slug=f"bench-{n:05d}", source="bitstreams", position=n,
                    capabilities=["resourcelist", "changelist", "resourcedump", "resourcelist-archive"],
                    describedby=f"https://example.org/about/{n}")
        for n in range(have, up_to)
    ])
    made = list(ResourceSet.objects.filter(slug__in=[s.slug for s in made]))
    Build.objects.bulk_create([
        Build(resource_set=s, capability="resourcelist", status=Build.Status.PUBLISHED, at=now, completed=now,
              finished=now, entries=0, documents=1)
        for s in made
    ])
    ChangeList.objects.bulk_create([ChangeList(resource_set=s, number=1, from_time=now, last_datetime=now) for s in made])


def measure(handler, factory, path, headers, rounds, requests, expect):
    """Latencies in ms of ``requests`` GETs of ``path`` (per round); checks each answer."""
    times = []
    for _ in range(requests):
        request = factory.get(path, headers=headers)
        started = time.perf_counter()
        response = handler.get_response(request)
        body = b"".join(response) if response.streaming else response.content
        times.append((time.perf_counter() - started) * 1000)
        expect(response, body)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="3,100", help="sizes, comma-separated (increasing)")
    parser.add_argument("--requests", type=int, default=1000, help="requests per contender, kind and size")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--database-url", help="a throwaway PostgreSQL database (dropped and created again)")
    options = parser.parse_args()
    sizes = [int(size) for size in options.sets.split(",")]

    var_dir = tempfile.mkdtemp(prefix="resourcesync-bench-sd-")
    if options.database_url:
        recreate_database(options.database_url)
    setup_django_example(var_dir, options.database_url)

    from django.conf import settings
    from django.core.handlers.base import BaseHandler
    from django.core.management import call_command
    from django.db import connection
    from django.test import RequestFactory
    from django.test.utils import CaptureQueriesContext
    from django.urls import include, path, set_urlconf
    from django.utils import timezone
    from django.views.static import serve

    call_command("migrate", verbosity=0, interactive=False)
    from django_resourcesync.models import ResourceSet

    ResourceSet.objects.all().delete()  # the example's own sets (made by a migration): only the benchmark's
    static_dir = Path(var_dir) / "static-copy"
    static_dir.mkdir()

    class URLConf:
        urlpatterns = [
            path("static-copy/<path:path>", serve, {"document_root": str(static_dir)}),
            path("", include("example_project.urls")),
        ]

    settings.ROOT_URLCONF = URLConf
    set_urlconf(URLConf)
    settings.DEBUG = False
    handler = BaseHandler()
    handler.load_middleware()
    factory = RequestFactory(SERVER_NAME="127.0.0.1", SERVER_PORT="8000")
    # A live document has a Last-Modified once the second of its last change is over.
    time.sleep(1.1)
    print(f"database: {connection.vendor}; {options.requests} requests per line, {options.rounds} rounds; "
          f"{timezone.now():%Y-%m-%d %H:%M}Z")
    print(f"{'sets':>5}  {'request':<20} {'ours p50':>9} {'p95':>7}   {'static p50':>10} {'p95':>7}   "
          f"{'ratio':>6}  {'queries':>7}")
    for size in sizes:
        add_sets(size)
        time.sleep(1.1)
        first = handler.get_response(factory.get("/.well-known/resourcesync"))
        assert first.status_code == 200, first.status_code
        body, etag = first.content, first["ETag"]
        assert body.count(b"<url>") == size, body[:400]
        (static_dir / "description.xml").write_bytes(body)
        static = handler.get_response(factory.get("/static-copy/description.xml"))
        stamp = static["Last-Modified"]
        kinds = {
            "GET (200)": (("/.well-known/resourcesync", {}, 200), ("/static-copy/description.xml", {}, 200)),
            "conditional (304)": (("/.well-known/resourcesync", {"If-None-Match": etag}, 304),
                                  ("/static-copy/description.xml", {"If-Modified-Since": stamp}, 304)),
        }
        for kind, contenders in kinds.items():
            ours_path, ours_headers, ours_status = contenders[0]

            def expect_ours(response, got, status=ours_status):
                assert response.status_code == status, response.status_code
                assert status == 304 or got == body

            def expect_static(response, got, status=contenders[1][2]):
                assert response.status_code == status, response.status_code
                assert status == 304 or got == body

            with CaptureQueriesContext(connection) as queries:
                handler.get_response(factory.get(ours_path, headers=ours_headers))
            ours, floor = [], []
            per_round = max(1, options.requests // options.rounds)
            for _ in range(options.rounds):
                ours += measure(handler, factory, ours_path, ours_headers, 1, per_round, expect_ours)
                floor += measure(handler, factory, contenders[1][0], contenders[1][1], 1, per_round, expect_static)
            p50, static_p50 = statistics.median(ours), statistics.median(floor)
            print(f"{size:>5}  {kind:<20} {p50:>7.2f}ms {percentile(ours, 0.95):>5.2f}ms   {static_p50:>8.2f}ms "
                  f"{percentile(floor, 0.95):>5.2f}ms   {p50 / static_p50:>5.1f}x  {len(queries):>7}")
    print(f"target: a p50 of at most {TARGET_MS:.0f} ms for 3 sets")
    if options.database_url:
        connection.close()
        recreate_database(options.database_url, create=False)


if __name__ == "__main__":
    sys.exit(main())
