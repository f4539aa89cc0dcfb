from django.urls import path

from . import views

app_name = "repository"

urlpatterns = [
    path("", views.home, name="home"),
    path("items/<int:pk>/", views.item, name="item"),
    path("items/<int:pk>/metadata.xml", views.item_metadata, name="item-metadata"),
    path("items/<int:item>/files/<int:pk>/<path:name>", views.item_file, name="file"),
]
