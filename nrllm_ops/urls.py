"""URL routes: the admin (the operator console, where ``/`` leads) and
django-rq's dashboard, which the console links to when Redis is configured
(read-only for staff, ``console.queue_dashboard``); the API under ``/api/``."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from api import errors
from console import queue_dashboard, site
from nrllm_ops import observability

urlpatterns = [
    # The app has no site of its own: its front page is the console.
    path("", RedirectView.as_view(pattern_name="admin:index")),
    path("healthz", observability.healthz),
    path("readyz", observability.readyz),
    path("metrics", observability.metrics),
    # Before admin/, which would otherwise claim the path. Staff may look
    # (django-rq checks); only a superuser may change the queue there.
    path("admin/django-rq/", queue_dashboard.urls()),
    path("admin/", admin.site.urls),
    path("api/", include("api.urls")),
]

# Under /api/ a URL no route matches is an error in the API's shape too.
handler400 = "api.errors.bad_request"
# In the console, a 403 in the admin's frame with a way back; under /api/,
# the API's shape.
handler403 = errors.in_the_api_shape(site.forbidden, 403, "permission_denied")
handler404 = "api.errors.not_found"
