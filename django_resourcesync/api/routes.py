"""The API's router: one route per viewset, and the root that lists them.

Apart from the URLconf (:mod:`.urls`) so that the schema view can describe exactly these routes
without importing the URLconf that routes to it.
"""

from rest_framework.routers import DefaultRouter

from . import views


class Router(DefaultRouter):
    APIRootView = views.ApiRoot


router = Router()
router.register("sets", views.ResourceSetViewSet, basename="set")
router.register("builds", views.BuildViewSet, basename="build")
router.register("documents", views.DocumentViewSet, basename="document")
router.register("changes", views.ChangeEventViewSet, basename="change")
router.register("pending", views.PendingChangeViewSet, basename="pending-change")
router.register("subscriptions", views.SubscriptionViewSet, basename="subscription")
router.register("tokens", views.AccessTokenViewSet, basename="token")
