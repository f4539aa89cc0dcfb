"""URLs of the Source: include at the site root, ``path("", include("django_resourcesync.urls"))``."""

from django.urls import path

from . import views

app_name = "resourcesync"

urlpatterns = [
    path(".well-known/resourcesync", views.source_description, name="source-description"),
    path("resourcesync/<slug:slug>/capabilitylist.xml", views.capability_list, name="capability-list"),
    path("resourcesync/<slug:slug>/changelist.xml", views.changelist, name="changelist", kwargs={"name": "changelist.xml"}),
    path("resourcesync/<slug:slug>/changelist/<int:number>.xml", views.changelist_part, name="changelist-part"),
    path("resourcesync/<slug:slug>/changedump.xml", views.changedump_document, kwargs={"name": "changedump.xml"}),
    path("resourcesync/<slug:slug>/changedump/<str:name>", views.changedump_in_folder),
    path("resourcesync/<slug:slug>/<path:name>", views.document, name="document"),
]
