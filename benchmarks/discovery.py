"""Benchmark: the cost of the discovery Link header on a response, with 1,000,000 resources.

Run from the repository root::

    .venv/bin/python benchmarks/discovery.py                  # 1,000,000 resources
    .venv/bin/python benchmarks/discovery.py --size 100000 --requests 5000

It seeds a fresh SQLite database (in a temporary ``EXAMPLE_VAR_DIR``) with N ``Resource`` rows of
one set, as ``resourcelist_build.py`` does (not timed), then measures, in this process:

1. **the middleware alone**: ``ResourceSyncLinkMiddleware`` around a view that returns a small
   response at once, called with requests for random listed URIs; the time per response minus
   that of the bare view is the lookup's cost (target: under 0.5 ms a response);
2. **a whole request**: Django's request handler (the example project's middleware, a URLconf
   with one small view for every path) with and without ``ResourceSyncLinkMiddleware``, the
   requests alternating in rounds so that both see the same machine; it prints the ratio.

Every sampled response is checked to carry the Link header of its set. Nothing is asserted.
"""

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import resourcelist_build  # noqa: E402  (the seeding of N Resource rows)

TARGET_MS = 0.5


def timed(func, requests):
    started = time.perf_counter()
    for request in requests:
        func(request)
    return (time.perf_counter() - started) / len(requests)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=20_000, help="requests per contender and measure")
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()

    var_dir = tempfile.mkdtemp(prefix="resourcesync-bench-discovery-")
    seeded = resourcelist_build.child_seed(var_dir, options.size)
    print(f"seeded {seeded['rows']:,} resources in {seeded['seconds']:.1f}s (SQLite, {seeded['db']})")

    from django.conf import settings
    from django.core.handlers.base import BaseHandler
    from django.http import HttpResponse
    from django.test import RequestFactory
    from django.urls import include, path, re_path
    from django.utils import timezone

    from django_resourcesync import discovery
    from django_resourcesync.models import Build

    # As once its Resource List is published: a set links only when its Capability List lists something.
    Build.objects.create(
        resource_set_id=seeded["set_id"], capability="resourcelist", status=Build.Status.PUBLISHED, at=timezone.now()
    )

    rng = random.Random(7)
    factory = RequestFactory(SERVER_NAME="127.0.0.1", SERVER_PORT="8000")
    paths = [f"/items/{i}/files/{i}/file-{i}.pdf" for i in (rng.randrange(options.size) for _ in range(options.requests))]
    requests = [factory.get(path) for path in paths]
    expected = f'<{resourcelist_build.BASE_URL}/resourcesync/{resourcelist_build.SLUG}/capabilitylist.xml>; rel="resourcesync"'

    def view(request, *args, **kwargs):
        return HttpResponse(b"a resource's bytes", content_type="application/octet-stream")

    middleware = discovery.ResourceSyncLinkMiddleware(view)
    for request in requests[:200]:
        assert middleware(request).headers.get("Link") == expected
    bare, linked = [], []
    for _round in range(options.rounds):
        for request in requests:
            request._resourcesync_capability_lists = None  # each response looks its links up
        bare.append(timed(view, requests))
        linked.append(timed(middleware, requests))
    cost_ms = (statistics.median(linked) - statistics.median(bare)) * 1000
    print(f"middleware alone: {statistics.median(linked) * 1e6:.1f} us a response, the bare view "
          f"{statistics.median(bare) * 1e6:.1f} us: the lookup costs {cost_ms:.3f} ms a response "
          f"(target under {TARGET_MS} ms: {'met' if cost_ms < TARGET_MS else 'NOT met'})")

    # A whole request through Django's handler, with the example's middleware, with and without ours.
    class URLConf:
        urlpatterns = [path("", include("django_resourcesync.urls")), re_path(r"^.*$", view)]

    def handler(with_links):
        settings.ROOT_URLCONF = URLConf
        settings.MIDDLEWARE = [
            name for name in settings.MIDDLEWARE if with_links or "ResourceSyncLinkMiddleware" not in name
        ]
        made = BaseHandler()
        made.load_middleware()
        return made

    middleware_setting = list(settings.MIDDLEWARE)
    with_links = handler(True)
    settings.MIDDLEWARE = middleware_setting
    without = handler(False)
    settings.MIDDLEWARE = middleware_setting
    from django.urls import set_urlconf

    set_urlconf(URLConf)

    def through(made):
        def request_once(path):
            return made.get_response(factory.get(path))

        return request_once

    sample = through(with_links)(paths[0])
    assert sample.status_code == 200 and sample.headers.get("Link") == expected, (sample.status_code, sample.content[:300])
    count = min(len(paths), 5_000)
    full_with, full_without = [], []
    for _round in range(options.rounds):
        full_without.append(timed(through(without), paths[:count]))
        full_with.append(timed(through(with_links), paths[:count]))
    a, b = statistics.median(full_with), statistics.median(full_without)
    print(f"whole request: {a * 1000:.3f} ms with the Link header, {b * 1000:.3f} ms without: ratio {a / b:.2f}x, "
          f"{(a - b) * 1000:.3f} ms a response")
    print(f"(medians of {options.rounds} rounds; {len(requests):,} and {count:,} requests a round, random URIs of "
          f"{options.size:,} resources)")
    shutil.rmtree(var_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
