"""Waking a worker for a queued run.

With ``REDIS_URL`` a job is enqueued on the RQ queue that ``manage.py
rqworker`` serves; without it (the embedded default) the run executes
in-process, in the caller. RQ's own synchronous mode is not used because it
still needs a Redis server. RQ's retry is never used either: the run row
decides retries. Jobs get no RQ timeout: a run renews its lease for as long as
it makes progress, and the lease and the reaper — not RQ — decide when it is
dead.
"""

import functools
from datetime import timedelta

from django.conf import settings
from redis import Redis
from rq import Queue

JOB_FUNCTION = "runs.jobs.execute_run_job"
JOB_OPTIONS = {"job_timeout": -1, "result_ttl": 3600, "failure_ttl": 86400}


@functools.cache
def _redis(url: str) -> Redis:
    return Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)


def run_queue() -> Queue:
    """The queue runs are dispatched on, from ``REDIS_URL`` as it is now."""
    return Queue(settings.NRLLM_QUEUE_NAME, connection=_redis(settings.REDIS_URL))


def dispatch(run_id, *, delay_seconds: float = 0) -> None:
    """Wake a worker for ``run_id``; raises if the job cannot be enqueued."""
    if not settings.REDIS_URL:
        from runs.runtime import run_queued

        run_queued(run_id)
        return
    queue = run_queue()
    if delay_seconds > 0:
        queue.enqueue_in(timedelta(seconds=delay_seconds), JOB_FUNCTION, str(run_id), **JOB_OPTIONS)
    else:
        queue.enqueue(JOB_FUNCTION, str(run_id), **JOB_OPTIONS)
