"""Waking a worker for a queued run.

With ``REDIS_URL`` a job is enqueued on its team's RQ queue
(``team_queue_name``), which every ``manage.py rqworker`` of the
deployment's queue also serves, taking from the teams' queues in turn
(``runs.workers.team_queues``): one team's backlog does not hold back
another's runs (G22). A delayed job (a retry's backoff) and one of a
run whose team the caller does not know go on the deployment's queue,
whose scheduler is the one every worker starts with.

Without ``REDIS_URL`` (the embedded default) a run due now executes
in-process, in the caller, and a delayed one (a retry's backoff) is left
``queued`` for ``manage.py embedded_worker`` to execute when due. RQ's own
synchronous mode is not used because it still needs a Redis server. RQ's
retry is never used either: the run row decides retries. Jobs get no RQ
timeout: a run renews its lease for as long as it makes progress, and the
lease and the reaper — not RQ — decide when it is dead.
"""

import contextlib
import functools
import logging
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta

import redis
from django.conf import settings
from django.db import DatabaseError
from django.utils.module_loading import import_string
from redis import Redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.utils import str_to_date

from runs import transitions
from runs.providers.failures import classify, is_retryable

logger = logging.getLogger(__name__)

JOB_FUNCTION = "runs.jobs.execute_run_job"
#: Without Redis the caller is the worker. Named, as RQ names the job
#: function: the queue sits below the runtime it wakes (the runtime
#: dispatches retries), so it never imports it.
RUN_IN_CALLER = "runs.runtime.run_queued"
JOB_OPTIONS = {"job_timeout": -1, "result_ttl": 3600, "failure_ttl": 86400}


@functools.cache
def _redis(url: str) -> Redis:
    # A concurrent worker's runs dispatch their retries from a thread each:
    # redis-py 8 refuses a connection past 100 rather than wait.
    return Redis.from_url(
        url,
        socket_connect_timeout=5,
        socket_timeout=10,
        max_connections=max(100, settings.NRLLM_WORKER_CONCURRENCY + 10),
    )


def run_queue(team_id: int | None = None) -> Queue:
    """The queue a run of ``team_id`` is dispatched on (None: the
    deployment's queue, ``NRLLM_QUEUE_NAME``), from ``REDIS_URL`` as it is now."""
    name = settings.NRLLM_QUEUE_NAME if team_id is None else team_queue_name(team_id)
    return Queue(name, connection=_redis(settings.REDIS_URL))


#: What a team's queue is named after: the deployment's queue, this, the team's id.
TEAM_QUEUE_INFIX = "-team-"


def team_queue_name(team_id: int) -> str:
    """The RQ queue of one team's runs due now."""
    return f"{settings.NRLLM_QUEUE_NAME}{TEAM_QUEUE_INFIX}{team_id}"


def job_id_for(run_id, dispatch_count: int) -> str:
    """The id of the job that wakes a run queued for the ``dispatch_count``-th
    time, so the reaper can ask Redis whether it still exists. Never the
    same twice for a run: RQ keeps an old job key's expiry, and a job saved
    under a finished job's id could vanish with it."""
    return f"run-{run_id}-{dispatch_count}"


def dispatch(
    run_id, *, dispatch_count: int = 0, delay_seconds: float = 0, team_id: int | None = None
) -> None:
    """Wake a worker for ``run_id`` of ``team_id``; raises if the job cannot be enqueued."""
    if not settings.REDIS_URL:
        _execute_in_caller(run_id, delay_seconds)
        return
    options = {**JOB_OPTIONS, "job_id": job_id_for(run_id, dispatch_count)}
    if delay_seconds > 0:
        run_queue().enqueue_in(
            timedelta(seconds=delay_seconds), JOB_FUNCTION, str(run_id), **options
        )
    else:
        run_queue(team_id).enqueue(JOB_FUNCTION, str(run_id), **options)


def dispatch_many(runs: list[tuple[str, int, int | None]], *, at_front: bool = False) -> None:
    """Wake a worker for each ``(run_id, dispatch_count, team_id)`` now, in
    one Redis pipeline (the reaper's requeues, woken held runs: ``at_front``
    of their queues, before the runs queued after them); raises if the
    pipeline fails."""
    if not runs:
        return
    if not settings.REDIS_URL:
        for run_id, _dispatch_count, _team_id in runs:
            _execute_in_caller(run_id, 0)
        return
    by_team = {}
    for run_id, dispatch_count, team_id in runs:
        by_team.setdefault(team_id, []).append((run_id, dispatch_count))
    connection = _redis(settings.REDIS_URL)
    with connection.pipeline() as pipeline:
        for team_id, team_runs in by_team.items():
            run_queue(team_id).enqueue_many(
                [_job_data(run_id, count, at_front) for run_id, count in team_runs],
                pipeline=pipeline,
            )
        pipeline.execute()


def _job_data(run_id, dispatch_count: int, at_front: bool):
    return Queue.prepare_data(
        JOB_FUNCTION,
        at_front=at_front,
        args=(str(run_id),),
        timeout=JOB_OPTIONS["job_timeout"],
        result_ttl=JOB_OPTIONS["result_ttl"],
        failure_ttl=JOB_OPTIONS["failure_ttl"],
        job_id=job_id_for(run_id, dispatch_count),
    )


def dispatch_or_fail(
    run_id, *, dispatch_count: int, delay_seconds: float = 0, team_id: int | None = None
) -> None:
    """Dispatch the job of the run's ``dispatch_count``-th time in the queue.

    The run row is the state (G4): if Redis cannot take the job — away,
    read-only in a failover, out of memory, refusing our credentials — the
    run stays ``queued``, due as it is, and the reaper dispatches it again
    once Redis is back (G7). Only a failure that is not Redis's (a
    ``REDIS_URL`` that is not a Redis URL, say) fails the run, with a dead
    letter.
    """
    try:
        dispatch(
            run_id, dispatch_count=dispatch_count, delay_seconds=delay_seconds, team_id=team_id
        )
    except Exception as error:
        failure_class = classify(error)
        if isinstance(error, redis.RedisError) or is_retryable(failure_class):
            logger.warning(
                "run=%s dispatch failed (%s: %s); left queued for the reaper to dispatch again",
                run_id,
                type(error).__name__,
                error,
            )
            return
        logger.exception("run=%s dispatch failed", run_id)
        try:
            transitions.fail_dispatch(run_id, dispatch_count, error, failure_class)
        except DatabaseError:
            logger.exception("run=%s could not be marked dispatch_failed", run_id)


def dispatch_many_or_fail(runs: list[tuple[str, int, int | None]], *, at_front=False) -> None:
    """Dispatch many ``(run_id, dispatch_count, team_id)`` at once; if that
    fails, dispatch each on its own (``dispatch_or_fail``)."""
    try:
        dispatch_many(runs, at_front=at_front)
    except Exception:
        logger.exception("dispatch of %d runs in one pipeline failed; one by one", len(runs))
        for run_id, dispatch_count, team_id in runs:
            dispatch_or_fail(run_id, dispatch_count=dispatch_count, team_id=team_id)


#: Set while ``manage.py embedded_worker`` executes runs: there a run due
#: now is the worker loop's next to claim, so dispatching it does nothing.
#: Executing it in the caller would nest it in the reaper's pass (delaying the
#: rest of the pass by the whole run) or in the attempt whose retry it is.
_in_embedded_worker: ContextVar[bool] = ContextVar("in_embedded_worker", default=False)


@contextlib.contextmanager
def executing_in_embedded_worker():
    """While active, the embedded default's dispatch leaves every run to the
    embedded worker's loop (``runs.workers.embedded``)."""
    token = _in_embedded_worker.set(True)
    try:
        yield
    finally:
        _in_embedded_worker.reset(token)


#: Set while a script executes the runs it enqueues itself (``seed_demo``).
_in_caller: ContextVar[bool] = ContextVar("in_caller", default=False)


@contextlib.contextmanager
def executing_in_caller():
    """While active (and without Redis), a run enqueued or released due now
    executes in the caller before the call returns, as with
    ``NRLLM_EXECUTE_IN_CALLER``: for a script that needs its runs' outcomes
    (the demo's scenarios), not for a server."""
    token = _in_caller.set(True)
    try:
        yield
    finally:
        _in_caller.reset(token)


def _execute_in_caller(run_id, delay_seconds: float) -> None:
    """The embedded default's dispatch (no Redis).

    The run is left ``queued``, due at its ``available_at``, for
    ``manage.py embedded_worker`` to execute as a worker would: a web
    server's request thread is no place for a run (no tool time limit can
    stop a tool there, and the request would last as long as the run).

    With ``NRLLM_EXECUTE_IN_CALLER`` (tests, scripts without a worker) a run
    due now executes here, in the caller, before ``enqueue`` returns. A
    delayed one is left all the same: executing it now would ignore its
    backoff, nested in the attempt that failed.
    """
    in_caller = settings.NRLLM_EXECUTE_IN_CALLER or _in_caller.get()
    if not in_caller or delay_seconds > 0 or _in_embedded_worker.get():
        return
    import_string(RUN_IN_CALLER)(run_id)


def live_job_ids(job_ids: list[str], *, grace_seconds: float) -> set[str]:
    """Those of ``job_ids`` that will still wake a worker.

    A job's status alone cannot say so: a worker killed right after taking a
    job off the queue leaves it marked ``queued`` in no queue at all. So a
    job is live when it is where its status says it waits (the queue's list,
    the scheduled or the deferred registry), or when it started within
    ``grace_seconds`` (its worker is presumably claiming the run right now).
    A scheduled job due more than ``grace_seconds`` ago is not live either:
    no scheduler is moving it (no worker runs ``--with-scheduler``), so it
    would never wake one.

    The reaper asks about the runs due longest, whose jobs wait near the head
    of the queue: each is looked for from the head (``LPOS``), so a pass
    costs in proportion to how deep they wait, not to how long the queue is.
    Two pipelines, whatever the number of jobs.
    """
    if not settings.REDIS_URL or not job_ids:
        return set()
    connection = _redis(settings.REDIS_URL)
    with connection.pipeline(transaction=False) as pipeline:
        for job_id in job_ids:
            pipeline.hmget(Job.key_for(job_id), "status", "started_at", "origin")
        states = pipeline.execute()
    cutoff = datetime.now(UTC) - timedelta(seconds=grace_seconds)
    live, waiting = set(), []
    for job_id, (status, started_at, origin) in zip(job_ids, states, strict=True):
        status = status.decode() if status else None
        if status == JobStatus.STARTED:
            if started_at and str_to_date(started_at) > cutoff:
                live.add(job_id)
        elif status in _WAITING and origin:
            # Where it waits is its queue's (a team's, or the deployment's).
            waiting.append((job_id, status, Queue(origin.decode(), connection=connection)))
    with connection.pipeline(transaction=False) as pipeline:
        for job_id, status, queue in waiting:
            _look_for(pipeline, queue, job_id, status)
        found = pipeline.execute()
    for (job_id, status, _queue), place in zip(waiting, found, strict=True):
        if place is None:
            continue  # not where its status says
        if status == JobStatus.SCHEDULED and place < cutoff.timestamp():
            continue  # its score is when it was due: long past, so no scheduler runs
        live.add(job_id)
    return live


_WAITING = {JobStatus.QUEUED.value, JobStatus.SCHEDULED.value, JobStatus.DEFERRED.value}


def _look_for(pipeline, queue: Queue, job_id: str, status: str) -> None:
    """Ask where a waiting job's status says it is: Redis answers None if it
    is not there, else its position in the list or its score in the registry."""
    if status == JobStatus.QUEUED:
        pipeline.lpos(queue.key, job_id)
    elif status == JobStatus.SCHEDULED:
        pipeline.zscore(queue.scheduled_job_registry.key, job_id)
    else:
        pipeline.zscore(queue.deferred_job_registry.key, job_id)
