"""Endpoints for orchestrators and monitoring: ``/healthz``, ``/readyz``, ``/metrics``."""

import contextlib
import hmac

from django.conf import settings
from django.db import connection
from django.http import HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client import REGISTRY as PROCESS_REGISTRY

from ground import metrics_files
from runs.models.metrics import RunStateCollector


def healthz(request):
    """The process is up (no dependency is checked)."""
    return JsonResponse({"status": "ok"})


def readyz(request):
    """The database answers and can make a commit durable, and Redis (when
    configured) answers: 200, else 503 naming what failed."""
    checks = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as error:  # noqa: BLE001 - any failure means not ready
        checks["database"] = f"error: {type(error).__name__}"
    else:
        from ground.durability import refusal

        try:
            problem = refusal()
        except Exception as error:  # noqa: BLE001
            problem = type(error).__name__
        checks["durable_commits"] = "ok" if problem is None else f"error: {problem}"
    if settings.REDIS_URL:
        from runs.queue.dispatch import run_queue

        try:
            run_queue().connection.ping()
            checks["redis"] = "ok"
        except Exception as error:  # noqa: BLE001
            checks["redis"] = f"error: {type(error).__name__}"
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse({"ready": ready, "checks": checks}, status=200 if ready else 503)


def _allowed(request) -> bool:
    token = settings.NRLLM_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and hmac.compare_digest(header, f"Bearer {token}"):
        return True
    user = getattr(request, "user", None)
    return bool(user and user.is_active and user.is_staff)


def metrics(request):
    """Prometheus metrics: a bearer ``NRLLM_METRICS_TOKEN`` or a staff session."""
    if not _allowed(request):
        return HttpResponse("metrics need a bearer token or a staff login\n", status=401)
    registry = CollectorRegistry()
    multiprocess_dir = metrics_files.directory()
    if multiprocess_dir is not None:
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry, path=str(multiprocess_dir))
    else:
        for collector in list(PROCESS_REGISTRY._collector_to_names):
            registry.register(collector)
    registry.register(RunStateCollector())
    if settings.REDIS_URL:
        from django_rq.contrib.prometheus import RQCollector

        registry.register(RQCollector())
    # Workers fold their exited work horses' files meanwhile.
    reading = (
        contextlib.nullcontext()
        if multiprocess_dir is None
        else metrics_files.reading_lock(multiprocess_dir)
    )
    with reading:
        exposition = generate_latest(registry)
    return HttpResponse(exposition, content_type=CONTENT_TYPE_LATEST)
