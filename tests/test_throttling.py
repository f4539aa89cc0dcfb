"""Limits per client, over HTTP against a live server: who a client is (its address, never what
it writes into X-Forwarded-For, unless the site declares its proxies), and how often it may fail
to authenticate (passwords, DRF tokens, partners' bearer tokens) before it is refused any
authentication for the rest of the period."""

from types import SimpleNamespace

import pytest
import requests
from django.contrib.auth.models import Permission, User
from django.core import checks
from django.core.cache import cache
from django.test import RequestFactory

from django_resourcesync import access
from django_resourcesync.clients import client_address, client_key

from .conftest import demo_set
from .helpers import build

API = "/resourcesync/api/"


@pytest.fixture(autouse=True)
def fresh_counts():
    """The limits count in the default cache: each test starts with nothing counted, and leaves nothing."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def live(live_server, settings, transactional_db):
    """The site at a live server; ``live.configure(KEY=value)`` sets RESOURCESYNC options."""
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BASE_URL": live_server.url}

    def configure(**options):
        settings.RESOURCESYNC = {**settings.RESOURCESYNC, **options}

    return SimpleNamespace(url=live_server.url, configure=configure)


def get(url, xff=None, **options):
    headers = options.pop("headers", {})
    if xff is not None:
        headers["X-Forwarded-For"] = xff
    return requests.get(url, headers=headers, timeout=30, **options)


def test_a_new_x_forwarded_for_on_every_request_does_not_escape_the_anonymous_throttle(live):
    live.configure(API_ANON_RATE="5/minute")
    statuses = [get(f"{live.url}{API}sets/", xff=f"198.51.100.{n}").status_code for n in range(8)]
    assert statuses == [200] * 5 + [429] * 3
    refused = get(f"{live.url}{API}sets/", xff="2001:db8::1")
    assert refused.status_code == 429 and 1 <= int(refused.headers["Retry-After"]) <= 60


def test_behind_declared_proxies_the_forwarded_client_is_counted_and_what_it_wrote_itself_is_not(live):
    # The live server's peer, 127.0.0.1, stands for the proxy next to the site; 10.1.2.3 for one before it.
    live.configure(API_ANON_RATE="3/minute", TRUSTED_PROXIES=["127.0.0.1", "10.0.0.0/8"])
    url = f"{live.url}{API}sets/"
    # One client, 203.0.113.7, that writes a new address of its own at the left each time.
    for n in range(3):
        assert get(url, xff=f"192.0.2.{n}, 203.0.113.7, 10.1.2.3").status_code == 200
    assert get(url, xff="192.0.2.99, 203.0.113.7, 10.1.2.3").status_code == 429
    assert get(url, xff="203.0.113.7").status_code == 429  # the same client through one proxy
    assert get(url, xff="203.0.113.7, 10.9.9.9").status_code == 429
    # Other clients have counts of their own, the proxy too (a request it makes itself).
    assert get(url, xff="203.0.113.7, 203.0.113.8, 10.1.2.3").status_code == 200
    assert get(url, xff="203.0.113.9:51234").status_code == 200
    assert get(url).status_code == 200

    # A peer that is not a declared proxy: its header is not read at all.
    cache.clear()
    live.configure(TRUSTED_PROXIES=["10.0.0.0/8"])
    statuses = [get(url, xff=f"203.0.113.{n}").status_code for n in range(4)]
    assert statuses == [200] * 3 + [429]


def manager(password):
    user = User.objects.create_user("manager", "manager@example.org", password, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="resourcesync"))
    return user


def test_failed_basic_auth_and_token_guesses_are_429_past_the_rate_even_for_the_right_password(live):
    live.configure(AUTH_FAILURE_RATE="3/minute")
    manager("right horse")
    url = f"{live.url}{API}builds/"
    assert get(url, auth=("manager", "right horse")).status_code == 200  # a success is not counted
    # Three failures, with a new spoofed header each, by password and by DRF token.
    assert get(url, xff="198.51.100.1", auth=("manager", "guess 1")).status_code == 401
    assert get(url, xff="198.51.100.2", auth=("manager", "guess 2")).status_code == 401
    assert get(url, xff="198.51.100.3", headers={"Authorization": "Token 0123456789abcdef"}).status_code == 401
    for credentials in ({"auth": ("manager", "guess 4")}, {"auth": ("manager", "right horse")},
                        {"headers": {"Authorization": "Token 0123456789abcdef"}}):
        refused = get(url, xff="198.51.100.4", **credentials)
        assert refused.status_code == 429, credentials
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert "failed authentications" in refused.json()["detail"]
    # Reads that send no credentials are still answered (the anonymous rate counts them).
    assert get(f"{live.url}{API}sets/").status_code == 200


def test_bad_bearer_tokens_are_429_past_the_rate_even_for_a_valid_token(live, seed):
    seed(1)
    partners = demo_set("all-records")
    build(partners)
    token = access.issue("Partner Library", [partners])[1]
    live.configure(AUTH_FAILURE_RATE="3/minute")
    url = f"{live.url}/resourcesync/{partners.slug}/capabilitylist.xml"

    def with_token(value):
        return get(url, xff="198.51.100.1", headers={"Authorization": f"Bearer {value}"})

    assert with_token(token).status_code == 200
    for guess in ("rs_guess-1", "rs_guess-2", "not a token"):
        assert with_token(guess).status_code == 401
    for value in ("rs_guess-4", token):
        refused = with_token(value)
        assert refused.status_code == 429, value
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert "private" in refused.headers["Cache-Control"]
    assert get(url).status_code == 401  # without a token: the challenge, as before


@pytest.mark.parametrize("remote, forwarded, proxies, address, key", [
    ("192.0.2.1", "203.0.113.7", [], "192.0.2.1", "192.0.2.1"),
    ("::ffff:192.0.2.1", None, [], "192.0.2.1", "192.0.2.1"),
    ("2001:db8:1:2:3:4:5:6", None, [], "2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
    ("10.0.0.5", "198.51.100.9, 203.0.113.7", ["10.0.0.0/8"], "203.0.113.7", "203.0.113.7"),
    ("10.0.0.5", "[2001:db8::7]:443, 10.0.0.4", ["10.0.0.0/8"], "2001:db8::7", "2001:db8::/64"),
    ("10.0.0.5", "10.0.0.3, 10.0.0.4", ["10.0.0.0/8"], "10.0.0.3", "10.0.0.3"),
    ("10.0.0.5", "203.0.113.7, unknown", ["10.0.0.0/8"], "10.0.0.5", "10.0.0.5"),
    ("", "203.0.113.7", ["unix"], "203.0.113.7", "203.0.113.7"),
    ("", "203.0.113.7", [], "local", "local"),
    ("10.0.0.5", "203.0.113.7", "10.0.0.5", "10.0.0.5", "10.0.0.5"),  # not a list: no proxy trusted
])
def test_the_client_address_read_from_the_peer_and_the_declared_proxies(settings, remote, forwarded, proxies, address, key):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "TRUSTED_PROXIES": proxies}
    request = RequestFactory().get("/", REMOTE_ADDR=remote, **({"HTTP_X_FORWARDED_FOR": forwarded} if forwarded else {}))
    assert (client_address(request), client_key(request)) == (address, key)


def test_proxies_and_a_failure_rate_that_cannot_be_used_are_check_errors_with_a_hint(settings):
    def reported(**options):
        settings.RESOURCESYNC = {**settings.RESOURCESYNC, **options}
        return [m for m in checks.run_checks() if m.id in ("resourcesync.E026", "resourcesync.E032")]

    assert reported() == [] and reported(TRUSTED_PROXIES=["127.0.0.1", "10.0.0.0/8", "::1", "unix"]) == []
    for proxies, named in (("10.0.0.1", "'10.0.0.1'"), (["10.0.0.300"], "'10.0.0.300'"), (["0.0.0.0/0"], "every address"),
                           ([10], "10 is not")):
        (error,) = reported(TRUSTED_PROXIES=proxies)
        assert error.id == "resourcesync.E032" and named in error.msg and "10.0.0.0/8" in error.hint
    (error,) = reported(TRUSTED_PROXIES=[], AUTH_FAILURE_RATE="5 a minute")
    assert error.id == "resourcesync.E026" and "AUTH_FAILURE_RATE" in error.msg and "20/hour" in error.hint
