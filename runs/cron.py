"""Periodic jobs for RQ's cron scheduler: ``manage.py rqcron runs.cron``.

The reaper runs every ``NRLLM_REAPER_INTERVAL_SECONDS``. Passes overlapping
(two schedulers, a slow pass) are safe: every reaper mutation re-checks
staleness in its UPDATE.
"""

from django.conf import settings
from rq import cron

from runs.jobs import reap_job

cron.register(
    reap_job,
    settings.NRLLM_QUEUE_NAME,
    interval=settings.NRLLM_REAPER_INTERVAL_SECONDS,
    job_timeout=max(60, settings.NRLLM_REAPER_INTERVAL_SECONDS * 2),
    name="reap_stale_runs",
)
