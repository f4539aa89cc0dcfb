import time

from django.core.management.base import BaseCommand, CommandError

from ...capabilities import CAPABILITY_CHOICES
from ...models import ResourceSet
from ...progress import ProgressBar
from ...rebuild import rebuild_set
from ...sources import NotRegistered


class Command(BaseCommand):
    help = "Reconcile resource sets with the site and rebuild their ResourceSync documents."

    def add_arguments(self, parser):
        parser.add_argument("--set", dest="sets", action="append", metavar="SLUG", help="Only this set (repeatable).")
        parser.add_argument(
            "--only",
            metavar="CAPABILITIES",
            help=f"Comma-separated capabilities to build: {', '.join(c for c, _ in CAPABILITY_CHOICES)}.",
        )
        parser.add_argument("--batch-size", type=int, help="Rows per database round trip.")
        parser.add_argument("--async", dest="run_async", action="store_true", help="Enqueue the builds on Celery workers and print the task ids.")

    def handle(self, *args, sets=None, only=None, batch_size=None, run_async=False, verbosity=1, **options):
        known = {c for c, _ in CAPABILITY_CHOICES}
        only = [c.strip() for c in only.split(",") if c.strip()] if only else None
        if only and not set(only) <= known:
            raise CommandError(f"Unknown capability in --only: {', '.join(sorted(set(only) - known))}. Known: {', '.join(sorted(known))}.")
        queryset = ResourceSet.objects.filter(enabled=True)
        if sets:
            queryset = ResourceSet.objects.filter(slug__in=sets)
            missing = set(sets) - set(queryset.values_list("slug", flat=True))
            if missing:
                raise CommandError(f"No resource set with slug: {', '.join(sorted(missing))}.")
        if batch_size is not None and batch_size < 1:
            raise CommandError("--batch-size must be positive.")
        if run_async:
            from ...tasks import rebuild_set_task

            for resource_set in queryset:
                result = rebuild_set_task.delay(resource_set.pk, only)
                self.stdout.write(f"{resource_set.slug}: task {result.id}")
            return
        started = time.monotonic()
        progress = ProgressBar(self.stderr) if verbosity >= 1 else None
        builds, failures = [], 0
        for resource_set in queryset:
            try:
                done = rebuild_set(resource_set, only=only, progress=progress, batch_size=batch_size)
            except NotRegistered:
                failures += 1
                self.stderr.write(f"{resource_set.slug}: source {resource_set.source!r} is not registered; skipped.")
                continue
            except Exception as exc:  # the build is recorded as failed; the old documents stay
                failures += 1
                if progress:
                    progress.end()
                self.stderr.write(f"{resource_set.slug}: build failed: {exc}")
                continue
            if progress:
                progress.end()
            builds += done
            if verbosity >= 2:
                for build in done:
                    self.stdout.write(f"{resource_set.slug}: {build.capability} build {build.pk}, {build.entries} entries, {build.documents} documents")
        entries = sum(b.entries for b in builds)
        self.stdout.write(
            f"Rebuilt {len(builds)} document(s) for {queryset.count()} set(s): {entries} entries in {time.monotonic() - started:.1f}s"
            + (f"; {failures} failed" if failures else "")
        )
        if failures:
            raise CommandError(f"{failures} set(s) failed to build.")
