"""django-rq's dashboard, mounted read-only for staff and whole for superusers.

Only for staff who may view runs in every team (``may_see_queue``): its
jobs are every team's, and a team's member is refused it (G22).

Its mutating views stop a job (killing the work horse under a running run),
delete or requeue jobs and empty a queue or a registry, through none of the
runs' guarded transitions, permissions or audit (G11). So they are refused
deny-by-default: a request passes for a staff user only when it names a view
listed below as read-only *and* uses a safe method; anything else — every
POST, every confirmation page, a view a django-rq upgrade adds — needs a
superuser (who holds every operator permission anyway). Superuser rather than
a permission of its own: a user allowed to kill a worker under a run can do
anything the console can, and more.

Every view, its read-only ones included, needs a staff user: anyone else
gets the admin's login page. That covers django-rq's token-authenticated
``stats.json/<token>/`` and ``metrics``: ``RQ_API_TOKEN`` is not set here,
and scrapers read django-rq's queue metrics from ``/metrics`` under
``NRLLM_METRICS_TOKEN`` (``nrllm_ops.observability``). Letting anonymous
requests through to them only let a non-ASCII token reach django-rq's
``compare_digest``, which raises on one (a 500); a token that is not ASCII
is a 404 even for staff, so none ever reaches it.

Without ``REDIS_URL`` (the embedded default, ``make run``) there is no RQ
queue: runs wait in the database for the embedded worker. django-rq would
still read ``RQ_QUEUES``, whose URL then falls back to a local Redis that is
none of this deployment's (a 500 when nothing listens there, someone else's
queue when something does). So every dashboard URL answers, for staff, with
a page in the admin's frame that says so, and no view of django-rq runs.
"""

import functools

from django.conf import settings
from django.contrib import admin
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import BadRequest, PermissionDenied
from django.http import Http404
from django.template.response import TemplateResponse
from django.urls import URLPattern, include, reverse
from django_rq import urls as django_rq_urls

from teams import access

#: The dashboard's URL names whose views only read (on GET and HEAD). The
#: workers and cron pages prune dead workers' and schedulers' registry
#: entries as they read, which changes nothing a run depends on.
READ_ONLY_VIEWS = frozenset(
    {
        "home",
        "home_json",
        "metrics",
        "jobs",
        "queue_details",
        "finished_jobs",
        "failed_jobs",
        "scheduled_jobs",
        "started_jobs",
        "deferred_jobs",
        "job_detail",
        "result_detail",
        "workers",
        "worker_details",
        "scheduler_jobs",
        "cron_scheduler_detail",
        "cron_job_detail",
    }
)
SAFE_METHODS = frozenset({"GET", "HEAD"})
#: Held globally (every team), it opens the dashboard's read-only views.
QUEUE_PERMISSION = "runs.view_agentrun"


#: django-rq's ``metrics`` view swaps its process-wide registry for one
#: restricted to these names, hiding every other metric until a restart.
RESTRICTING_PARAMETER = "name[]"


def superuser_unless_read_only(view, url_name: str):
    """``view`` as a staff user may reach it: as it is when ``url_name`` is
    read-only and the method safe; otherwise only for a superuser — a staff
    user gets 403, anyone else the admin's login page. A non-ASCII token is
    404 and a restricted ``metrics`` request 400, for superusers too.
    Without ``REDIS_URL``, ``no_redis_queue`` instead, whatever the view."""
    read_only = url_name in READ_ONLY_VIEWS

    @functools.wraps(view)
    def guarded(request, *args, **kwargs):
        user = request.user
        if not (user.is_active and user.is_staff):
            return redirect_to_login(request.get_full_path(), reverse("admin:login"))
        if not may_see_queue(user):
            raise PermissionDenied(
                "the queue dashboard shows every team's jobs: it takes "
                f"{QUEUE_PERMISSION!r} in every team (platform staff), not a team's role"
            )
        if not settings.REDIS_URL:
            return no_redis_queue(request)
        if not str(kwargs.get("token") or "").isascii():
            raise Http404("no such token")
        if url_name == "metrics" and RESTRICTING_PARAMETER in request.GET:
            raise BadRequest(f"{RESTRICTING_PARAMETER} would hide every other metric: refused")
        if (read_only and request.method in SAFE_METHODS) or user.is_superuser:
            return view(request, *args, **kwargs)
        raise PermissionDenied(
            "only a superuser may change the queue from django-rq's dashboard; "
            "operators act on runs from the console"
        )

    guarded.guards_queue_dashboard = True
    return guarded


def may_see_queue(user) -> bool:
    """Whether ``user`` may look at the dashboard: staff holding
    ``QUEUE_PERMISSION`` globally. The jobs are the deployment's, every
    team's together, so a role in some teams is not enough (G22)."""
    return user.is_active and user.is_staff and access.holds_globally(user, QUEUE_PERMISSION)


def no_redis_queue(request):
    """The dashboard's page where there is no Redis: what runs runs instead,
    in the admin's frame. Nothing asks Redis; nothing is done."""
    return TemplateResponse(
        request,
        "admin/queue_dashboard_without_redis.html",
        {**admin.site.each_context(request), "title": "Queue dashboard: no Redis queue"},
    )


def _guarded(pattern: URLPattern) -> URLPattern:
    return URLPattern(
        pattern.pattern,
        superuser_unless_read_only(pattern.callback, pattern.name),
        pattern.default_args,
        pattern.name,
    )


def urls():
    """django-rq's URL patterns, each behind ``superuser_unless_read_only``,
    for ``path(..., queue_dashboard.urls())``."""
    patterns = [_guarded(pattern) for pattern in django_rq_urls.urlpatterns]
    return include((patterns, django_rq_urls.app_name))
