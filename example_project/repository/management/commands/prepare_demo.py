"""Make the demo a showcase: every capability on every set (the dumps where the source gives
bytes), prior versions of the files and records, a login for the admin and a partner's token for
the set for partners. Idempotent; prints the login, the token and where to use them."""

import os
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from django_resourcesync import access, capabilities
from django_resourcesync.models import AccessToken, ResourceSet

USERNAME = "demo"
PARTNER_SET = "all-records"


class Command(BaseCommand):
    help = "Offer every capability on the demo's sets and create the demo's admin login."

    def add_arguments(self, parser):
        parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="where the demo is served")

    def handle(self, *args, base_url, **options):
        for resource_set in ResourceSet.objects.all():
            gives_bytes = resource_set.get_source().gives_bytes
            resource_set.capabilities = [
                capability.name for capability in capabilities.TABLE if gives_bytes or not capability.needs_bytes
            ]
            resource_set.prior_versions = gives_bytes
            resource_set.save()
        password = self.password()
        User = get_user_model()
        user = User.objects.filter(username=USERNAME).first() or User(username=USERNAME, email="demo@example.org")
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write(f"admin: {base_url}/admin/  (login {USERNAME!r}, password {password!r})")
        self.stdout.write(f"API:   {base_url}/resourcesync/api/  (schema: {base_url}/resourcesync/api/schema/ui/)")
        token = self.partner_token()
        if token:
            self.stdout.write(f"partners: {base_url}/resourcesync/{PARTNER_SET}/capabilitylist.xml  "
                              f"(Authorization: Bearer {token})")

    def partner_token(self):
        """The demo partner's token for the set for partners: made once, kept beside the database
        (the app keeps only its digest), issued again if it was revoked or deleted."""
        partners = ResourceSet.objects.filter(slug=PARTNER_SET, access=access.TOKEN).first()
        if partners is None:
            return None
        path = settings.VAR_DIR / "demo-token"
        token = path.read_text().strip() if path.exists() else ""
        record = AccessToken.objects.filter(digest=access.digest(token)).first() if token else None
        if record is None or record.state() != "valid":
            _record, token = access.issue("Demo partner", [partners])
            path.unlink(missing_ok=True)
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
                handle.write(token)  # readable by the demo's user alone from the start
        return token

    def password(self):
        """The demo's password: made once, kept beside its database, so that it stays the same
        from one run of the demo to the next."""
        path = settings.VAR_DIR / "demo-password"
        if not path.exists():
            path.write_text(secrets.token_urlsafe(9))
            path.chmod(0o600)
        return path.read_text().strip()
