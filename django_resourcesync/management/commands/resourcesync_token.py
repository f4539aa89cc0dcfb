import datetime

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ... import access
from ...models import AccessToken, ResourceSet


def _expiry(value):
    """``--expires``: a number of days from now, or an ISO 8601 datetime (UTC when it names no
    zone)."""
    if value is None:
        return None
    if value.isdigit():
        return timezone.now() + datetime.timedelta(days=int(value))
    try:
        moment = parse_datetime(value)
    except ValueError:
        moment = None
    if moment is None:
        raise CommandError(f"--expires {value!r}: give a number of days, or a datetime such as 2027-01-31T00:00:00Z.")
    if timezone.is_naive(moment):
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    if moment <= timezone.now():
        raise CommandError(f"--expires {value!r} is in the past.")
    return moment


class Command(BaseCommand):
    help = (
        "Issue, list and revoke the access tokens of partners (Destinations) for the sets for partners with a token: "
        "create --name NAME --set SLUG [--expires DAYS|DATETIME]; list; revoke ID|NAME|TOKEN-BEGINNING."
    )

    def add_arguments(self, parser):
        commands = parser.add_subparsers(dest="action", required=True, metavar="create|list|revoke")
        create = commands.add_parser("create", help="Issue a token; it is printed once.")
        create.add_argument("--name", required=True, help="The Destination that holds it (named in the logs).")
        create.add_argument("--set", dest="sets", action="append", required=True, metavar="SLUG",
                            help="A set for partners it opens (repeatable).")
        create.add_argument("--expires", help="Days from now, or a datetime (ISO 8601); default: never.")
        commands.add_parser("list", help="The tokens, one a line (never the tokens themselves).")
        revoke = commands.add_parser("revoke", help="Revoke tokens now, and end the subscriptions they made.")
        which = revoke.add_mutually_exclusive_group(required=True)
        which.add_argument("--id", type=int, help="The token with this id (see 'list').")
        which.add_argument("--name", help="Every token of this Destination.")
        which.add_argument("--prefix", help=f"The token that begins so (its first {access.SHOWN} characters, as 'list' shows).")
        which.add_argument("--token", help="This token (the whole of it).")

    def handle(self, *args, action, **options):
        return getattr(self, f"handle_{action}")(**options)

    def handle_create(self, name, sets, expires=None, **options):
        name = name.strip()
        if not name:
            raise CommandError("--name may not be empty.")
        found = {s.slug: s for s in ResourceSet.objects.filter(slug__in=sets)}
        missing = sorted(set(sets) - set(found))
        if missing:
            raise CommandError(f"No resource set with slug: {', '.join(missing)}.")
        public = sorted(slug for slug, s in found.items() if s.is_public)
        if public:
            raise CommandError(f"Anyone may read {', '.join(public)}: a token opens only sets for partners with a token "
                               "(set their access to 'token' first).")
        record, token = access.issue(name, found.values(), expires=_expiry(expires))
        self.stderr.write(f"Token {record.pk} issued to {record.name} for {', '.join(sorted(found))}"
                          + (f", until {record.expires.isoformat()}" if record.expires else "")
                          + ". It is shown this once: keep it.")
        self.stdout.write(token)

    def handle_list(self, **options):
        tokens = AccessToken.objects.prefetch_related("sets").order_by("pk")
        if not tokens:
            self.stderr.write("No token issued.")
        for record in tokens:
            sets = ",".join(s.slug for s in record.sets.all()) or "-"
            expires = record.expires.isoformat() if record.expires else "never"
            last_used = record.last_used.isoformat() if record.last_used else "never"
            self.stdout.write(f"{record.pk}\t{record.prefix}…\t{record.name}\t{sets}\t{record.state()}\t"
                              f"expires {expires}\tlast used {last_used}")

    def handle_revoke(self, id=None, name=None, prefix=None, token=None, **options):
        if id is not None:
            tokens, which = AccessToken.objects.filter(pk=id), f"id {id}"
        elif name is not None:
            tokens, which = AccessToken.objects.filter(name=name), f"Destination {name!r}"
        elif prefix is not None:
            if len(prefix) != access.SHOWN:
                raise CommandError(f"--prefix takes the first {access.SHOWN} characters of a token, as 'list' shows them.")
            tokens, which = AccessToken.objects.filter(prefix=prefix), f"beginning {prefix!r}"
        else:
            tokens, which = AccessToken.objects.filter(digest=access.digest(token)), "the token given"
        if not tokens.exists():
            raise CommandError(f"No token has {which} (see 'resourcesync_token list').")
        count = access.revoke(tokens)
        self.stdout.write(f"{count} token(s) revoked" + ("" if count else " (already revoked)") + ".")
