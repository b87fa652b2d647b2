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
from datetime import UTC, datetime, timedelta

from django.conf import settings
from redis import Redis
from rq import Queue
from rq.job import Job, JobStatus

JOB_FUNCTION = "runs.jobs.execute_run_job"
JOB_OPTIONS = {"job_timeout": -1, "result_ttl": 3600, "failure_ttl": 86400}


@functools.cache
def _redis(url: str) -> Redis:
    return Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)


def run_queue() -> Queue:
    """The queue runs are dispatched on, from ``REDIS_URL`` as it is now."""
    return Queue(settings.NRLLM_QUEUE_NAME, connection=_redis(settings.REDIS_URL))


def job_id_for(run_id, requeue_count: int) -> str:
    """One job id per run and attempt, so the reaper can ask Redis whether the
    job that should wake a queued run still exists."""
    return f"run-{run_id}-{requeue_count}"


def dispatch(run_id, *, requeue_count: int = 0, delay_seconds: float = 0) -> None:
    """Wake a worker for ``run_id``; raises if the job cannot be enqueued."""
    if not settings.REDIS_URL:
        from runs.runtime import run_queued

        run_queued(run_id)
        return
    queue = run_queue()
    options = {**JOB_OPTIONS, "job_id": job_id_for(run_id, requeue_count)}
    if delay_seconds > 0:
        queue.enqueue_in(timedelta(seconds=delay_seconds), JOB_FUNCTION, str(run_id), **options)
    else:
        queue.enqueue(JOB_FUNCTION, str(run_id), **options)


def dispatch_many(runs: list[tuple[str, int]]) -> None:
    """Wake a worker for each ``(run_id, requeue_count)`` now, in one Redis
    pipeline (the reaper's requeues); raises if the pipeline fails."""
    if not runs:
        return
    if not settings.REDIS_URL:
        for run_id, requeue_count in runs:
            dispatch(run_id, requeue_count=requeue_count)
        return
    queue = run_queue()
    queue.enqueue_many(
        [
            Queue.prepare_data(
                JOB_FUNCTION,
                args=(str(run_id),),
                timeout=JOB_OPTIONS["job_timeout"],
                result_ttl=JOB_OPTIONS["result_ttl"],
                failure_ttl=JOB_OPTIONS["failure_ttl"],
                job_id=job_id_for(run_id, requeue_count),
            )
            for run_id, requeue_count in runs
        ]
    )


def live_job_ids(job_ids: list[str], *, started_within_seconds: float) -> set[str]:
    """Those of ``job_ids`` that will still wake a worker.

    A job's status alone cannot say so: a worker killed right after taking a
    job off the queue leaves it marked ``queued`` in no queue at all. So a
    job is live when its id is in the queue's list or in the scheduled or
    deferred registries — or when it started so recently that its worker is
    presumably claiming the run right now.
    """
    if not settings.REDIS_URL or not job_ids:
        return set()
    queue = run_queue()
    waiting = (
        set(queue.get_job_ids())
        | set(queue.scheduled_job_registry.get_job_ids())
        | set(queue.deferred_job_registry.get_job_ids())
    )
    live = {job_id for job_id in job_ids if job_id in waiting}
    started_after = datetime.now(UTC) - timedelta(seconds=started_within_seconds)
    others = [job_id for job_id in job_ids if job_id not in live]
    for job in Job.fetch_many(others, connection=queue.connection):
        if (
            job is not None
            and job.get_status(refresh=False) == JobStatus.STARTED
            and job.started_at is not None
            and job.started_at > started_after
        ):
            live.add(job.id)
    return live
