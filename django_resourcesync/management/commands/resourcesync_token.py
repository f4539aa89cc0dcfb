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
        revoke = commands.add_parser("revoke", help="Revoke tokens now: by id, by Destination name, or by the token's beginning.")
        revoke.add_argument("which", help="A token's id, a Destination's name (all its tokens), or the token's beginning.")

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

    def handle_revoke(self, which, **options):
        which = which.strip()
        if which.isdigit():
            tokens = AccessToken.objects.filter(pk=int(which))
        elif which.startswith(access.TOKEN_PREFIX):
            if len(which) < access.SHOWN:
                raise CommandError(f"Give at least the first {access.SHOWN} characters of the token.")
            tokens = AccessToken.objects.filter(digest=access.digest(which))  # the whole token
            if not tokens.exists():
                tokens = AccessToken.objects.filter(prefix=which[: access.SHOWN])
        else:
            tokens = AccessToken.objects.filter(name=which)
        if not tokens.exists():
            raise CommandError(f"No token matches {which!r} (see 'resourcesync_token list').")
        count = access.revoke(tokens)
        self.stdout.write(f"{count} token(s) revoked" + ("" if count else " (already revoked)") + ".")
