import time

from django.core.management.base import BaseCommand, CommandError

from ... import tracking
from ...models import ResourceSet
from ...progress import ProgressBar


class Command(BaseCommand):
    help = (
        "Compare resource sets with the site's data and record the changes that bypassed the signals "
        "(queryset.update(), bulk_create, raw SQL, data migrations)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--set", dest="sets", action="append", metavar="SLUG", help="Only this set (repeatable).")
        parser.add_argument("--batch-size", type=int, help="Objects per database round trip.")

    def handle(self, *args, sets=None, batch_size=None, verbosity=1, **options):
        if batch_size is not None and batch_size < 1:
            raise CommandError("--batch-size must be positive.")
        queryset = ResourceSet.objects.all() if sets else ResourceSet.objects.filter(enabled=True)
        if sets:
            queryset = queryset.filter(slug__in=sets)
            missing = set(sets) - set(queryset.values_list("slug", flat=True))
            if missing:
                raise CommandError(f"No resource set with slug: {', '.join(sorted(missing))}.")
        started = time.monotonic()
        progress = ProgressBar(self.stderr) if verbosity >= 1 else None
        pending = tracking.process_pending(sorted({s.source for s in queryset}), batch_size=batch_size)
        if verbosity >= 2:
            self.stdout.write(f"pending changes: {pending}")
        failed = []
        for resource_set in queryset:
            try:
                counts = tracking.reconcile(resource_set, batch_size=batch_size, progress=progress)
            except Exception as exc:  # one broken set (an unregistered source, say) does not stop the others
                failed.append(resource_set.slug)
                self.stderr.write(f"{resource_set.slug}: reconcile failed: {exc}")
                continue
            finally:
                if progress:
                    progress.end()
            self.stdout.write(f"{resource_set.slug}: {counts}")
        self.stdout.write(
            f"Reconciled {queryset.count() - len(failed)} set(s) in {time.monotonic() - started:.1f}s"
            + (f"; failed: {', '.join(failed)}" if failed else "")
        )
        if failed:
            raise CommandError(f"{len(failed)} set(s) failed to reconcile: {', '.join(failed)}.")
