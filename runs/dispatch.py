"""Waking a worker for a queued run.

With ``REDIS_URL`` a django-rq job is enqueued; without it (the embedded
default) the run executes in-process, in the caller. RQ's own synchronous
mode is not used because it still needs a Redis server. RQ's retry is never
used either: the run row decides retries. Jobs get no RQ timeout: a run
renews its lease for as long as it makes progress, and the lease and the
reaper — not RQ — decide when it is dead.
"""

from datetime import timedelta

import django_rq
from django.conf import settings

JOB_FUNCTION = "runs.jobs.execute_run_job"


def dispatch(run_id, *, delay_seconds: float = 0) -> None:
    if not settings.REDIS_URL:
        from runs.runtime import run_queued

        run_queued(run_id)
        return
    queue = django_rq.get_queue(settings.NRLLM_QUEUE_NAME)
    options = {"job_timeout": -1, "result_ttl": 3600, "failure_ttl": 86400}
    if delay_seconds > 0:
        queue.enqueue_in(timedelta(seconds=delay_seconds), JOB_FUNCTION, str(run_id), **options)
    else:
        queue.enqueue(JOB_FUNCTION, str(run_id), **options)
