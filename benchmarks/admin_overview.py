"""Benchmark: the admin's list of resource sets (what each set publishes, its change activity),
against the same page of a plain ``ModelAdmin`` of the same model and rows.

Run from the repository root::

    .venv/bin/python benchmarks/admin_overview.py                        # 20 sets, 300 requests each
    .venv/bin/python benchmarks/admin_overview.py --sets 3,20 --requests 500
    .venv/bin/python benchmarks/admin_overview.py --profile              # plus cProfile of ours, top 25
    .venv/bin/python benchmarks/admin_overview.py --database-url postgres://postgres:postgres@127.0.0.1:5432/bench_admin

Setup (not timed): a fresh database (SQLite in a temporary ``EXAMPLE_VAR_DIR``; with
``--database-url`` that PostgreSQL database, dropped and created again: give a throwaway name),
migrated; the example's own sets deleted; ``--items`` items with their files (64 bytes each).
Then sets up to each size in turn, half over the ``metadata`` source (Resource List, Change List,
Resource List Archive) and half over ``bitstreams`` (the same plus Resource Dump and Change
Dump; every third also a Change Notification channel), each rebuilt for real by ``rebuild_set``
(published builds, documents, packages). Then, as rows: 40 change events a set spread over the
last five days in its open Change List, left-out objects for every fourth set, an audit report
for every other set (one with problems), a failed Resource List build after the published one
for one set.

Measured, with a logged-in superuser through Django's test ``Client`` (the example project's
middleware, sessions and URLconf), in alternating rounds so that both see the same machine:

- **ours**: ``GET /admin/resourcesync/resourceset/``, the app's ``ResourceSetAdmin``;
- **plain**: the same model's list on a second admin site, a ``ModelAdmin`` with
  ``list_display = ["name"]`` (the same rows, the same search box and actions menu, none of the
  app's columns): what Django's admin costs for that page by itself.

Printed per size: p50 and p95 in milliseconds of each, the ratio of the p50s (ours / plain), the
queries one request of each makes (the same number at every size is what is wanted) and the
median CPU time of a request of each (the process's; what a busy machine changes least). Each
answer is checked (200, one row a set). Nothing is asserted; the target (issue 44) is a p50 of at
most 100 ms for 20 sets.
"""

import argparse
import cProfile
import datetime
import io
import pstats
import statistics
import sys
import tempfile
import time

from _steps import recreate_database, setup_django_example

TARGET_MS = 100.0


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def add_sets(up_to):
    """Sets ``bench-<n>`` up to ``up_to`` of them, rebuilt, with their change activity and the
    rest of what the list shows."""
    from django.utils import timezone

    from django_resourcesync.models import AuditReport, Build, ChangeEvent, ChangeList, LeftOut, ResourceSet
    from django_resourcesync.rebuild import rebuild_set

    have = ResourceSet.objects.count()
    now = timezone.now()
    for n in range(have, up_to):
        files = n % 2 == 1
        capabilities = ["resourcelist", "changelist", "resourcelist-archive"]
        if files:
            capabilities += ["resourcedump", "changedump"]
        if n % 3 == 0:
            capabilities.append("change-notification")
        resource_set = ResourceSet.objects.create(
            name=f"Bench {n}", slug=f"bench-{n:03d}", source="bitstreams" if files else "metadata", position=n,
            capabilities=capabilities,
        )
        rebuild_set(resource_set)
        changelist = ChangeList.objects.filter(resource_set=resource_set, until__isnull=True).first()
        if changelist is None:
            changelist = ChangeList.objects.create(
                resource_set=resource_set, number=1, from_time=now - datetime.timedelta(days=6)
            )
        else:
            ChangeList.objects.filter(pk=changelist.pk).update(from_time=now - datetime.timedelta(days=6))
        ChangeEvent.objects.bulk_create([
            ChangeEvent(
                resource_set=resource_set, changelist=changelist, object_pk=str(k), uri=f"https://example.org/bench/{n}/{k}",
                change=("created", "updated", "deleted")[k % 3], datetime=now - datetime.timedelta(hours=3 * k + 1),
                entry_xml="<url/>",
            )
            for k in range(40)
        ])
        if n % 4 == 0:
            LeftOut.objects.bulk_create([
                LeftOut(resource_set=resource_set, object_pk=f"x{k}", reason="ValueError: no title") for k in range(3)
            ])
        if n % 2 == 0:
            AuditReport.objects.create(
                resource_set=resource_set, base="http://testserver", documents=3, resources=10,
                problems=[["https://example.org/x", "answers 404"]] if n == 2 else [],
            )
        if n == 1:
            Build.objects.create(
                resource_set=resource_set, capability="resourcelist", status=Build.Status.FAILED, at=now, finished=now,
                error="Traceback (most recent call last):\nOSError: [Errno 28] No space left on device",
            )


def fresh_site(database_url, items):
    """The example project on a fresh database, migrated, without its own sets, with ``items``
    items and their files."""
    if database_url:
        recreate_database(database_url)
    setup_django_example(tempfile.mkdtemp(prefix="resourcesync-bench-admin-"), database_url)
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    from django_resourcesync.models import ResourceSet
    from example_project.repository.management.commands import seed_repository

    ResourceSet.objects.all().delete()  # the example's own sets (made by a migration): only the benchmark's
    seed_repository.add_items(items, file_size=64, track=False)


def measure(client, path, requests, expect):
    """Latencies and CPU times in ms of ``requests`` GETs of ``path``; checks each answer."""
    times, cpu = [], []
    for _ in range(requests):
        started, started_cpu = time.perf_counter(), time.process_time()
        response = client.get(path)
        times.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
        expect(response)
    return times, cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="20", help="sizes, comma-separated (increasing)")
    parser.add_argument("--items", type=int, default=60, help="items of the repository (each set lists them)")
    parser.add_argument("--requests", type=int, default=300, help="requests per contender and size")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="cProfile 50 requests of ours at the last size")
    parser.add_argument("--database-url", help="a throwaway PostgreSQL database (dropped and created again)")
    options = parser.parse_args()
    sizes = [int(size) for size in options.sets.split(",")]

    fresh_site(options.database_url, options.items)

    from django.conf import settings
    from django.contrib import admin
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment
    from django.urls import include, path, set_urlconf
    from django.utils import timezone

    from django_resourcesync.admin import NumbersInRange
    from django_resourcesync.models import ResourceSet

    plain_site = admin.AdminSite(name="plain")

    class PlainAdmin(NumbersInRange, admin.ModelAdmin):
        list_display = ["name"]
        search_fields = ["name", "slug"]
        actions = ["delete_selected"]

    plain_site.register(ResourceSet, PlainAdmin)

    class URLConf:
        urlpatterns = [path("plain-admin/", plain_site.urls), path("", include("example_project.urls"))]

    settings.ROOT_URLCONF = URLConf
    set_urlconf(URLConf)
    settings.DEBUG = False
    setup_test_environment(debug=False)  # the test client's response.context
    client = Client(SERVER_NAME="127.0.0.1")
    client.force_login(User.objects.create_superuser("bench", "bench@example.org", "pw"))
    ours_path, plain_path = "/admin/resourcesync/resourceset/", "/plain-admin/resourcesync/resourceset/"

    print(f"database: {connection.vendor}; {options.items} items; {options.requests} requests per line, "
          f"{options.rounds} rounds; {timezone.now():%Y-%m-%d %H:%M}Z")
    print(f"{'sets':>5}  {'ours p50':>9} {'p95':>8}   {'plain p50':>9} {'p95':>7}   {'ratio':>6}  {'queries':>13}")
    for size in sizes:
        started = time.perf_counter()
        add_sets(size)
        setup_seconds = time.perf_counter() - started

        def expect(response, size=size):
            assert response.status_code == 200, response.status_code
            assert response.context["cl"].result_count == size, response.context["cl"].result_count

        queries = {}
        for name, url in (("ours", ours_path), ("plain", plain_path)):
            client.get(url)  # warm: templates loaded, URLs resolved
            with CaptureQueriesContext(connection) as captured:
                expect(client.get(url))
            queries[name] = len(captured)
        ours, plain, ours_cpu, plain_cpu = [], [], [], []
        per_round = max(1, options.requests // options.rounds)
        for _ in range(options.rounds):
            for times, cpu, url in ((ours, ours_cpu, ours_path), (plain, plain_cpu, plain_path)):
                got = measure(client, url, per_round, expect)
                times += got[0]
                cpu += got[1]
        p50, plain_p50 = statistics.median(ours), statistics.median(plain)
        cpu, plain_cpu = statistics.median(ours_cpu), statistics.median(plain_cpu)
        print(f"{size:>5}  {p50:>7.1f}ms {percentile(ours, 0.95):>6.1f}ms   {plain_p50:>7.1f}ms "
              f"{percentile(plain, 0.95):>5.1f}ms   {p50 / plain_p50:>5.2f}x  {queries['ours']:>5} / {queries['plain']:<5}"
              f"  CPU p50 {cpu:.1f} / {plain_cpu:.1f} ms  (setup {setup_seconds:.1f} s)")
    print(f"target: a p50 of at most {TARGET_MS:.0f} ms for 20 sets; queries and CPU: ours / plain, one request")

    if options.profile:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(50):
            client.get(ours_path)
        profile.disable()
        for key in ("cumulative", "tottime"):
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats(key).print_stats(25)
            print(f"\n--- cProfile of 50 requests of ours, by {key} ---")
            print(out.getvalue())
    if options.database_url:
        connection.close()
        recreate_database(options.database_url, create=False)


if __name__ == "__main__":
    sys.exit(main())
