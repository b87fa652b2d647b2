"""``ConcurrentWorker``: many runs in flight in one RQ worker process (G15).

A run spends nearly all its life waiting on a model, and a process per run
in flight costs 100–150 MB. This worker keeps up to
``NRLLM_WORKER_CONCURRENCY`` runs in flight, each in a thread of its own;
RQ stays the dispatcher and the run row the state, so several such workers
on several machines scale out as the others do.

Threads, not asyncio: the runtime is sync Django and psycopg, and a run's
waits are a blocking HTTP call (the ``openai`` SDK's sync client) and the
database; a thread per run keeps every guarded statement exactly as it is
in the forking worker. What threads cannot have, and what stands in for it:

- RQ's job timeout and its stop-job command act through a signal, and a
  signal reaches no thread but the main one: jobs get no death penalty
  here. A run is bounded by its own deadlines instead (its lease and the
  heartbeat, G16), and stopped by a cancel (G9).
- A tool's time limit cannot interrupt a thread: the run stops counting on
  the tool at its limit (``tools.deadline.call_within``).
- Each thread's database connection is its own; with
  ``DATABASE_POOL_MAX_SIZE`` they come from Django's pool and go back
  while their run waits on a model.

A slot is taken before a job is dequeued, so a job never waits in this
process for a slot. RQ keeps one job's bookkeeping on the worker (its
execution, its current job), so each thread performs its job on a shallow
copy of the worker, which shares the Redis connection pool.

SIGTERM (or SIGINT) drains: no job is dequeued after it, the runs in flight
get ``NRLLM_WORKER_DRAIN_SECONDS`` to finish, and those still in flight are
handed back (``runs.runtime.heartbeat.hand_back_all``): each settles
nothing, its lease lapses and the reaper decides it. A second signal hands
them back at once. SIGKILL loses nothing either: every lease lapses.
"""

import copy
import logging
import time

from django.conf import settings
from redis.exceptions import RedisError
from rq.exceptions import StopRequested
from rq.timeouts import BaseDeathPenalty
from rq.worker import SimpleWorker, WorkerStatus

from runs.jobs import load_for_runs
from runs.runtime.run_threads import RunThreads

logger = logging.getLogger(__name__)


class NoDeathPenalty(BaseDeathPenalty):
    """RQ's job timeout needs SIGALRM, which a thread never receives; a run's
    own deadlines bound it (the jobs are enqueued without a timeout)."""

    def setup_death_penalty(self):
        pass

    def cancel_death_penalty(self):
        pass


class ConcurrentWorker(SimpleWorker):
    death_penalty_class = NoDeathPenalty
    #: Seconds a blocking dequeue waits before the loop looks round again
    #: (RQ's own would block for minutes, leaving jobs' heartbeats unsent).
    dequeue_seconds = 5

    def bootstrap(self, *args, **kwargs):
        load_for_runs()
        self.runs = RunThreads(settings.NRLLM_WORKER_CONCURRENCY)
        self._jobs_heartbeat_at = time.monotonic()
        self._tearing_down = False
        super().bootstrap(*args, **kwargs)
        logger.info("concurrent worker: up to %d runs in flight", self.runs.limit)

    @property
    def dequeue_timeout(self) -> int:
        return self.dequeue_seconds

    # --- taking jobs ----------------------------------------------------

    def dequeue_job_and_maintain_ttl(self, timeout, max_idle_time=None):
        """A free slot first, then a job for it."""
        while not self.runs.take_slot(timeout=1):
            self.heartbeat()
            if self._stop_requested:
                return None
        try:
            result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        except BaseException:
            self.runs.give_back()
            raise
        if result is None:
            self.runs.give_back()
        return result

    def execute_job(self, job, queue):
        """Start the job in a thread of its own, in the slot taken for it."""
        performer = copy.copy(self)
        performer.execution = None
        self.set_state(WorkerStatus.BUSY)
        self.runs.start(
            lambda: self._perform(performer, job, queue), name=f"job-{job.id}", tag=(performer, job)
        )

    def _perform(self, performer, job, queue) -> None:
        try:
            performer.prepare_execution(job)
            performer.perform_job(job, queue)
        except Exception:
            # perform_job handles what the job raises; this is RQ's own
            # bookkeeping failing (Redis away): the run row is unaffected.
            logger.exception("job %s: RQ's bookkeeping failed", job.id)
        if self.runs.count() <= 1 and not self._stop_requested:
            self.set_state(WorkerStatus.IDLE)

    # --- Redis: RQ's bookkeeping, never the runs' -------------------------

    def heartbeat(self, timeout=None, pipeline=None):
        """RQ's worker heartbeat (the main loop sends it while it waits for a
        job), and every job's in flight, every ``job_monitoring_interval``:
        RQ drops an execution from its started-job registry when its
        heartbeat stops, and a run may outlive that. A Redis blip is logged,
        not raised: RQ's loop would quit on it, and the runs in flight need
        Redis for nothing (their rows are their state); the next dequeue
        waits for Redis to come back."""
        if pipeline is not None:
            return super().heartbeat(timeout, pipeline)  # a job's own, pipelined
        try:
            super().heartbeat(timeout, pipeline)
        except RedisError:
            logger.warning("concurrent worker: heartbeat not sent to Redis")
            return
        if self.is_horse or not hasattr(self, "runs"):
            return
        if time.monotonic() - self._jobs_heartbeat_at < self.job_monitoring_interval:
            return
        self._jobs_heartbeat_at = time.monotonic()
        for performer, job in self.runs.tags():
            if performer.execution is not None:
                try:
                    performer.maintain_heartbeats(job)
                except Exception:
                    logger.warning("job %s: RQ heartbeat not sent", job.id)

    def set_state(self, state, pipeline=None):
        """RQ's worker state, as ``heartbeat``: a Redis blip is logged."""
        if pipeline is not None:
            return super().set_state(state, pipeline)
        try:
            super().set_state(state)
        except RedisError:
            logger.warning("concurrent worker: state %s not sent to Redis", state)

    # --- stopping -------------------------------------------------------

    def _shutdown(self):
        """The first SIGTERM or SIGINT: stop taking jobs now, even from a
        blocking dequeue, and drain (``teardown``). One that comes while the
        worker already drains (RQ's loop quit, or a burst ended) gives the
        runs in flight the drain's grace from now."""
        self._stop_requested = True
        if self.scheduler:
            self.stop_scheduler()
        if self._tearing_down:
            self.runs.shorten(settings.NRLLM_WORKER_DRAIN_SECONDS)
            return
        raise StopRequested()

    def teardown(self):
        """Drain: in burst mode, or after RQ's loop quit, until the runs in
        flight end; after a stop request for up to
        ``NRLLM_WORKER_DRAIN_SECONDS``, then the rest are handed back (a
        second signal: at once)."""
        if not self.is_horse:
            self._tearing_down = True
            grace = settings.NRLLM_WORKER_DRAIN_SECONDS if self._stop_requested else None
            self.runs.drain(grace, while_waiting=self.heartbeat)
        super().teardown()
