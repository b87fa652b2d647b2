"""URL routes: the admin (the operator console) and, with Redis, django-rq's dashboard."""

from django.conf import settings
from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("admin/", admin.site.urls)]

if settings.REDIS_URL:
    # Without Redis (the embedded default) there is no queue to show.
    urlpatterns.insert(0, path("admin/django-rq/", include("django_rq.urls")))
