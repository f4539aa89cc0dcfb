"""The built-in hub under a flood of subscription requests, over real HTTP: the limits per client
and per callback host (429 with Retry-After past them), the cap on verifications waiting, and
verifications side by side, so that callbacks that never answer hold up no one else's."""

import http.client
import urllib.parse

import pytest
from django.core import checks

from django_resourcesync import push
from django_resourcesync.models import Subscription, SubscriptionRequest
from django_resourcesync.rebuild import rebuild_set

from .conftest import demo_set
from .test_push import offer, topic
from .websub import Callbacks, Subscriber

#: Loopback addresses the test's clients connect from (Linux routes all of 127.0.0.0/8 to lo):
#: to the hub they are different clients.
FLOODER, OTHER, LEGITIMATE = "127.0.0.2", "127.0.0.3", "127.0.0.4"


@pytest.fixture
def hub_source(live_server, settings, transactional_db, seed):
    """A running Source with a change channel, whose hub takes callbacks on loopback, with its
    limits as they are by default."""
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BASE_URL": live_server.url, "HUB_ALLOW_PRIVATE_CALLBACKS": True}
    seed(2)
    resource_set = offer(demo_set("metadata"), "change-notification")
    rebuild_set(resource_set)
    assert push.runner.idle(timeout=30)
    yield live_server.url, topic(live_server.url, resource_set, "change-notification")
    assert push.runner.idle(timeout=60)
    push.runner.cancel()


@pytest.fixture
def callbacks():
    found = Callbacks()
    yield found
    found.close()


def ask(base, form, source):
    """POST a form to the hub from the loopback address ``source``: ``(status, text, Retry-After)``."""
    port = urllib.parse.urlsplit(base).port
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        connection.request("POST", "/resourcesync/hub", body=urllib.parse.urlencode(form),
                           headers={"Content-Type": "application/x-www-form-urlencoded"})
        response = connection.getresponse()
        return response.status, response.read().decode(), response.getheader("Retry-After")
    finally:
        connection.close()


def subscribe(base, changes, callback, source):
    return ask(base, {"hub.mode": "subscribe", "hub.topic": changes, "hub.callback": callback}, source)


def test_a_flood_from_one_client_is_cut_at_its_rate_and_one_callback_host_at_its_subscriptions(hub_source, callbacks):
    base, changes = hub_source
    answers = [subscribe(base, changes, f"{callbacks.base}/echo/{n}", FLOODER) for n in range(75)]
    taken = [answer for answer in answers if answer[0] == 202]
    refused = [answer for answer in answers if answer[0] != 202]
    assert len(taken) == 60  # HUB_REQUESTS_PER_CLIENT: "60/hour"
    assert {status for status, _text, _retry in refused} == {429}
    for _status, text, retry_after in refused:
        assert "more than 60 requests from 127.0.0.2 in an hour" in text
        assert 3000 < int(retry_after) <= 3600  # when the first of the hour leaves it
    assert callbacks.wait(lambda: len(callbacks.confirmed) == 60, timeout=60)
    assert push.runner.idle(timeout=60)
    assert Subscription.objects.filter(host="127.0.0.1").count() == 60

    # Another client may ask, until the host has 100 subscriptions (HUB_SUBSCRIPTIONS_PER_HOST).
    answers = [subscribe(base, changes, f"{callbacks.base}/echo/other/{n}", OTHER) for n in range(45)]
    assert [status for status, _text, _retry in answers] == [202] * 40 + [429] * 5
    status, text, retry_after = answers[-1]
    assert "100 subscriptions have callbacks on 127.0.0.1 already" in text and int(retry_after) >= 1
    # A renewal adds none: it is taken.
    assert subscribe(base, changes, f"{callbacks.base}/echo/0", OTHER)[0] == 202
    assert push.runner.idle(timeout=60)
    assert Subscription.objects.filter(host="127.0.0.1").count() == 100
    # A request refused leaves nothing: no verification of it, no count.
    assert SubscriptionRequest.objects.count() == 60 + 41
    assert not SubscriptionRequest.objects.filter(done__isnull=True).exists()


def test_callbacks_that_never_answer_do_not_hold_up_another_clients_verification(hub_source, callbacks, settings):
    base, changes = hub_source
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "HUB_TIMEOUT": 60}  # each hangs a minute
    # More than the threads that verify (HUB_VERIFY_THREADS: 8): one client has half of them at most.
    for n in range(12):
        assert subscribe(base, changes, f"{callbacks.base}/hang/{n}", FLOODER)[0] == 202
    assert callbacks.wait(lambda: len(callbacks.hanging) == 4)
    subscriber = Subscriber()
    try:
        with subscriber.changed:
            subscriber.intents[("subscribe", changes)] = ""
        assert subscribe(base, changes, subscriber.callback, LEGITIMATE)[0] == 202
        assert subscriber.wait(lambda: subscriber.verified, timeout=30)
        # ... while the first four still hang (none has answered, nor timed out), the rest waiting.
        assert len(callbacks.hanging) == 4
        assert SubscriptionRequest.objects.filter(client=FLOODER, done__isnull=True).count() == 12
        callbacks.release.set()  # their connections drop: the verifications fail, the others run
        assert callbacks.wait(lambda: len(callbacks.hanging) == 12, timeout=30)
        assert push.runner.idle(timeout=60)
        assert list(Subscription.objects.values_list("callback", flat=True)) == [subscriber.callback]
    finally:
        subscriber.close()


def test_a_delivery_that_hangs_does_not_hold_up_a_verification(hub_source, settings):
    from example_project.repository.models import Item

    base, changes = hub_source
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "HUB_TIMEOUT": 60}
    listening, arriving = Subscriber(), Subscriber()
    try:
        assert listening.request(f"{base}/resourcesync/hub", "subscribe", changes)[0] == 202
        assert listening.wait(lambda: listening.verified)
        assert push.runner.idle(timeout=30)
        listening.hang_next = 1
        item = Item.objects.order_by("pk").first()
        item.title = "Told to a subscriber that never answers"
        item.save()
        assert listening.hanging.wait(15)  # the delivery is under way, for a minute
        assert arriving.request(f"{base}/resourcesync/hub", "subscribe", changes)[0] == 202
        assert arriving.wait(lambda: arriving.verified, timeout=30)
        assert listening.hanging.is_set() and not listening.received  # still hanging
    finally:
        listening.close()
        arriving.close()


def test_past_the_cap_on_verifications_waiting_a_request_is_asked_to_come_back(hub_source, callbacks, settings):
    base, changes = hub_source
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "HUB_PENDING_VERIFICATIONS": 3, "HUB_TIMEOUT": 60}
    for n, source in enumerate((FLOODER, OTHER, FLOODER)):
        assert subscribe(base, changes, f"{callbacks.base}/hang/{n}", source)[0] == 202
    status, text, retry_after = subscribe(base, changes, f"{callbacks.base}/echo/late", LEGITIMATE)
    assert (status, retry_after) == (429, "60")
    assert "the hub is verifying 3 requests already" in text
    callbacks.release.set()
    assert push.runner.idle(timeout=60)
    assert subscribe(base, changes, f"{callbacks.base}/echo/late", LEGITIMATE)[0] == 202
    assert callbacks.wait(lambda: callbacks.confirmed == ["/echo/late"])


@pytest.mark.parametrize("override, expected", [
    ({"HUB_REQUESTS_PER_CLIENT": "sixty an hour"}, "resourcesync.E026"),
    ({"HUB_REQUESTS_PER_CLIENT": 60}, "resourcesync.E026"),
    ({"HUB_SUBSCRIPTIONS_PER_HOST": 0}, "resourcesync.E024"),
    ({"HUB_PENDING_VERIFICATIONS": "100"}, "resourcesync.E024"),
    ({"HUB_VERIFY_THREADS": None}, "resourcesync.E024"),
])
def test_a_limit_the_hub_cannot_read_is_reported_by_the_checks(settings, override, expected):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, **override}
    [key] = override
    found = [message for message in checks.run_checks() if message.id == expected]
    assert [key in message.msg for message in found] == [True], found
