"""A WebSub subscriber, written from the W3C recommendation (sections 5 and 7), for the tests:
an HTTP server on loopback that asks a hub to (un)subscribe, confirms only the intents it
announced, and keeps every notification it receives with whether its signature holds."""

import hashlib
import hmac
import http.server
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

ALGORITHMS = {"sha1": hashlib.sha1, "sha256": hashlib.sha256, "sha384": hashlib.sha384, "sha512": hashlib.sha512}


class Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass


def wait_on(condition, predicate, timeout):
    """Whether ``predicate()`` holds within ``timeout`` seconds, looked at whenever ``condition``
    is notified."""
    deadline = time.monotonic() + timeout
    with condition:
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            condition.wait(remaining)
        return True


class Received:
    def __init__(self, body, headers, signed):
        self.body, self.headers, self.signed, self.at = body, headers, signed, time.monotonic()


class Subscriber:
    def __init__(self, host="127.0.0.1"):
        self.intents = {}  # (mode, topic) -> secret, awaiting the hub's verification
        self.secrets = {}  # topic -> secret of the verified subscription
        self.verified = []  # (mode, topic, lease_seconds)
        self.denied = []
        self.received = []
        self.fail_next = 0  # answer that many notifications with a 500
        self.delay = 0.0  # seconds to wait before answering a notification
        self.hang_next = 0  # take that many notifications and never answer (until released)
        self.hanging = threading.Event()  # set while one hangs
        self.release = threading.Event()
        self.changed = threading.Condition()
        subscriber = self

        class Handler(Quiet):
            def do_GET(self):
                query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
                mode, topic = query.get("hub.mode"), query.get("hub.topic")
                with subscriber.changed:
                    if mode == "denied":
                        subscriber.denied.append((topic, query.get("hub.reason")))
                        self._answer(200, b"")
                    elif (mode, topic) in subscriber.intents and "hub.challenge" in query:
                        secret = subscriber.intents.pop((mode, topic))
                        if mode == "subscribe":
                            subscriber.secrets[topic] = secret
                        else:
                            subscriber.secrets.pop(topic, None)
                        subscriber.verified.append((mode, topic, query.get("hub.lease_seconds")))
                        self._answer(200, query["hub.challenge"].encode())
                    else:
                        self._answer(404, b"no such intent")  # 5.3.1: not confirmed
                    subscriber.changed.notify_all()

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if subscriber.delay:
                    time.sleep(subscriber.delay)
                with subscriber.changed:
                    hang = subscriber.hang_next > 0
                    subscriber.hang_next -= hang
                if hang:
                    subscriber.hanging.set()
                    subscriber.release.wait(60)
                    return  # no answer: the connection is dropped
                with subscriber.changed:
                    if subscriber.fail_next:
                        subscriber.fail_next -= 1
                        self._answer(500, b"not now")
                        return
                    subscriber.received.append(Received(body, dict(self.headers), subscriber.signature_holds(body, self.headers)))
                    subscriber.changed.notify_all()
                self._answer(202, b"")  # 7: any 2xx acknowledges

            def _answer(self, status, body):
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.callback = f"http://{host}:{self.server.server_address[1]}/callback"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def signature_holds(self, body, headers):
        """7.1: with a secret, a notification counts only if X-Hub-Signature matches."""
        topics = [t for t in self.secrets if self.secrets[t] and f'<{t}>; rel="self"' in headers.get("Link", "")]
        if not topics:
            return None
        method, _, value = headers.get("X-Hub-Signature", "").partition("=")
        if method not in ALGORITHMS:
            return False
        expected = hmac.new(self.secrets[topics[0]].encode(), body, ALGORITHMS[method]).hexdigest()
        return hmac.compare_digest(expected, value)

    def request(self, hub, mode, topic, secret="", lease_seconds=None, token=None):
        """POST a (un)subscription request (with ``token``, as a bearer token); returns (status, reason)."""
        with self.changed:
            self.intents[(mode, topic)] = secret
        form = {"hub.mode": mode, "hub.topic": topic, "hub.callback": self.callback}
        if secret:
            form["hub.secret"] = secret
        if lease_seconds:
            form["hub.lease_seconds"] = str(lease_seconds)
        data = urllib.parse.urlencode(form).encode()
        try:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            with urllib.request.urlopen(urllib.request.Request(hub, data=data, headers=headers), timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def wait(self, predicate, timeout=15.0):
        return wait_on(self.changed, predicate, timeout)

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class Callbacks:
    """A host of many callbacks, as one who floods a hub has: every ``GET`` with a
    ``hub.challenge`` under ``/echo/`` is confirmed; one under ``/hang/`` is taken and never
    answered until :meth:`close` (the connection is then dropped)."""

    def __init__(self, host="127.0.0.1"):
        self.confirmed = []  # paths
        self.hanging = []  # paths of the verifications held
        self.changed = threading.Condition()
        self.release = threading.Event()
        callbacks = self

        class Handler(Quiet):
            def do_GET(self):
                path, _, query = self.path.partition("?")
                challenge = dict(urllib.parse.parse_qsl(query)).get("hub.challenge")
                if path.startswith("/hang/"):
                    with callbacks.changed:
                        callbacks.hanging.append(path)
                        callbacks.changed.notify_all()
                    callbacks.release.wait(120)
                    return
                body = challenge.encode() if challenge and path.startswith("/echo/") else b"no"
                self.send_response(200 if body != b"no" else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                with callbacks.changed:
                    if body != b"no":
                        callbacks.confirmed.append(path)
                    callbacks.changed.notify_all()

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, predicate, timeout=15.0):
        return wait_on(self.changed, predicate, timeout)

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
