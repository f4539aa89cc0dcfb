from django.contrib import admin
from django.urls import include, path

from django_resourcesync import discovery

urlpatterns = [
    path("admin/", admin.site.urls),
    path("robots.txt", discovery.robots_txt),
    path("", include("example_project.repository.urls")),
    path("", include("django_resourcesync.urls")),
]
