"""The built-in hub's endpoint (W3C WebSub 5.1): ``POST /resourcesync/hub``."""

from django.db import transaction
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt

from .. import access, clients, uris
from ..conf import app_settings
from . import limits
from .hub import BadRequest, parse_request, set_of_topic, subscribe_later


def _text(message, status):
    return HttpResponse(message + "\n", status=status, content_type="text/plain; charset=utf-8")


def _not_allowed():
    """A 405 that tells a person who opened the hub in a browser what it is and where to start."""
    if app_settings.HUB_URL:
        what = f"This Source's WebSub hub is {app_settings.HUB_URL}: subscription requests go there.\n"
    else:
        what = ("This is the WebSub hub of a ResourceSync Source. It takes subscription requests "
                "(hub.mode, hub.topic, hub.callback), POSTed as a form; it has no page to read.\n")
    start = f"What the Source publishes, and the topics to subscribe to: its Source Description, {uris.source_description_uri()}"
    response = _text(what + start, 405)
    response["Allow"] = "POST"
    return response


@csrf_exempt  # subscribers are other sites
@transaction.non_atomic_requests  # a request taken is counted at once, by every process (see limits)
def hub(request):
    """Take a subscription request: 202 once it is checked (its intent is verified next), or a
    4xx with the reason (429 with ``Retry-After`` past one of the hub's limits). Any other
    method than POST: a 405 saying what the hub is."""
    if request.method != "POST":
        return _not_allowed()
    if app_settings.HUB_URL:
        return _text(f"This Source's hub is {app_settings.HUB_URL}", 404)
    token = None
    named = set_of_topic(request.POST.get("hub.topic", ""))
    if named is not None:
        try:
            # A restricted set's channel: the subscriber sends its token (before anything is
            # said of the set's channels), and the subscription lasts as long as the token does.
            token = access.check(request, named)
        except access.Denied as denied:
            return denied.response()
    try:
        parsed = parse_request(request.POST)
    except BadRequest as exc:
        return _text(str(exc), 400)
    try:
        taken = limits.admit(clients.client_key(request), *parsed, token=token)
    except limits.Limited as limited:
        response = _text(f"Too many requests: {limited}.", 429)
        response["Retry-After"] = str(limited.retry_after)
        return response
    subscribe_later(taken)
    return _text(f"Accepted: the {taken.mode} request is verified at the callback next.", 202)
