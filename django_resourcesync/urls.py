"""URLs of the Source: include at the site root, ``path("", include("django_resourcesync.urls"))``.

The documents of a capability served live (see :mod:`.capabilities`) have routes of their own,
made from the capability table; every other document is a file of a build, found by its name.
"""

from django.urls import include, path

from . import capabilities, mementos, views
from .push import views as push_views

app_name = "resourcesync"

urlpatterns = [
    path(".well-known/resourcesync", views.source_description, name="source-description"),
    path(".well-known/resourcesync/<int:number>.xml", views.source_description_part, name="source-description-part"),
    path("resourcesync/hub", push_views.hub, name="hub"),
    # Before the sets' routes: the slug "api" is reserved for it.
    path("resourcesync/api/", include("django_resourcesync.api.urls")),
    path("resourcesync/resourcesync.xsl", views.stylesheet, name="stylesheet"),
    path("resourcesync/<slug:slug>/memento/<str:stamp>/<path:key>", mementos.memento, name="memento"),
    path("resourcesync/<slug:slug>/timemap/<path:key>", mementos.timemap, name="timemap"),
    path("resourcesync/<slug:slug>/timegate/<path:key>", mementos.timegate, name="timegate"),
    path("resourcesync/<slug:slug>/capabilitylist.xml", views.capability_list, name="capability-list"),
]
for capability in capabilities.TABLE:
    if capability.served == capabilities.LIVE:
        urlpatterns += [
            path(f"resourcesync/<slug:slug>/{capability.document}", views.live, name=capability.name,
                 kwargs={"name": capability.document, "capability": capability.name}),
            path(f"resourcesync/<slug:slug>/{capability.folder}/<path:rest>", views.live_in_folder,
                 kwargs={"capability": capability.name}),
        ]
urlpatterns.append(path("resourcesync/<slug:slug>/<path:name>", views.document, name="document"))
