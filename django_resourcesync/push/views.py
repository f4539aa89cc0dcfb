"""The built-in hub's endpoint (W3C WebSub 5.1): ``POST /resourcesync/hub``."""

from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from .. import access
from ..conf import app_settings
from .hub import BadRequest, parse_request, set_of_topic, subscribe_later


def _text(message, status):
    return HttpResponse(message + "\n", status=status, content_type="text/plain; charset=utf-8")


@csrf_exempt  # subscribers are other sites
@require_POST
def hub(request):
    """Take a subscription request: 202 once it is checked (its intent is verified next), or a
    4xx with the reason."""
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
    mode = parsed[0]
    subscribe_later(*parsed, token=token)
    return _text(f"Accepted: the {mode} request is verified at the callback next.", 202)
