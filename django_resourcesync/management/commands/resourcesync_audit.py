import sys

from django.core.management.base import BaseCommand, CommandError

from ...audit import audit, record, rules
from ...conf import app_settings
from ...models import ResourceSet


class Command(BaseCommand):
    help = (
        "Check the deployed Source over HTTP as a Destination sees it: every document against the spec's rules and the "
        "official schemas (those the app ships, or another folder's with --schemas), the hashes and lengths of a sample "
        "of the resources and of the dump packages against the bytes served, the discovery headers. Prints the problems "
        "first, one a line; exits 1 if there is any."
    )

    def add_arguments(self, parser):
        parser.add_argument("--base", help="The Source's base URL (default: RESOURCESYNC['BASE_URL']); another Source's too.")
        parser.add_argument("--set", dest="sets", action="append", metavar="SLUG",
                            help="Only this set of this site (repeatable); a set for partners needs --token.")
        amount = parser.add_mutually_exclusive_group()
        amount.add_argument("--sample", type=int, default=20, metavar="N", help="Resources fetched per Resource List (20).")
        amount.add_argument("--all", action="store_true", help="Fetch every listed resource and every dump package.")
        parser.add_argument("--token", help="A bearer token to send (a set for partners).")
        parser.add_argument("--schemas", default=app_settings.AUDIT_SCHEMAS,
                            help="A folder with the official schemas (resourcesync.xsd, sitemap.xsd, siteindex.xsd) to "
                                 "validate against instead of those the app ships.")
        parser.add_argument("--no-discovery", action="store_true", help="Do not require Link headers on the resources.")

    def handle(self, *args, base=None, sets=None, sample=20, all=False, token=None, schemas=None, no_discovery=False,
               verbosity=1, **options):
        if sample < 1:
            raise CommandError("--sample must be positive.")
        if sets:
            missing = sorted(set(sets) - set(ResourceSet.objects.filter(slug__in=sets).values_list("slug", flat=True)))
            if missing:
                raise CommandError(f"No resource set with slug: {', '.join(missing)}.")
        if schemas and rules.schemas_missing(schemas):
            raise CommandError(f"--schemas: {rules.schemas_missing(schemas)}.")
        try:
            report = audit(base, sets=sets, sample=None if all else sample, token=token, schemas=schemas,
                           discovery=False if no_discovery else None, packages=None if all else 2)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if not base or base.rstrip("/") == (app_settings.BASE_URL or "").rstrip("/"):
            record(report)
        for line in report.lines():
            self.stdout.write(line)
        if not report.ok:
            sys.exit(1)
