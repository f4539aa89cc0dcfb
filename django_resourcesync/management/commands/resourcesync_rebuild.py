import time

from django.core.management.base import BaseCommand, CommandError

from ... import running, sweep
from ...capabilities import CAPABILITY_CHOICES
from ...models import LeftOut, ResourceSet
from ...progress import ProgressBar
from ...rebuild import rebuild_set
from ...sources import NotRegistered
from ...tasks import rebuild_set_task


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
        parser.add_argument(
            "--async", dest="run_async", action="store_true", help="Enqueue the builds on Celery workers and print the task ids."
        )

    def handle(self, *args, sets=None, only=None, batch_size=None, run_async=False, verbosity=1, **options):
        known = [c for c, _ in CAPABILITY_CHOICES]
        if only is not None:
            only = [c.strip() for c in only.split(",") if c.strip()]
            if not only:  # rebuild_set reads an empty list as "every capability": not what was asked
                raise CommandError(f"--only names no capability. Known: {', '.join(known)}.")
        if only and not set(only) <= set(known):
            raise CommandError(
                f"Unknown capability in --only: {', '.join(sorted(set(only) - set(known)))}. Known: {', '.join(known)}."
            )
        if batch_size is not None and batch_size < 1:
            raise CommandError("--batch-size must be positive.")
        resource_sets = self.resource_sets(sets)
        if run_async:
            for resource_set in resource_sets:
                result = running.send(rebuild_set_task, resource_set.pk, only, batch_size)
                self.stdout.write(f"{resource_set.slug}: task {result.id}")
            return

        started = time.monotonic()
        progress = ProgressBar(self.stderr) if verbosity >= 1 else None
        builds, failed, reasons = [], [], []
        for resource_set in resource_sets:
            if not resource_set.capabilities:
                self.stderr.write(f"{resource_set.slug}: no capability is enabled for this set; nothing to build.")
                continue
            problem = None
            try:
                done = rebuild_set(resource_set, only=only, progress=progress, batch_size=batch_size)
            except NotRegistered:
                problem = f"the source {resource_set.source!r} is not registered; skipped."
            except Exception as exc:  # recorded as a failed build; the published documents stay
                problem = f"build failed: {exc}"
                reasons.append(f"{resource_set.slug}: {type(exc).__name__}: {exc}")
            finally:
                if progress:  # the bar's last line ended before anything else is written
                    progress.end()
            if problem:
                failed.append(resource_set.slug)
                self.stderr.write(f"{resource_set.slug}: {problem}")
                continue
            builds += done
            if verbosity >= 2:
                for build in done:
                    self.stdout.write(
                        f"{resource_set.slug}: {build.capability} build {build.pk}, "
                        f"{build.entries} entries in {build.documents} file(s)"
                    )
        try:  # files left by killed or failed builds, builds whose process is gone
            swept = sweep.sweep()
            if verbosity >= 2:
                self.stdout.write(f"storage sweep: {swept}")
        except Exception as exc:  # the builds are published; the next sweep tries again
            self.stderr.write(f"storage sweep failed: {exc}")
        left_out = LeftOut.objects.filter(resource_set__in=resource_sets).count()
        self.stdout.write(
            f"Built {len(builds)} capability document(s) for {len(resource_sets)} set(s): "
            f"{sum(b.entries for b in builds)} entries in {sum(b.documents for b in builds)} file(s), "
            f"{time.monotonic() - started:.1f}s" + (f"; failed: {', '.join(failed)}" if failed else "")
            + (f"; {left_out} object(s) left out, they cannot be published (see the builds' reports)" if left_out else "")
        )
        if failed:
            raise CommandError(
                f"{len(failed)} set(s) failed to build: {', '.join(failed)}." + "".join(f"\n{reason}" for reason in reasons)
            )

    def resource_sets(self, slugs):
        if not slugs:
            return list(ResourceSet.objects.filter(enabled=True))
        found = {s.slug: s for s in ResourceSet.objects.filter(slug__in=slugs)}
        missing = [slug for slug in slugs if slug not in found]
        if missing:
            raise CommandError(f"No resource set with slug: {', '.join(missing)}.")
        disabled = [slug for slug in slugs if not found[slug].enabled]
        if disabled:
            raise CommandError(f"Disabled resource set(s): {', '.join(disabled)}; enable them in the admin first.")
        return [found[slug] for slug in dict.fromkeys(slugs)]
