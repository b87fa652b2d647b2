"""The RQ job functions, as RQ stores them in Redis (what a worker loads for
them once is ``runs.workers.preload``).

``execute_run_job`` never raises for a run's outcome: the run row holds the
outcome, and RQ must not retry or record a failure of its own."""

import logging
import time

from django.db import close_old_connections, connection

logger = logging.getLogger(__name__)


def execute_run_job(run_id: str) -> None:
    from runs.runtime import run_queued

    close_old_connections()
    # No ``SELECT 1`` health check (CONN_HEALTH_CHECKS) on a kept connection:
    # the job's first statement is the claim, and a claim that fails on a dead
    # connection drops it and claims on a new one (transitions.claim). The
    # check would add a round trip to every job.
    connection.health_check_done = True
    try:
        run_queued(run_id)
    except Exception:
        # Only infrastructure failures reach here (the database away at claim
        # time, say); the run row is unchanged and recovery is the reaper's.
        logger.exception("run=%s job could not execute the run", run_id)
    finally:
        close_old_connections()


def prune_job(days: int) -> str:
    """Retention as a periodic RQ job (see ``runs/cron.py``): one pass over
    the runs ended more than ``days`` ago (the scheduler's
    ``NRLLM_RETENTION_DAYS``), stopped between batches after half the
    interval (the next pass goes on from there). Nothing when ``days`` is
    not a positive number."""
    if not isinstance(days, int) or days < 1:
        return f"retention is off (days={days!r}): nothing pruned"
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    from runs.reaper.retention import prune_runs

    close_old_connections()
    try:
        return prune_runs(
            timezone.now() - timedelta(days=days),
            batch_size=settings.NRLLM_RETENTION_BATCH_SIZE,
            deadline=time.monotonic() + settings.NRLLM_RETENTION_INTERVAL_SECONDS / 2,
        ).summary()
    finally:
        close_old_connections()


def reap_job() -> str:
    """The reaper as a periodic RQ job (see ``runs/cron.py``)."""
    from runs.reaper import reap_stale_runs

    close_old_connections()
    try:
        return reap_stale_runs().summary()
    finally:
        close_old_connections()


def fire_schedules_job() -> str:
    """The schedules' pass as a periodic RQ job (see ``runs/cron.py``, G23)."""
    from triggers.firing import fire_due_schedules

    close_old_connections()
    try:
        return fire_due_schedules().summary()
    finally:
        close_old_connections()
