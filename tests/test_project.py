from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_no_model_change_lacks_a_migration():
    out = StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exit:
        pytest.fail(f"makemigrations --check found changes without a migration (exit {exit.code}):\n{out.getvalue()}")
