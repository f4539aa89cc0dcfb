"""Push: framework and change notifications over WebSub, through the built-in hub, with real
HTTP on loopback (a subscriber written from the WebSub recommendation: tests/websub.py)."""

import hashlib
import hmac
import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from django_resourcesync import access, push
from django_resourcesync.models import AccessToken, Channel, Delivery, Notification, ResourceSet, Subscription
from django_resourcesync.rebuild import rebuild_set
from example_project.repository.models import Item

from .conftest import demo_set
from .helpers import fetch, free_port
from .websub import Subscriber
from .xmlcheck import SM, check_document, entries, link, md

CHANNELS = ["framework-notification", "change-notification"]


@pytest.fixture
def subscriber():
    found = Subscriber()
    yield found
    found.close()


@pytest.fixture
def hub_source(live_server, settings, seed, transactional_db):
    """A running Source whose hub takes callbacks on loopback (as the example project's does)."""
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "BASE_URL": live_server.url, "HUB_ALLOW_PRIVATE_CALLBACKS": True}
    yield live_server.url
    assert push.runner.idle(timeout=30)
    push.runner.cancel()  # retries scheduled for later must not reach the next test's database


def offer(resource_set, *extra):
    resource_set.capabilities = ["resourcelist", "changelist", *extra]
    resource_set.save()
    return resource_set


def topic(base, resource_set, channel):
    return f"{base}/resourcesync/{resource_set.slug}/{channel}"


def get(uri):
    with urllib.request.urlopen(uri, timeout=30) as response:
        return response.status, response.read(), response.headers


def settle():
    """Let the hub's thread finish what is due now (tasks run in process here)."""
    assert push.runner.idle(timeout=30)


def subscribe_to_changes(hub_source, seed, subscriber):
    """The metadata set, published with a change channel, and ``subscriber`` verified on it."""
    seed(2)
    resource_set = offer(demo_set("metadata"), "change-notification")
    rebuild_set(resource_set)
    settle()
    changes = topic(hub_source, resource_set, "change-notification")
    assert subscriber.request(f"{hub_source}/resourcesync/hub", "subscribe", changes)[0] == 202
    assert subscriber.wait(lambda: subscriber.verified)
    settle()
    return resource_set, changes


def test_the_capability_list_advertises_each_channel_with_its_hub_and_the_topic_answers_with_link_headers(
    seed, db, settings
):
    seed(2)
    resource_set = offer(demo_set("bitstreams"), *CHANNELS)
    rebuild_set(resource_set)
    status, body, _ = fetch("/resourcesync/bitstreams/capabilitylist.xml")
    doc = check_document(body, "capabilitylist")
    channels = {md(item)["capability"]: item for item in entries(doc) if md(item)["capability"].endswith("notification")}
    assert set(channels) == set(CHANNELS)
    for name, item in channels.items():
        assert item.find(f"{{{SM}}}loc").text == f"http://testserver/resourcesync/bitstreams/{name}"
        assert link(item, "hub") == "http://testserver/resourcesync/hub"
        status, body, response = fetch(f"/resourcesync/bitstreams/{name}")
        assert status == 200
        check_document(body, name)
        assert '<http://testserver/resourcesync/hub>; rel="hub"' in response["Link"]
        assert f'<http://testserver/resourcesync/bitstreams/{name}>; rel="self"' in response["Link"]
        assert '<http://testserver/resourcesync/bitstreams/capabilitylist.xml>; rel="resourcesync"' in response["Link"]
    # An external hub is the one advertised.
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "HUB_URL": "https://hub.example.net/"}
    status, body, _ = fetch("/resourcesync/bitstreams/capabilitylist.xml")
    assert b'<rs:ln rel="hub" href="https://hub.example.net/"/>' in body
    # A set that does not offer a channel has no topic.
    offer(resource_set)
    assert fetch("/resourcesync/bitstreams/change-notification")[0] == 404


def test_a_subscriber_is_verified_gets_signed_change_notifications_within_seconds_and_nothing_after_unsubscribing(
    hub_source, seed, subscriber
):
    seed(3)
    resource_set = offer(demo_set("metadata"), *CHANNELS)
    rebuild_set(resource_set)
    settle()
    changes = topic(hub_source, resource_set, "change-notification")
    hub = f"{hub_source}/resourcesync/hub"
    status, reason = subscriber.request(hub, "subscribe", changes, secret="a shared secret", lease_seconds=3600)
    assert status == 202, reason
    assert subscriber.wait(lambda: subscriber.verified)
    assert subscriber.verified == [("subscribe", changes, "3600")]
    settle()
    [subscription] = Subscription.objects.all()
    assert (subscription.callback, subscription.capability, subscription.lease_seconds) == (
        subscriber.callback, "change-notification", 3600
    )

    item = Item.objects.filter(is_public=True).order_by("pk").first()
    saved = time.monotonic()
    item.title = "A title that changes the record"
    item.save()
    assert subscriber.wait(lambda: subscriber.received, timeout=10)
    [received] = subscriber.received
    assert received.at - saved < 5
    assert received.signed is True
    assert received.headers["Content-Type"] == "application/xml"
    assert f'<{changes}>; rel="self"' in received.headers["Link"]
    doc = check_document(received.body, "change-notification")
    assert link(doc, "up") == f"{hub_source}/resourcesync/metadata/capabilitylist.xml"
    [entry] = entries(doc)
    meta = md(entry)
    assert meta["change"] == "updated" and "sha-256:" in meta["hash"]
    assert entry.find(f"{{{SM}}}loc").text == resource_set.resources.get(object_pk=str(item.pk)).uri
    # The topic answers with the latest notification, as a hub fetching it after a ping sees it.
    assert get(changes)[1] == received.body

    # A tampered body does not match the signature (the check can fail).
    assert not hmac.compare_digest(
        hmac.new(b"a shared secret", received.body + b" ", hashlib.sha256).hexdigest(),
        received.headers["X-Hub-Signature"].split("=")[1],
    )

    status, reason = subscriber.request(hub, "unsubscribe", changes)
    assert status == 202, reason
    assert subscriber.wait(lambda: len(subscriber.verified) == 2)
    settle()
    assert not Subscription.objects.exists()
    item.title = "Changed again, unheard"
    item.save()
    settle()
    # Nobody listens any more: nothing is announced (the next subscription brings the channel
    # up to date before it is made).
    assert Notification.objects.filter(capability="change-notification").count() == 1
    time.sleep(0.5)
    assert len(subscriber.received) == 1


def test_a_framework_notification_follows_a_rebuild_and_a_change_of_the_sets(hub_source, seed, subscriber):
    seed(2)
    resource_set = offer(demo_set("bitstreams"), "framework-notification")
    rebuild_set(resource_set)
    settle()
    framework = topic(hub_source, resource_set, "framework-notification")
    assert subscriber.request(f"{hub_source}/resourcesync/hub", "subscribe", framework)[0] == 202
    assert subscriber.wait(lambda: subscriber.verified)
    settle()

    rebuild_set(resource_set, only=["resourcelist"])
    assert subscriber.wait(lambda: subscriber.received)
    doc = check_document(subscriber.received[0].body, "framework-notification")
    assert [(md(e)["capability"], md(e)["change"]) for e in entries(doc)] == [("resourcelist", "created")]
    assert entries(doc)[0].find(f"{{{SM}}}loc").text == f"{hub_source}/resourcesync/bitstreams/resourcelist.xml"
    assert subscriber.received[0].signed is None  # subscribed without a secret: not signed
    assert "X-Hub-Signature" not in subscriber.received[0].headers

    # Another set appears in the Source Description: told on this set's channel too.
    other = offer(demo_set("metadata"))
    rebuild_set(other)
    assert subscriber.wait(lambda: any(b"description" in r.body for r in subscriber.received))
    told = [check_document(r.body, "framework-notification") for r in subscriber.received[1:]]
    said = [(md(e)["capability"], md(e)["change"], e.find(f"{{{SM}}}loc").text) for doc in told for e in entries(doc)]
    assert ("description", "updated", f"{hub_source}/.well-known/resourcesync") in said

    # The set is disabled: its channel tells once that its Capability List is gone.
    resource_set.enabled = False
    resource_set.save()
    assert subscriber.wait(lambda: any(b'change="deleted"' in r.body for r in subscriber.received))
    last = check_document(subscriber.received[-1].body, "framework-notification")
    said = {(md(e)["capability"], md(e)["change"]) for e in entries(last)}
    assert ("capabilitylist", "deleted") in said and ("resourcelist", "deleted") in said
    assert link(last, "up") is None  # nothing to go up to
    assert not Channel.objects.filter(resource_set=resource_set, capability="framework-notification").exists()


def test_a_failing_callback_is_retried_until_it_answers(hub_source, seed, subscriber):
    subscribe_to_changes(hub_source, seed, subscriber)
    subscriber.fail_next = 2
    item = Item.objects.order_by("pk").first()
    item.title = "Retried"
    item.save()
    assert subscriber.wait(lambda: subscriber.received, timeout=20)  # after pauses of 2 s and 4 s
    settle()
    [delivery] = Delivery.objects.all()
    assert (delivery.state, delivery.attempts, delivery.last_status) == ("delivered", 3, 202)
    check_document(subscriber.received[0].body, "change-notification")


def test_a_delivery_that_keeps_failing_is_dropped_when_the_lease_ends(hub_source, seed, subscriber):
    from datetime import timedelta

    from django.utils import timezone

    from django_resourcesync.push import hub

    seed(1)
    resource_set = offer(demo_set("metadata"), "change-notification")
    rebuild_set(resource_set)
    settle()
    subscription = Subscription.objects.create(
        resource_set=resource_set, capability="change-notification", callback=subscriber.callback, lease_seconds=60,
        expires=timezone.now() + timedelta(seconds=60),
    )
    notification = Notification.objects.create(resource_set=resource_set, capability="change-notification", payload="<x/>")
    delivery = Delivery.objects.create(notification=notification, subscription=subscription, target=subscription.callback,
                                       give_up=timezone.now() + timedelta(seconds=3))
    subscriber.fail_next = 100
    assert hub.deliver([delivery.pk]) == (0, 0, 1)  # retried in 2 s: before the lease ends
    Delivery.objects.filter(pk=delivery.pk).update(next_attempt=timezone.now())
    assert hub.deliver([delivery.pk]) == (0, 1, 0)  # the next pause (4 s) would pass it: dropped
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_status, delivery.last_error) == ("failed", 2, 500, "answered 500")


BAD_REQUESTS = [
    ({}, "hub.mode"),
    ({"hub.mode": "publish"}, "publishes its own"),
    ({"hub.mode": "subscribe", "hub.callback": "CALLBACK"}, "hub.topic is missing"),
    ({"hub.mode": "subscribe", "hub.topic": "TOPIC"}, "hub.callback is missing"),
    ({"hub.mode": "subscribe", "hub.topic": "http://elsewhere.example/x", "hub.callback": "CALLBACK"}, "not a channel"),
    ({"hub.mode": "subscribe", "hub.topic": "BASE/resourcesync/metadata/changelist.xml", "hub.callback": "CALLBACK"},
     "not a channel"),
    ({"hub.mode": "subscribe", "hub.topic": "BASE/resourcesync/nosuchset/change-notification", "hub.callback": "CALLBACK"},
     "not a channel"),
    ({"hub.mode": "subscribe", "hub.topic": "TOPIC", "hub.callback": "ftp://127.0.0.1/x"}, "http or https"),
    ({"hub.mode": "subscribe", "hub.topic": "TOPIC", "hub.callback": "http://[::1"}, "not a URL"),
    ({"hub.mode": "subscribe", "hub.topic": "TOPIC", "hub.callback": "http://x.invalid/cb"}, "does not resolve"),
    ({"hub.mode": "subscribe", "hub.topic": "TOPIC", "hub.callback": "CALLBACK", "hub.lease_seconds": "soon"}, "whole number"),
    ({"hub.mode": "subscribe", "hub.topic": "TOPIC", "hub.callback": "CALLBACK", "hub.lease_seconds": "-5"}, "positive"),
    ({"hub.mode": "subscribe", "hub.topic": "TOPIC", "hub.callback": "CALLBACK", "hub.secret": "s" * 200}, "200 bytes"),
    ({"hub.mode": "subscribe", "hub.topic": "TOPIC", "hub.callback": "http://127.0.0.1:1/x\x00"}, "control characters"),
]


@pytest.mark.parametrize("form, reason", BAD_REQUESTS)
def test_a_malformed_subscription_request_gets_a_400_with_its_reason(client, db, settings, form, reason):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "HUB_ALLOW_PRIVATE_CALLBACKS": True}
    offer(demo_set("metadata"), "change-notification")
    values = {"TOPIC": "http://testserver/resourcesync/metadata/change-notification", "CALLBACK": "http://127.0.0.1:9/cb",
              "BASE": "http://testserver"}
    for key, value in list(form.items()):
        for name, replacement in values.items():
            value = value.replace(name, replacement)
        form[key] = value
    response = client.post("/resourcesync/hub", form)
    assert response.status_code == 400
    assert reason in response.content.decode()
    assert not Subscription.objects.exists()


@pytest.mark.parametrize("callback", [
    "http://127.0.0.1:8000/cb", "http://localhost/cb", "http://10.1.2.3/cb", "http://192.168.0.10/cb",
    "http://169.254.169.254/latest/meta-data", "http://[::1]/cb", "http://0.0.0.0/cb",
])
def test_callbacks_on_loopback_and_private_addresses_are_refused_by_default(client, db, callback):
    offer(demo_set("metadata"), "change-notification")
    response = client.post("/resourcesync/hub", {
        "hub.mode": "subscribe", "hub.topic": "http://testserver/resourcesync/metadata/change-notification",
        "hub.callback": callback,
    })
    assert response.status_code == 400
    assert "loopback, private or reserved" in response.content.decode()


def test_the_hub_takes_posts_only_and_is_off_with_an_external_hub(client, db, settings):
    assert client.get("/resourcesync/hub").status_code == 405
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "HUB_URL": "https://hub.example.net/"}
    response = client.post("/resourcesync/hub", {"hub.mode": "subscribe"})
    assert response.status_code == 404 and b"https://hub.example.net/" in response.content
    opened = client.get("/resourcesync/hub")
    assert opened.status_code == 405 and "https://hub.example.net/" in opened.content.decode()


@pytest.mark.parametrize("method", ["get", "head", "put"])
def test_a_browser_opening_the_hub_is_told_what_it_is_and_where_to_start(client, db, method):
    response = getattr(client, method)("/resourcesync/hub")
    assert response.status_code == 405 and response["Allow"] == "POST"
    if method == "head":
        return
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert "WebSub hub" in text and "POST" in text
    assert "Source Description, http://testserver/.well-known/resourcesync" in text


def test_a_subscription_whose_callback_does_not_confirm_is_not_made(hub_source, seed, subscriber):
    resource_set = offer(demo_set("metadata"), "change-notification")
    changes = topic(hub_source, resource_set, "change-notification")
    # Asked by someone else on the subscriber's behalf: the subscriber knows of no such intent.
    form = {"hub.mode": "subscribe", "hub.topic": changes, "hub.callback": subscriber.callback}
    request = urllib.request.Request(f"{hub_source}/resourcesync/hub", data=urllib.parse.urlencode(form).encode())
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 202
    settle()
    assert not Subscription.objects.exists()


@pytest.fixture
def thirdparty_hub(tmp_path):
    """flask-websub's hub and subscriber, from PyPI, running in a process of their own."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.thirdparty_hub", str(port), str(tmp_path)],
        cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL, stderr=open(tmp_path / "hub.log", "wb"),
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            get(f"{base}/control/received")
            break
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "hub.log").read_text()
            time.sleep(0.1)
    yield base
    process.terminate()
    process.wait(10)


def arrived(base):
    return json.loads(get(f"{base}/control/received")[1])


def wait_for(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_third_party_hub_from_pypi_relays_change_notifications_after_a_thin_ping(hub_source, seed, settings, thirdparty_hub):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "HUB_URL": f"{thirdparty_hub}/hub", "HUB_PING": "thin"}
    seed(2)
    resource_set = offer(demo_set("metadata"), *CHANNELS)
    rebuild_set(resource_set)
    settle()
    changes = topic(hub_source, resource_set, "change-notification")
    # The capability list names the external hub; the topic's Link headers too (discovery).
    advertised = get(f"{hub_source}/resourcesync/metadata/capabilitylist.xml")[1]
    assert f'<rs:ln rel="hub" href="{thirdparty_hub}/hub"/>'.encode() in advertised
    assert f'<{thirdparty_hub}/hub>; rel="hub"' in get(changes)[2]["Link"]
    form = urllib.parse.urlencode({"topic": changes, "hub": f"{thirdparty_hub}/hub"}).encode()
    with urllib.request.urlopen(urllib.request.Request(f"{thirdparty_hub}/control/subscribe", data=form), timeout=60):
        pass
    assert wait_for(lambda: arrived(thirdparty_hub)["confirmed"])

    item = Item.objects.filter(is_public=True).order_by("pk").first()
    item.title = "Relayed by a hub of someone else's"
    item.save()
    assert wait_for(lambda: arrived(thirdparty_hub)["received"]), arrived(thirdparty_hub)
    [received] = arrived(thirdparty_hub)["received"]
    assert received["topic"] == changes
    doc = check_document(received["body"].encode(), "change-notification")
    [entry] = entries(doc)
    assert md(entry)["change"] == "updated"
    settle()
    [delivery] = Delivery.objects.filter(notification__capability="change-notification")
    assert (delivery.state, delivery.to_hub, delivery.target) == ("delivered", True, f"{thirdparty_hub}/hub")


def test_a_fat_ping_posts_the_payload_to_the_external_hub_with_self_hub_and_resourcesync_links(
    hub_source, seed, settings, subscriber
):
    hub = subscriber.callback  # a recorder standing for the external hub
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "HUB_URL": hub, "HUB_PING": "fat"}
    seed(2)
    resource_set = offer(demo_set("metadata"), "change-notification")
    rebuild_set(resource_set)
    settle()
    item = Item.objects.filter(is_public=True).order_by("pk").first()
    item.title = "Pinged fat"
    item.save()
    assert subscriber.wait(lambda: subscriber.received)
    [received] = subscriber.received
    changes = topic(hub_source, resource_set, "change-notification")
    assert received.headers["Content-Type"] == "application/xml"
    link_header = received.headers["Link"]
    capability_list = f"{hub_source}/resourcesync/metadata/capabilitylist.xml"
    for target, rel in ((changes, "self"), (hub, "hub"), (capability_list, "resourcesync")):
        assert f'<{target}>; rel="{rel}"' in link_header
    check_document(received.body, "change-notification")


def framework_said(notifications):
    found = []
    for notification in notifications:
        doc = check_document(notification.payload.encode(), notification.capability)
        found += [(md(e)["capability"], md(e)["change"], e.find(f"{{{SM}}}loc").text, link(e, "index")) for e in entries(doc)]
    return found


def test_framework_notifications_tell_of_a_new_change_list_under_its_index_and_of_a_channel_withdrawn(
    seed, transactional_db, monkeypatch
):
    from django.utils import timezone

    from django_resourcesync.push import announce
    from django_resourcesync.tracking.changelog import close

    monkeypatch.setattr(push, "queue", lambda *args, **kwargs: None)  # announced here, not by the app's thread
    seed(2)
    resource_set = offer(demo_set("metadata"), "framework-notification")
    rebuild_set(resource_set)
    announce.announce()  # the channel starts from what is published now
    close(resource_set.changelists.get(until__isnull=True), timezone.now())
    item = Item.objects.order_by("pk").first()
    item.title = "The first change of the second list"
    item.save()
    said = framework_said(announce.announce())
    base = "http://testserver/resourcesync/metadata"
    assert ("changelist", "created", f"{base}/changelist/2.xml", f"{base}/changelist.xml") in said
    assert ("capabilitylist", "created", f"{base}/capabilitylist.xml", None) not in said
    # The manager unticks the channel, the set stays: its Capability List changed, nothing went.
    offer(resource_set)
    said = framework_said(announce.announce())
    assert [(capability, change) for capability, change, _loc, _index in said] == [("capabilitylist", "updated")]
    assert not Channel.objects.exists()


def test_a_notify_that_was_lost_is_made_up_by_the_safety_net(hub_source, seed, subscriber, monkeypatch):
    from django_resourcesync.tasks import deliver_due_task

    subscribe_to_changes(hub_source, seed, subscriber)
    with monkeypatch.context() as patched:
        patched.setattr(push, "queue", lambda *args, **kwargs: None)  # the broker is down
        item = Item.objects.order_by("pk").first()
        item.title = "Saved while nothing could be queued"
        item.save()
    assert not Notification.objects.filter(capability="change-notification").exists()
    assert deliver_due_task() == (1, 0, 0)  # beat's run: announced, then delivered
    assert subscriber.wait(lambda: subscriber.received)
    assert b"Saved while" not in subscriber.received[0].body  # (the payload tells of the change, not the title)
    assert md(entries(check_document(subscriber.received[0].body, "change-notification"))[0])["change"] == "updated"


def test_an_attempt_that_lost_its_claim_does_not_undo_the_delivery_made_meanwhile(
    seed, transactional_db, subscriber, monkeypatch, settings
):
    from datetime import timedelta

    from django.utils import timezone

    from django_resourcesync.push import hub

    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "HUB_ALLOW_PRIVATE_CALLBACKS": True}
    resource_set = offer(demo_set("metadata"), "change-notification")
    subscription = Subscription.objects.create(
        resource_set=resource_set, capability="change-notification", callback=subscriber.callback, lease_seconds=600,
        expires=timezone.now() + timedelta(seconds=600),
    )
    notification = Notification.objects.create(resource_set=resource_set, capability="change-notification", payload="<x/>")
    delivery = Delivery.objects.create(notification=notification, subscription=subscription, target=subscriber.callback,
                                       give_up=subscription.expires)
    real = hub._attempt
    calls = []

    def slow_attempt(row, shared):
        calls.append(row.pk)
        if len(calls) == 1:
            # This attempt outlives its claim: another run claims the delivery and makes it.
            Delivery.objects.filter(pk=row.pk).update(claimed_until=timezone.now() - timedelta(seconds=1))
            assert hub.deliver([row.pk]) == (1, 0, 0)
            return None, "TimeoutError: too late"
        return real(row, shared)

    monkeypatch.setattr(hub, "_attempt", slow_attempt)
    hub.deliver([delivery.pk])
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_status) == ("delivered", 1, 202)
    assert len(subscriber.received) == 1


def test_a_callback_that_answers_a_byte_at_a_time_is_cut_off_at_the_timeout(settings):
    import http.client
    import http.server
    import threading

    from django_resourcesync.push import hub

    class Trickle(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
            for _ in range(100):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.3)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "HUB_TIMEOUT": 1, "HUB_ALLOW_PRIVATE_CALLBACKS": True}
    started = time.monotonic()
    try:
        hub.request("POST", f"http://127.0.0.1:{server.server_address[1]}/cb", body=b"x")
    except (OSError, http.client.HTTPException):
        pass  # cut before the status line, or in the body
    finally:
        server.shutdown()
    assert time.monotonic() - started < 10  # 30 s of trickle, cut at about 1 s


def test_a_callback_that_hangs_does_not_hold_up_the_save(hub_source, seed, subscriber, settings):
    settings.RESOURCESYNC = {**settings.RESOURCESYNC, "HUB_TIMEOUT": 30}  # a delivery may hang 30 s
    subscribe_to_changes(hub_source, seed, subscriber)
    subscriber.hang_next = 1
    item = Item.objects.order_by("pk").first()
    item.title = "Saved while the subscriber hangs"
    started = time.monotonic()
    item.save()
    saving = time.monotonic() - started
    assert subscriber.hanging.wait(10)  # the delivery is under way (and hangs for 30 s)...
    assert saving < 15  # ...but the save did not wait for it
    assert Item.objects.get(pk=item.pk).title == "Saved while the subscriber hangs"
    subscriber.release.set()


# --- sets for partners ------------------------------------------------------------------------------


def test_the_hub_takes_a_restricted_channels_subscription_with_its_token_only_and_ends_it_with_the_token(
    hub_source, seed, subscriber
):
    seed(2)
    restricted = offer(demo_set("all-records"), "change-notification")
    rebuild_set(restricted)
    settle()
    hub, changes = f"{hub_source}/resourcesync/hub", topic(hub_source, restricted, "change-notification")
    assert subscriber.request(hub, "subscribe", changes)[0] == 401
    other = ResourceSet.objects.create(name="Embargoed", slug="embargoed", source="metadata", access="token")
    assert subscriber.request(hub, "subscribe", changes, token=access.issue("Other", [other])[1])[0] == 403
    record, token = access.issue("Partner", [restricted])
    assert subscriber.request(hub, "subscribe", changes, token=token)[0] == 202
    assert subscriber.wait(lambda: subscriber.verified)
    settle()
    assert Subscription.objects.get(resource_set=restricted).token == record

    item = Item.objects.order_by("pk").first()
    item.title = "Told to the partner"
    item.save()
    assert subscriber.wait(lambda: subscriber.received, timeout=20)
    settle()
    check_document(subscriber.received[0].body, "change-notification")

    access.revoke(AccessToken.objects.filter(pk=record.pk))
    assert not Subscription.objects.filter(resource_set=restricted).exists()
    item.title = "Not told: the token is revoked"
    item.save()
    settle()
    assert len(subscriber.received) == 1


# --- callbacks that reach the site's own network through IPv6 -------------------------------------

CALLBACKS_CARRYING_IPV4 = [
    # (callback, refused): IPv6 addresses that carry an IPv4 address reach it where they are routed.
    ("http://[64:ff9b::7f00:1]/cb", True),  # NAT64 (well-known prefix) of 127.0.0.1
    ("http://[64:ff9b::a01:203]/cb", True),  # ... of 10.1.2.3
    ("http://[64:ff9b::a9fe:a9fe]/latest/meta-data", True),  # ... of 169.254.169.254
    ("http://[64:ff9b:1::7f00:1]/cb", True),  # local-use NAT64: the site's own translator
    ("http://[64:ff9b:1:7f00:1::]/cb", True),
    ("http://[2002:7f00:1::]/cb", True),  # 6to4 of 127.0.0.1
    ("http://[2002:c0a8:a::1]/cb", True),  # 6to4 of 192.168.0.10
    ("http://[::7f00:1]/cb", True),  # IPv4-compatible
    ("http://[::ffff:0:127.0.0.1]/cb", True),  # IPv4-translated (SIIT)
    ("http://[::ffff:127.0.0.1]/cb", True),  # IPv4-mapped
    ("http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/cb", True),  # Teredo, client 127.0.0.1
    ("http://[2001:0:4136:e378:8000:63bf:f7f7:f7f7]/cb", True),  # Teredo: a tunnel, whatever the client
    ("http://[64:ff9b::808:808]/cb", False),  # NAT64 of 8.8.8.8: a public host
    ("http://[2002:808:808::1]/cb", True),  # 6to4 of 8.8.8.8: 6to4 is refused whatever it carries
    ("http://[2606:4700:4700::1111]/cb", False),  # global IPv6
    ("http://8.8.8.8/cb", False),  # global IPv4
]


@pytest.mark.parametrize("callback, refused", CALLBACKS_CARRYING_IPV4)
def test_an_ipv6_callback_is_refused_when_the_ipv4_address_it_carries_is_private(client, db, callback, refused):
    offer(demo_set("metadata"), "change-notification")
    response = client.post("/resourcesync/hub", {
        "hub.mode": "subscribe", "hub.topic": "http://testserver/resourcesync/metadata/change-notification",
        "hub.callback": callback,
    })
    if refused:
        assert response.status_code == 400
        assert "loopback, private or reserved address" in response.content.decode()
    else:
        assert response.status_code == 202, response.content


@pytest.mark.parametrize("callback", [callback for callback, refused in CALLBACKS_CARRYING_IPV4 if refused][:4])
def test_a_delivery_to_a_callback_carrying_a_private_ipv4_is_refused_without_connecting(transactional_db, callback):
    from datetime import timedelta

    from django.utils import timezone

    from django_resourcesync.push import hub

    # Subscribed before the hub refused such callbacks (or a name that resolved elsewhere then).
    resource_set = offer(demo_set("metadata"), "change-notification")
    subscription = Subscription.objects.create(
        resource_set=resource_set, capability="change-notification", callback=callback, lease_seconds=600,
        expires=timezone.now() + timedelta(seconds=600),
    )
    notification = Notification.objects.create(resource_set=resource_set, capability="change-notification", payload="<x/>")
    delivery = Delivery.objects.create(notification=notification, subscription=subscription, target=callback,
                                       give_up=subscription.expires)
    hub.deliver([delivery.pk])
    delivery.refresh_from_db()
    assert delivery.state == "pending" and delivery.last_status is None
    assert delivery.last_error.startswith("refused: its host is on a loopback, private or reserved address")
    push.runner.cancel()  # the retry


# --- a short-lived process: its deliveries go out before it exits ---------------------------------

CHANNEL_WITH_A_SUBSCRIBER = """
from datetime import timedelta
from django.utils import timezone
from django_resourcesync.models import ResourceSet, Subscription
from django_resourcesync.push import announce
from django_resourcesync.rebuild import rebuild_set
resource_set = ResourceSet.objects.get(slug="metadata")
resource_set.capabilities = ["resourcelist", "changelist", "change-notification"]
resource_set.save()
rebuild_set(resource_set)
Subscription.objects.create(resource_set=resource_set, capability="change-notification", callback={callback!r},
                            lease_seconds=3600, expires=timezone.now() + timedelta(hours=1))
announce.announce()  # the channel starts from what is published now
"""

SAVE_AND_EXIT = """
from example_project.repository.models import Item
item = Item.objects.filter(is_public=True).order_by("pk").first()
item.title = {title!r}
item.save()
"""

DELIVERIES = """
from django_resourcesync.models import Delivery
print("states:", *Delivery.objects.values_list("state", flat=True))
"""


def delivery_states(site):
    said = site.manage("shell", "-c", DELIVERIES).stdout
    return next(line.split()[1:] for line in said.splitlines() if line.startswith("states:"))


@pytest.fixture
def short_lived(tmp_path, subscriber):
    """The example project in its embedded default, run by ``manage.py`` in processes of their
    own, with a channel that ``subscriber`` is subscribed to."""
    from .test_embedded import Site

    site = Site(tmp_path)
    site.manage("migrate", "--no-input")
    site.manage("seed_repository", "--items", "2")
    site.manage("shell", "-c", CHANNEL_WITH_A_SUBSCRIBER.format(callback=subscriber.callback))
    return site


def test_a_shell_script_that_saves_and_exits_delivers_before_it_exits(short_lived, subscriber):
    done = short_lived.manage("shell", "-c", SAVE_AND_EXIT.format(title="Saved by a script"))
    assert "RuntimeError" not in done.stderr, done.stderr
    # The process has exited: what it delivered has arrived.
    assert [md(e)["change"] for r in subscriber.received for e in entries(check_document(r.body, "change-notification"))] \
        == ["updated"]
    assert delivery_states(short_lived) == ["delivered"]


def test_a_script_whose_subscriber_does_not_answer_exits_and_the_next_process_delivers(short_lived, subscriber):
    short_lived.env["SITE_RESOURCESYNC"] = json.dumps({"HUB_TIMEOUT": 2})
    subscriber.hang_next = 1  # and then answers
    short_lived.manage("shell", "-c", SAVE_AND_EXIT.format(title="Saved while the subscriber hangs"))
    assert subscriber.hanging.is_set() and not subscriber.received
    assert delivery_states(short_lived) == ["pending"]  # a row, not lost
    catch_up = "import time; time.sleep(3); from django_resourcesync.tasks import deliver_due_task; deliver_due_task()"
    short_lived.manage("shell", "-c", catch_up)  # the next process, once the retry is due
    assert len(subscriber.received) == 1
    assert delivery_states(short_lived) == ["delivered"]


def test_a_serving_site_delivers_what_a_script_left_pending_without_another_change(short_lived, subscriber):
    """In the embedded default, a site's serving process takes up, on its look for pending
    changes, the deliveries a short-lived process left due (its subscriber did not answer)."""
    short_lived.env["SITE_RESOURCESYNC"] = json.dumps({"HUB_TIMEOUT": 2})
    subscriber.hang_next = 1  # and then answers
    short_lived.manage("shell", "-c", SAVE_AND_EXIT.format(title="Saved while the subscriber hangs"))
    assert delivery_states(short_lived) == ["pending"]
    with short_lived.serving({"HUB_TIMEOUT": 2, "EMBEDDED_CATCH_UP_SECONDS": 1}) as log:
        assert wait_for(lambda: len(subscriber.received) == 1, timeout=60), log.read_text()[-2000:]
    assert delivery_states(short_lived) == ["delivered"]
