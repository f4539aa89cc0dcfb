"""The API's viewsets: sets, builds, documents, changes, pending changes, subscriptions, tokens.

Each public endpoint shows anyone only what the Source's documents already publish: the public
sets (enabled, not for partners with a token), their current documents (never a withdrawn one)
and the changes of their Change Lists. The rest is for managers (see :mod:`.permissions`).
Every error is a 4xx with a JSON reason.
"""

from django.db.models import Count, Max, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import JsonResponse
from django.urls import Resolver404, resolve
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ParseError
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.routers import APIRootView

from .. import access, capabilities
from ..models import (
    AccessToken,
    Build,
    ChangeEvent,
    Delivery,
    Document,
    LeftOut,
    PendingChange,
    Resource,
    ResourceSet,
    Subscription,
)
from ..tasks import rebuild_set_task, reconcile_set_task
from . import filters, sending, serializers
from .openapi import ApiSchema, described
from .pagination import BySlug, CursorPages, NewestFirst
from .permissions import IsManager, ReadByAnyone, holds, sees_every_set
from .throttling import ThrottledView

CAPABILITY_NAMES = [capability.name for capability in capabilities.TABLE]


class Shallow:
    """One of the site's parsers, but a body nested too deep to read (a JSON array in 50,000
    brackets) is a 400 like any malformed body, not a 500 (Python's parser recurses)."""

    def __init__(self, parser):
        self.parser = parser
        self.media_type = parser.media_type

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return self.parser.parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(_("The body is nested too deep to read.")) from None


class ApiView(ThrottledView):
    """What every view of the API shares, whatever the site's DRF defaults are: its schema
    class (so a site need not set ``DEFAULT_SCHEMA_CLASS``), the app's throttles, no filter
    backends (each view reads its own parameters), and a 401 for a client that is not logged
    in whenever one of the site's authentication classes can say how to log in."""

    schema = ApiSchema()
    filter_backends = []

    def get_parsers(self):
        return [Shallow(parser) for parser in super().get_parsers()]

    def get_authenticate_header(self, request):
        # DRF asks the first authentication class only: with session authentication first (it
        # has no challenge) a client that is not logged in would get 403. Any class that has a
        # challenge (Basic, Token) makes it a 401 that says how to authenticate.
        for authenticator in self.get_authenticators():
            header = authenticator.authenticate_header(request)
            if header:
                return header
        return None


class ApiRoot(ApiView, APIRootView):
    """The API's endpoints."""

    schema = None  # not an endpoint of the schema
    permission_classes = [AllowAny]


def _routed(path):
    try:
        return resolve(path).func is not not_found
    except Resolver404:
        return False


@csrf_exempt  # it changes nothing: a POST without a CSRF token gets the 404 too, not an HTML 403
def not_found(request, *args, **kwargs):
    """Any other path under the API: a JSON 404 (not the site's HTML page, nor a set's document:
    the slug ``api`` is reserved)."""
    detail = _("Not found.")
    if not request.path.endswith("/") and _routed(request.path + "/"):
        detail += " " + _("The API's URLs end with a slash: %(path)s/") % {"path": request.path}
    return JsonResponse({"detail": detail}, status=404)


SET_PARAMETER = OpenApiParameter("set", str, description="Only those of the set with this slug.")
SINCE = OpenApiParameter(
    "since", str, description="Only changes at or after this W3C datetime (2024-05-01T12:00:00Z, 2024-05-01)."
)
UNTIL = OpenApiParameter("until", str, description="Only changes before this W3C datetime.")
CAPABILITY_PARAMETER = OpenApiParameter("capability", str, enum=CAPABILITY_NAMES, description="Only those of this capability.")
ERRORS = {
    400: OpenApiResponse(
        OpenApiTypes.OBJECT,
        description='What cannot be understood, by parameter or field, and why: {"since": ["\'yesterday\' is not a W3C '
        'datetime, …"]}.',
    ),
    404: OpenApiResponse(serializers.ErrorSerializer, description="No such object (or not one you may see)."),
}
MANAGER_ERRORS = {
    401: OpenApiResponse(serializers.ErrorSerializer, description="Not logged in."),
    403: OpenApiResponse(serializers.ErrorSerializer, description="Not a manager of this (staff with the model permission)."),
    404: ERRORS[404],
}
# A manager reads a set with the fields of ResourceSet besides these.
SET_VIEW = OpenApiResponse(
    serializers.PublicResourceSetSerializer,
    description="The set as anyone sees it. A manager (staff with the view or change permission of resource sets) "
    "reads every field of ResourceSet besides.",
)


def _visible_sets(request):
    """Every set for a manager; for anyone else, the sets anyone may read (not those for
    partners with a token: see :mod:`django_resourcesync.access`)."""
    sets = ResourceSet.objects.all()
    return sets if sees_every_set(request) else sets.public()


@extend_schema_view(
    list=described(
        summary="Resource sets",
        description="Every set for its managers; the public sets (enabled, not for partners with a token), with what "
        "their documents show, for anyone else.",
        responses={200: SET_VIEW, 400: ERRORS[400]},
    ),
    retrieve=described(summary="A resource set", responses={200: SET_VIEW, 404: ERRORS[404]}),
    create=described(summary="Create a set (managers)",
                     responses={201: serializers.ResourceSetSerializer, 400: ERRORS[400], **MANAGER_ERRORS}),
    update=described(summary="Replace a set (managers)",
                     responses={200: serializers.ResourceSetSerializer, 400: ERRORS[400], **MANAGER_ERRORS}),
    partial_update=described(summary="Change a set (managers)",
                             responses={200: serializers.ResourceSetSerializer, 400: ERRORS[400], **MANAGER_ERRORS}),
    destroy=described(summary="Delete a set and everything it published (managers)", responses={204: None, **MANAGER_ERRORS}),
)
class ResourceSetViewSet(ApiView, viewsets.ModelViewSet):
    """The resource sets, by slug. Written by managers, validated as the admin's form does."""

    queryset = ResourceSet.objects.all()
    serializer_class = serializers.ResourceSetSerializer
    lookup_field = "slug"
    lookup_value_regex = r"[-a-zA-Z0-9_]+"
    permission_classes = [ReadByAnyone]
    pagination_class = BySlug
    manager_actions = {"rebuild": "change", "reconcile": "change"}

    def get_queryset(self):
        # Counted by subqueries: one join of both tables would multiply their rows.
        resources = Resource.objects.filter(resource_set=OuterRef("pk")).order_by().values("resource_set")
        left_out = LeftOut.objects.filter(resource_set=OuterRef("pk")).order_by().values("resource_set")
        published = Build.objects.filter(
            resource_set=OuterRef("pk"), status__in=[Build.Status.PUBLISHED, Build.Status.RETIRED]
        ).order_by().values("resource_set")
        reading = self.request.method in ("GET", "HEAD", "OPTIONS")
        # What the sets publish, read with them when they are read: the same queries for a page of any size.
        sets = (ResourceSet.objects.with_published() if reading else ResourceSet.objects).annotate(
            resource_total=Coalesce(Subquery(resources.annotate(n=Count("pk")).values("n")), Value(0)),
            left_out_total=Coalesce(Subquery(left_out.annotate(n=Count("pk")).values("n")), Value(0)),
            last_published=Subquery(published.annotate(latest=Max("finished")).values("latest")),
        )
        if reading and not sees_every_set(self.request):
            sets = sets.public()
        return sets

    def get_serializer_class(self):
        if self.action in self.manager_actions:
            return serializers.NoInputSerializer  # the browsable API's form of an action: a button
        if self.action in ("list", "retrieve") and not sees_every_set(self.request):
            return serializers.PublicResourceSetSerializer
        return serializers.ResourceSetSerializer

    @described(
        summary="Rebuild the set's documents (managers)",
        description="Sends the task resourcesync.rebuild_set. Run in process (no broker): 200, done with the builds made, "
        "or failed with the reason. Sent to a broker: 202, queued, with the task's id.",
        request=None,
        responses={200: serializers.TaskAnswerSerializer, 202: serializers.TaskAnswerSerializer,
                   409: OpenApiResponse(serializers.ErrorSerializer, description="The set is disabled."),
                   503: OpenApiResponse(serializers.ErrorSerializer, description="The broker cannot be reached."),
                   **MANAGER_ERRORS},
    )
    @action(detail=True, methods=["post"], permission_classes=[IsManager])
    def rebuild(self, request, slug=None):
        resource_set = self.get_object()
        if not resource_set.enabled:
            return Response({"detail": _("The set is disabled: enable it to build it.")}, status=status.HTTP_409_CONFLICT)
        return sending.send(rebuild_set_task, resource_set, done=sending.rebuilt)

    @described(
        summary="Reconcile the set with the site's data (managers)",
        description="Sends the task resourcesync.reconcile_set, which records the changes that bypassed the signals. "
        "Answers as rebuild does.",
        request=None,
        responses={200: serializers.TaskAnswerSerializer, 202: serializers.TaskAnswerSerializer,
                   503: OpenApiResponse(serializers.ErrorSerializer, description="The broker cannot be reached."),
                   **MANAGER_ERRORS},
    )
    @action(detail=True, methods=["post"], permission_classes=[IsManager])
    def reconcile(self, request, slug=None):
        return sending.send(reconcile_set_task, self.get_object(), done=sending.reconciled)


@extend_schema_view(
    list=described(
        summary="Builds (managers)",
        parameters=[SET_PARAMETER, CAPABILITY_PARAMETER,
                    OpenApiParameter("status", str, enum=Build.Status.values, description="Only builds in this state.")],
        responses={200: serializers.BuildSerializer(many=True), 400: ERRORS[400], **MANAGER_ERRORS},
    ),
    retrieve=described(summary="A build, with its parts and documents (managers)",
                       responses={200: serializers.BuildDetailSerializer, **MANAGER_ERRORS}),
)
class BuildViewSet(ApiView, viewsets.ReadOnlyModelViewSet):
    """Builds, newest first, with their errors and reports: managers only (a report or an error
    may hold a traceback)."""

    queryset = Build.objects.all()
    permission_classes = [IsManager]
    pagination_class = NewestFirst

    def get_queryset(self):
        builds = Build.objects.select_related("resource_set")
        if self.action == "retrieve":
            return builds.prefetch_related("parts", "files__resource_set", "files__build")
        resource_set = filters.set_param(self.request, ResourceSet.objects.all())
        if resource_set is not None:
            builds = builds.filter(resource_set=resource_set)
        capability = filters.choice_param(self.request, "capability", CAPABILITY_NAMES)
        if capability is not None:
            builds = builds.filter(capability=capability)
        state = filters.choice_param(self.request, "status", Build.Status.values)
        if state is not None:
            builds = builds.filter(status=state)
        return builds

    def get_serializer_class(self):
        return serializers.BuildDetailSerializer if self.action == "retrieve" else serializers.BuildSerializer


def _offered(sets, field):
    """``Q`` of the rows (``field`` naming their capability) of a capability their set offers:
    one term per distinct choice of capabilities, however many sets there are."""
    by_choice = {}
    for resource_set in sets:
        by_choice.setdefault(tuple(sorted(resource_set.capabilities or [])), []).append(resource_set.pk)
    offered = Q(pk__in=[])
    for choice, pks in by_choice.items():
        offered |= Q(resource_set__in=pks, **{f"{field}__in": list(choice)})
    return offered


@extend_schema_view(
    list=described(
        summary="Published documents",
        description="The documents of the sets' current builds, as their Capability Lists point at them (not withdrawn).",
        parameters=[SET_PARAMETER, CAPABILITY_PARAMETER],
        responses={200: serializers.DocumentSerializer(many=True), 400: ERRORS[400]},
    ),
    retrieve=described(summary="A published document", responses={200: serializers.DocumentSerializer, 404: ERRORS[404]}),
)
class DocumentViewSet(ApiView, viewsets.ReadOnlyModelViewSet):
    """The documents the sets publish now: those of their published builds, of capabilities
    they offer, not withdrawn; of the public sets for anyone, of every set for managers."""

    queryset = Document.objects.all()
    serializer_class = serializers.DocumentSerializer
    permission_classes = [AllowAny]  # read-only; every other method is a 405
    pagination_class = CursorPages

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema's generator: no database needed
            return Document.objects.none()
        sets = _visible_sets(self.request)
        resource_set = filters.set_param(self.request, sets)
        if resource_set is not None:
            sets = [resource_set]
        documents = Document.objects.filter(
            _offered(sets, "build__capability"), build__status=Build.Status.PUBLISHED, withdrawn__isnull=True
        ).select_related("resource_set", "build")
        capability = filters.choice_param(self.request, "capability", CAPABILITY_NAMES)
        if capability is not None:
            documents = documents.filter(build__capability=capability)
        return documents


@extend_schema_view(
    list=described(
        summary="The change log",
        description="Change events, oldest first, as Change Lists list them; follow next to the end for every event once. "
        "Anyone sees those of the public sets that offer a Change List; managers, every set's.",
        parameters=[
            SET_PARAMETER,
            OpenApiParameter("change", str, enum=ChangeEvent.Change.values, description="Only changes of this kind."),
            SINCE, UNTIL,
        ],
        responses={200: serializers.ChangeEventSerializer(many=True), 400: ERRORS[400]},
    ),
    retrieve=described(summary="A change event", responses={200: serializers.ChangeEventSerializer, 404: ERRORS[404]}),
)
class ChangeEventViewSet(ApiView, viewsets.ReadOnlyModelViewSet):
    """The change log. A Change List already shows its events to anyone, so the events of the
    public sets that offer Change Lists are public; nothing else is."""

    queryset = ChangeEvent.objects.all()
    serializer_class = serializers.ChangeEventSerializer
    permission_classes = [AllowAny]  # read-only; every other method is a 405
    pagination_class = CursorPages

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema's generator: no database needed
            return ChangeEvent.objects.none()
        manager = holds(self.request.user, ChangeEvent, "view")
        if manager:
            sets = ResourceSet.objects.all()
        else:
            sets = [s for s in ResourceSet.objects.public() if s.has_capability(capabilities.CHANGELIST)]
            sets = ResourceSet.objects.filter(pk__in=[s.pk for s in sets])
        events = ChangeEvent.objects.select_related("resource_set", "changelist")
        if not manager:
            # Only the events of lists that are served: an archived list is served by the Change
            # List Archive alone, where the set offers one.
            archives = [s.pk for s in sets if s.has_capability(capabilities.CHANGELIST_ARCHIVE)]
            events = events.filter(Q(changelist__archived__isnull=True) | Q(resource_set__in=archives))
        resource_set = filters.set_param(self.request, sets)
        events = events.filter(resource_set=resource_set) if resource_set is not None else events.filter(resource_set__in=sets)
        if self.action == "retrieve":
            return events
        change = filters.choice_param(self.request, "change", ChangeEvent.Change.values)
        if change is not None:
            events = events.filter(change=change)
        since, until = filters.datetime_param(self.request, "since"), filters.datetime_param(self.request, "until")
        if since is not None:
            events = events.filter(datetime__gte=since)
        if until is not None:
            events = events.filter(datetime__lt=until)
        return events


@extend_schema_view(
    list=described(summary="Pending changes (managers)",
                   responses={200: serializers.PendingChangeSerializer(many=True), **MANAGER_ERRORS}),
    retrieve=described(summary="A pending change (managers)",
                       responses={200: serializers.PendingChangeSerializer, **MANAGER_ERRORS}),
)
class PendingChangeViewSet(ApiView, viewsets.ReadOnlyModelViewSet):
    """Changes recorded but not yet written into the change log, oldest first: managers only."""

    queryset = PendingChange.objects.select_related("resource_set")
    serializer_class = serializers.PendingChangeSerializer
    permission_classes = [IsManager]
    pagination_class = CursorPages


@extend_schema_view(
    list=described(summary="Subscriptions at the built-in hub (managers)", parameters=[SET_PARAMETER],
                   responses={200: serializers.SubscriptionSerializer(many=True), 400: ERRORS[400], **MANAGER_ERRORS}),
    retrieve=described(summary="A subscription (managers)",
                       responses={200: serializers.SubscriptionSerializer, **MANAGER_ERRORS}),
    destroy=described(summary="End a subscription (managers)", responses={204: None, **MANAGER_ERRORS}),
)
class SubscriptionViewSet(ApiView, mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin,
                          viewsets.GenericViewSet):
    """Who is subscribed at the built-in hub: managers read them and may end one (delete it).
    Secrets are never shown."""

    queryset = Subscription.objects.all()
    serializer_class = serializers.SubscriptionSerializer
    permission_classes = [IsManager]
    pagination_class = CursorPages

    def get_queryset(self):
        subscriptions = Subscription.objects.select_related("resource_set").annotate(
            failures=Count("deliveries", filter=Q(deliveries__state=Delivery.State.FAILED))
        )
        resource_set = filters.set_param(self.request, ResourceSet.objects.all())
        return subscriptions if resource_set is None else subscriptions.filter(resource_set=resource_set)


@extend_schema_view(
    list=described(summary="Access tokens of partners (managers)",
                   responses={200: serializers.AccessTokenSerializer(many=True), **MANAGER_ERRORS}),
    retrieve=described(summary="An access token (managers)",
                       responses={200: serializers.AccessTokenSerializer, **MANAGER_ERRORS}),
    create=described(
        summary="Issue a token to a Destination (managers)",
        description="The answer holds the token itself, this once: only its digest is kept.",
        request=serializers.AccessTokenSerializer,
        responses={201: serializers.IssuedTokenSerializer, 400: ERRORS[400], **MANAGER_ERRORS},
    ),
    partial_update=described(summary="Change a token's Destination, sets or expiry (managers)",
                             responses={200: serializers.AccessTokenSerializer, 400: ERRORS[400], **MANAGER_ERRORS}),
    update=described(summary="Replace a token's Destination, sets and expiry (managers)",
                     responses={200: serializers.AccessTokenSerializer, 400: ERRORS[400], **MANAGER_ERRORS}),
)
class AccessTokenViewSet(ApiView, mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                         mixins.UpdateModelMixin, viewsets.GenericViewSet):
    """Tokens issued to Destinations for the sets for partners (see :mod:`django_resourcesync.access`):
    managers issue them, read them (never the token itself, shown once when issued) and revoke
    them, which takes effect at once."""

    queryset = AccessToken.objects.all()
    serializer_class = serializers.AccessTokenSerializer
    permission_classes = [IsManager]
    pagination_class = CursorPages
    manager_actions = {"revoke": "change"}

    def get_queryset(self):
        return AccessToken.objects.prefetch_related("sets")

    def get_serializer_class(self):
        if self.action == "revoke":
            return serializers.NoInputSerializer
        return serializers.AccessTokenSerializer

    def create(self, request, *args, **kwargs):
        serializer = serializers.AccessTokenSerializer(data=request.data, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        record, token = access.issue(data["name"], data["sets"], expires=data.get("expires"))
        answer = serializers.IssuedTokenSerializer(record, context=self.get_serializer_context()).data
        # The token is in this answer alone: no cache may keep it.
        return Response({**answer, "token": token}, status=status.HTTP_201_CREATED, headers={"Cache-Control": "no-store"})

    @described(
        summary="Revoke a token (managers)",
        description="From now on the token opens nothing, and the subscriptions made with it end.",
        request=None,
        responses={200: serializers.AccessTokenSerializer, **MANAGER_ERRORS},
    )
    @action(detail=True, methods=["post"], permission_classes=[IsManager])
    def revoke(self, request, pk=None):
        record = self.get_object()
        access.revoke(AccessToken.objects.filter(pk=record.pk))
        record.refresh_from_db()
        return Response(serializers.AccessTokenSerializer(record, context=self.get_serializer_context()).data)
