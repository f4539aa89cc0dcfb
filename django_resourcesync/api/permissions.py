"""Who may do what through the API.

Anyone reads what the Source already publishes (the public endpoints narrow what they show
instead of refusing). Everything else is for the site's managers, with the rules of the admin:
an active staff account holding the model permission of what it does (``view`` to read, which
``change`` grants too, ``add``, ``change`` and ``delete`` to write); a superuser holds them all.
"""

from rest_framework.permissions import SAFE_METHODS, BasePermission

from ..models import ResourceSet

#: The model permission each request method needs.
METHOD_ACTIONS = {
    "GET": "view", "HEAD": "view", "OPTIONS": "view", "POST": "add", "PUT": "change", "PATCH": "change", "DELETE": "delete",
}


def holds(user, model, action):
    """Whether ``user`` is active staff holding the ``action`` permission of ``model``."""
    if not (user and user.is_authenticated and user.is_active and user.is_staff):
        return False
    opts = model._meta
    actions = [action, "change"] if action == "view" else [action]
    return any(user.has_perm(f"{opts.app_label}.{name}_{opts.model_name}") for name in actions)


def sees_every_set(request):
    """Whether the request's user manages the sets, and so sees the disabled ones and what the
    public documents do not show of them (filters, sources)."""
    return holds(request.user, ResourceSet, "view")


class IsManager(BasePermission):
    """Staff holding the model permission of the request's method on the view's model. An
    action of the view may need another permission: ``manager_actions = {"rebuild": "change"}``.

    Refused to a client that is not logged in, DRF answers 401; to a logged-in user, 403."""

    def has_permission(self, request, view):
        action = getattr(view, "manager_actions", {}).get(getattr(view, "action", None)) or METHOD_ACTIONS.get(request.method)
        return action is not None and holds(request.user, view.queryset.model, action)


class ReadByAnyone(IsManager):
    """Reads for anyone (the view shows each reader what it may see); writes for managers."""

    def has_permission(self, request, view):
        if request.method in SAFE_METHODS and getattr(view, "action", None) not in getattr(view, "manager_actions", {}):
            return True
        return super().has_permission(request, view)
