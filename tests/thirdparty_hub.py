"""A third-party WebSub hub and subscriber, from PyPI (flask-websub), in a process of their own:
``python -m tests.thirdparty_hub PORT FOLDER``.

The hub is at ``/hub`` (it takes ``hub.mode=publish`` pings, then fetches the topic); the
subscriber's callbacks are under ``/callbacks/``. Two routes let a test drive the subscriber:
``POST /control/subscribe`` (form: ``topic``, ``hub``) and ``GET /control/received`` (JSON: what
arrived, per topic).
"""

import json
import os
import sys
import threading

from celery import Celery
from flask import Flask, jsonify, request
from flask_websub.hub import Hub, SQLite3HubStorage
from flask_websub.subscriber import SQLite3SubscriberStorage, SQLite3TempSubscriberStorage, Subscriber


def make_app(folder):
    app = Flask(__name__)
    app.config["PUBLISH_SUPPORTED"] = True  # the hub takes pings (hub.mode=publish)
    celery = Celery("thirdparty-hub")
    celery.conf.task_always_eager = True  # the hub's tasks run in this process
    hub = Hub(SQLite3HubStorage(os.path.join(folder, "hub.sqlite3")), celery, REQUEST_TIMEOUT=10)
    app.register_blueprint(hub.build_blueprint(url_prefix="/hub"))
    subscriber = Subscriber(
        SQLite3SubscriberStorage(os.path.join(folder, "subscriber.sqlite3")),
        SQLite3TempSubscriberStorage(os.path.join(folder, "pending.sqlite3")),
    )
    app.register_blueprint(subscriber.build_blueprint(url_prefix="/callbacks"))
    received, lock = [], threading.Lock()

    @subscriber.add_listener
    def on_notification(topic_url, callback_id, body):
        with lock:
            received.append({"topic": topic_url, "body": body.decode()})

    confirmed = []

    @subscriber.add_success_handler
    def on_success(topic_url, callback_id, mode):
        with lock:
            confirmed.append({"topic": topic_url, "mode": mode})

    @app.route("/control/subscribe", methods=["POST"])
    def subscribe():
        callback_id = subscriber.subscribe(topic_url=request.form["topic"], hub_url=request.form["hub"], lease_seconds=3600)
        return jsonify({"callback_id": callback_id})

    @app.route("/control/received")
    def what_arrived():
        with lock:
            return json.dumps({"received": received, "confirmed": confirmed}), 200, {"Content-Type": "application/json"}

    return app


if __name__ == "__main__":
    port, folder = int(sys.argv[1]), sys.argv[2]
    make_app(folder).run(host="127.0.0.1", port=port, threaded=True)
