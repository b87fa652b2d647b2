"""Periodic jobs for RQ's cron scheduler: ``manage.py rqcron runs.cron``.

The reaper runs every ``NRLLM_REAPER_INTERVAL_SECONDS``. Passes overlapping
(two schedulers, a slow pass) are safe: every reaper mutation re-checks
staleness in its UPDATE.

Schedules (G23) every ``NRLLM_SCHEDULE_INTERVAL_SECONDS``: each slot
fires in a transaction that inserts its unique row.

Retention, when ``NRLLM_RETENTION_DAYS`` is set, every
``NRLLM_RETENTION_INTERVAL_SECONDS``: two passes at once are safe too, each
batch locks its runs and skips those another holds.
"""

from django.conf import settings
from rq import cron

from runs.jobs import fire_schedules_job, prune_job, reap_job

cron.register(
    reap_job,
    settings.NRLLM_QUEUE_NAME,
    interval=settings.NRLLM_REAPER_INTERVAL_SECONDS,
    job_timeout=max(60, settings.NRLLM_REAPER_INTERVAL_SECONDS * 2),
    name="reap_stale_runs",
)

# Schedules (G23) every ``NRLLM_SCHEDULE_INTERVAL_SECONDS``: two passes at
# once (two schedulers, a slow pass) are safe, each slot's row is unique.
cron.register(
    fire_schedules_job,
    settings.NRLLM_QUEUE_NAME,
    interval=settings.NRLLM_SCHEDULE_INTERVAL_SECONDS,
    job_timeout=max(60, settings.NRLLM_SCHEDULE_INTERVAL_SECONDS * 2),
    name="fire_schedules",
)

if settings.NRLLM_RETENTION_DAYS:
    cron.register(
        prune_job,
        settings.NRLLM_QUEUE_NAME,
        # The age goes with the job: the worker that runs it may not have
        # the setting (it would read 0, and prune_job would do nothing).
        kwargs={"days": settings.NRLLM_RETENTION_DAYS},
        interval=settings.NRLLM_RETENTION_INTERVAL_SECONDS,
        # The pass stops itself after half the interval; this bounds one that
        # overruns anyway (its batch's transaction rolls back: nothing half-deleted).
        job_timeout=settings.NRLLM_RETENTION_INTERVAL_SECONDS,
        name="prune_runs",
    )
