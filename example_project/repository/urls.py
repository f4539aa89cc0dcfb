from django.urls import path

from . import views

app_name = "repository"

urlpatterns = [
    path("", views.home, name="home"),
    path("about/resourcesync/", views.about_source, name="about-source"),
    path("about/sets/<slug:slug>/", views.about_set, name="about-set"),
    path("items/<int:pk>/", views.item, name="item"),
    path("items/<int:pk>/metadata.xml", views.item_metadata, name="item-metadata"),
    path("items/<int:item>/files/<int:pk>/<path:name>", views.item_file, name="file"),
]
