from django.contrib import admin
from django.urls import include, path
from library import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("documents/<int:pk>.txt", views.document, name="document"),
    # At the root, with no prefix: the Source Description is /.well-known/resourcesync.
    path("", include("django_resourcesync.urls")),
]
