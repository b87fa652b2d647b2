"""URL routes: the admin (the operator console) and django-rq's dashboard,
which the console links to when Redis is configured."""

from django.contrib import admin
from django.urls import include, path

from nrllm_ops import observability

urlpatterns = [
    path("healthz", observability.healthz),
    path("readyz", observability.readyz),
    path("metrics", observability.metrics),
    # Before admin/, which would otherwise claim the path; staff only (django-rq checks).
    path("admin/django-rq/", include("django_rq.urls")),
    path("admin/", admin.site.urls),
    path("api/", include("api.urls")),
]
