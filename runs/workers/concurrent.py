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
- Each thread's database connection is its own; on PostgreSQL they come
  from Django's pool (``DATABASE_POOL_MAX_SIZE``, 20 unless set) and go
  back while their run waits on a model.

A slot is taken before a job is dequeued, so a job never waits in this
process for a slot. RQ keeps one job's bookkeeping on the worker (its
execution, its current job), so each thread performs its job on a shallow
copy of the worker, which shares the Redis connection pool.

The main thread only takes jobs, and it shares the GIL with every run's
thread: each Redis round trip it makes waits for the GIL again when its
answer comes, a few milliseconds when the runs keep it busy. So it makes
few: the jobs for all the slots free are taken off the queue in one round
trip and fetched in another (RQ's own blocking dequeue waits when the
queue is empty), even for one slot free; the worker's heartbeat and the
suspension check go at most once a second, and its state only when it
changes (busy while any run is in flight). RQ's one job at a time (eleven
round trips) started about 30 runs a second per process.

SIGTERM (or SIGINT) drains: no job is dequeued after it, the runs in flight
get ``NRLLM_WORKER_DRAIN_SECONDS`` to finish, and those still in flight are
handed back (``runs.runtime.heartbeat.hand_back_all``): each settles
nothing, its lease lapses and the reaper decides it. A second signal hands
them back at once. SIGKILL loses nothing either: every lease lapses. The
runs' spans are exported last, within ``NRLLM_TRACES_EXIT_SECONDS``: a
worker of ``rqworker-pool`` leaves by ``os._exit``, past exit hooks.
"""

import copy
import logging
import sys
import threading
import time

from django.conf import settings
from redis.exceptions import RedisError
from rq.exceptions import NoSuchJobError, StopRequested
from rq.intermediate_queue import IntermediateQueue
from rq.timeouts import BaseDeathPenalty
from rq.utils import as_text
from rq.worker import SimpleWorker, WorkerStatus

from ground import tracing
from runs.workers.preload import load_for_runs
from runs.workers.redis_outage import WaitsOutRedis
from runs.workers.run_threads import RunThreads, set_the_gil_switch_interval
from runs.workers.team_queues import ServesTeamQueues

logger = logging.getLogger(__name__)


class NoDeathPenalty(BaseDeathPenalty):
    """RQ's job timeout needs SIGALRM, which a thread never receives; a run's
    own deadlines bound it (the jobs are enqueued without a timeout)."""

    def setup_death_penalty(self):
        pass

    def cancel_death_penalty(self):
        pass


#: Redis connections beyond one per run: the main thread's, the jobs'
#: heartbeats, RQ's pub/sub thread's (stop-job and suspend commands).
SPARE_REDIS_CONNECTIONS = 10


class ConcurrentWorker(WaitsOutRedis, ServesTeamQueues, SimpleWorker):
    death_penalty_class = NoDeathPenalty
    #: Seconds a blocking dequeue waits before the loop looks round again
    #: (RQ's own would block for minutes, leaving jobs' heartbeats unsent).
    dequeue_seconds = 5
    #: Seconds between the worker's own heartbeats, and its suspension
    #: checks, however many jobs it takes meanwhile.
    heartbeat_seconds = 1
    #: Whether a dequeue takes a job for every slot free (``work`` says).
    _take_many = True

    def bootstrap(self, *args, **kwargs):
        load_for_runs()
        set_the_gil_switch_interval()
        self.runs = RunThreads(settings.NRLLM_WORKER_CONCURRENCY)
        # Each run's thread holds a connection of this pool while RQ keeps
        # its job's books, and the main thread one while it takes jobs:
        # redis-py 8 refuses a connection past 100 (MaxConnectionsError)
        # rather than wait, which would leave a job taken and never run.
        pool = self.connection.connection_pool
        pool.max_connections = max(pool.max_connections, self.runs.limit + SPARE_REDIS_CONNECTIONS)
        self._jobs_heartbeat_at = time.monotonic()
        self._heartbeat_at = self._suspension_checked_at = float("-inf")
        self._state_lock = threading.Lock()
        self._tearing_down = False
        #: Whether the main thread waits (for a slot, or in RQ's blocking
        #: dequeue until it has taken a job): only there may a stop request
        #: interrupt it; elsewhere it only sets the flag, which is looked at
        #: before each wait. (A stop in RQ's dequeue just as it takes a job
        #: leaves that job unstarted: the reaper dispatches its run again.)
        self._waiting = False
        super().bootstrap(*args, **kwargs)
        logger.info(
            "concurrent worker: up to %d runs in flight, the GIL's switch interval %g ms",
            self.runs.limit,
            sys.getswitchinterval() * 1000,
        )

    def work(self, *args, max_jobs=None, **kwargs):
        """RQ's loop; with ``max_jobs`` jobs are taken one at a time, so that
        RQ counts every one."""
        self._take_many = max_jobs is None
        return super().work(*args, max_jobs=max_jobs, **kwargs)

    @property
    def dequeue_timeout(self) -> int:
        return self.dequeue_seconds

    # --- taking jobs ----------------------------------------------------

    def dequeue_job_and_maintain_ttl(self, timeout, max_idle_time=None):
        """A free slot first, then a job for it, and one for every other
        slot free: the jobs waiting in the queue are taken without blocking
        (two round trips however many) and started here, the first returned
        to RQ's loop, which starts it. With no job waiting, RQ's own dequeue
        waits for one."""
        if not self._take_slot():
            return None
        taken = 1 + (self.runs.take_free_slots() if self._take_many else 0)
        # What RQ's own dequeue sends first (at most once a second here).
        self.heartbeat()
        if self._stop_requested:
            # Stopped during the heartbeat, which may not be interrupted:
            # no job is taken after a stop request.
            self.runs.give_back(taken)
            return None
        jobs = []
        try:
            jobs = self._take_waiting_jobs(taken)
        except RedisError as error:
            # RQ's own dequeue, below, waits for Redis to come back. A move
            # that landed unanswered leaves its job taken and unstarted: the
            # reaper dispatches its run again (G7).
            self.redis_outage.noticed(error)
        except BaseException:
            self.runs.give_back(taken)
            raise
        self.runs.give_back(taken - max(1, len(jobs)))
        if jobs:
            for job, queue in jobs[1:]:
                self.execute_job(job, queue)
            return jobs[0]
        result = None
        self._waiting = True
        try:
            # A stop requested while it was not waiting only set the flag.
            if not self._stop_requested:
                result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        except BaseException:
            self.runs.give_back()
            raise
        finally:
            self._waiting = False
        if result is None:
            self.runs.give_back()
        return result

    def _take_slot(self) -> bool:
        """Wait for a free slot; False if a stop is requested first."""
        self._waiting = True
        try:
            # The flag is looked at once waiting: a stop requested before
            # only set it.
            while not self._stop_requested:
                if self.runs.take_slot(timeout=1):
                    return True
                self.heartbeat()
            return False
        finally:
            self._waiting = False

    def reorder_queues(self, reference_queue):
        """RQ calls this as soon as its blocking dequeue has taken a job:
        from here until the job starts a stop request must not interrupt
        the main thread (the job would be left taken and unstarted)."""
        self._waiting = False
        super().reorder_queues(reference_queue)

    def _take_waiting_jobs(self, wanted: int) -> list:
        """Up to ``wanted`` jobs waiting in the queues, without blocking, taken
        from the queues in turn (``runs.workers.team_queues``) in one round
        trip by a script, and their hashes in another. From a worker's one
        queue a job is moved to the queue's intermediate list, as RQ's own
        dequeue moves it (where RQ looks for a job a worker took and never
        started); from several, popped, as RQ's own dequeue pops it then."""
        if self.get_redis_server_version() < (6, 2, 0):
            return []
        queues = self._ordered_queues
        single = len(self.queues) == 1
        intermediate = IntermediateQueue(queues[0].key, self.connection).key if single else ""
        taken_from = _take_in_turn(self.connection)(
            keys=[queue.key for queue in queues], args=[wanted, intermediate]
        )
        pairs = [(queues[int(at) - 1], as_text(job_id)) for at, job_id in _two_by_two(taken_from)]
        if pairs:
            self.reorder_queues(pairs[-1][0])
        job_ids = [job_id for _queue, job_id in pairs]
        if not job_ids:
            return []
        with self.connection.pipeline(transaction=False) as pipeline:
            for job_id in job_ids:
                pipeline.hgetall(self.job_class.key_for(job_id))
            # A reply that is an error (a key that is not a hash) is that
            # job's alone: the others taken with it are started.
            stored = pipeline.execute(raise_on_error=False)
        taken = []
        for (queue, job_id), fields in zip(pairs, stored, strict=True):
            job = self.job_class(job_id, connection=self.connection, serializer=self.serializer)
            try:
                if isinstance(fields, Exception):
                    raise fields
                if not fields:
                    raise NoSuchJobError(job_id)
                job.restore(fields)
            except Exception:
                # Passed over alone, as RQ's dequeue passes over a job whose
                # hash is gone; its run is dispatched again by the reaper (G7).
                logger.warning("job %s: taken but cannot be read; left", job_id, exc_info=True)
                continue
            job.redis_server_version = self.get_redis_server_version()
            self.log.info("Worker %s: %s: %s", self.name, queue.name, job.id)
            taken.append((job, queue))
        return taken

    def execute_job(self, job, queue):
        """Start the job in a thread of its own, in the slot taken for it."""
        performer = copy.copy(self)
        performer.execution = None
        performer.takes_jobs = False
        self.set_state(WorkerStatus.BUSY)
        self.runs.start(
            lambda: self._perform(performer, job, queue), name=f"job-{job.id}", tag=(performer, job)
        )

    def _perform(self, performer, job, queue) -> None:
        try:
            performer.prepare_execution(job)
            performer.perform_job(job, queue)
        except RedisError as error:
            # Redis went before the job started: its run, not started, is
            # dispatched again by the reaper (G7). (One that ended is in
            # its row: ``perform_job`` says nothing of RQ's books then.)
            self.redis_outage.noticed(error)
        except Exception:
            # perform_job handles what the job raises; this is RQ's own
            # bookkeeping failing otherwise: the run row is unaffected.
            logger.exception("job %s: RQ's bookkeeping failed", job.id)
        if self.runs.count() <= 1 and not self._stop_requested:
            self.set_state(WorkerStatus.IDLE)

    # --- Redis: RQ's bookkeeping, never the runs' -------------------------

    def heartbeat(self, timeout=None, pipeline=None):
        """RQ's worker heartbeat (the main loop sends it while it waits for a
        job), and every job's in flight, every ``job_monitoring_interval``:
        RQ drops an execution from its started-job registry when its
        heartbeat stops, and a run may outlive that. A Redis outage is
        noticed (logged once), not raised: RQ's loop would quit on it, and
        the runs in flight need Redis for nothing (their rows are their
        state); the next dequeue waits for Redis to come back."""
        if pipeline is not None:
            return super().heartbeat(timeout, pipeline)  # a job's own, pipelined
        if getattr(self, "_tearing_down", False) and self.redis_outage.away:
            # Draining while Redis is away: a try at a Redis that stalls
            # would hold the drain a socket timeout (15 s) past its grace,
            # and the runs would be handed back that late (G15).
            return None
        if timeout is not None or time.monotonic() - self._heartbeat_at >= self.heartbeat_seconds:
            try:
                with self.connection.pipeline(transaction=False) as beat:
                    super().heartbeat(timeout, beat)
                    beat.execute()
            except RedisError as error:
                self.redis_outage.noticed(error)
                return
            self._heartbeat_at = time.monotonic()
            self.redis_answers()
            self._reconcile_state()
        if self.is_horse or not hasattr(self, "runs"):
            return
        if time.monotonic() - self._jobs_heartbeat_at < self.job_monitoring_interval:
            return
        self._jobs_heartbeat_at = time.monotonic()
        in_flight = [(p, job) for p, job in self.runs.tags() if p.execution is not None]
        for start in range(0, len(in_flight), self.jobs_per_heartbeat):
            jobs = in_flight[start : start + self.jobs_per_heartbeat]
            try:
                self._beat_jobs(jobs)
            except RedisError as error:
                self.redis_outage.noticed(error)
                return
            except Exception:
                logger.warning("RQ heartbeats of %d job(s) not sent", len(jobs), exc_info=True)

    #: Jobs whose RQ heartbeats share one round trip. One a job (RQ's
    #: ``maintain_heartbeats``) held the main thread from taking jobs for
    #: seconds with 2,000 in flight: each round trip waits for the GIL
    #: again, and slots freed meanwhile stayed empty.
    jobs_per_heartbeat = 500

    def _beat_jobs(self, jobs: list) -> None:
        """RQ's ``maintain_heartbeats`` (rq 2.12, pinned) for ``jobs``, in one
        pipeline: the worker's heartbeat, then each job's execution and its
        job hash; a job hash the heartbeat created (the job was deleted as it
        finished, rq#1450) is deleted again, as is the worker's hash if it
        had expired (then written whole)."""
        from rq.utils import now

        with self.connection.pipeline() as pipeline:
            super().heartbeat(self.job_monitoring_interval + 60, pipeline)
            created = []
            for performer, job in jobs:
                # Read once: the job's thread drops its execution as the job
                # ends, which may be since ``jobs`` was made (an ended job
                # needs no heartbeat; one left out must not cost the others
                # theirs).
                execution = performer.execution
                if execution is None:
                    continue
                ttl = int(performer.get_heartbeat_ttl(job))
                execution.heartbeat(job.started_job_registry, ttl, pipeline=pipeline)
                created.append((job, len(pipeline)))
                job.heartbeat(now(), ttl, pipeline=pipeline, xx=True)
            results = pipeline.execute()
            for job, index in created:
                if results[index] == 1:
                    pipeline.delete(job.key)
            if results[0] == 1:
                pipeline.hset(self.key, mapping=self.serialize())
            pipeline.execute()

    def set_state(self, state, pipeline=None):
        """RQ's worker state, sent only when it changes (each job would send
        it twice); a Redis outage is noticed, as in ``heartbeat``. The worker is
        busy while a run is in flight: RQ's dequeue, which says idle each
        time it waits, is not heard then."""
        if pipeline is not None:
            return super().set_state(state, pipeline)
        if (
            state == WorkerStatus.IDLE
            and threading.current_thread() is threading.main_thread()
            and hasattr(self, "runs")
            and self.runs.count()
        ):
            return
        with self._state_lock:
            if state == self._state:
                return
            if not super().set_state(state):
                self._state = None  # unknown: sent again next time

    def _reconcile_state(self) -> None:
        """With the heartbeat: busy while a run is in flight, idle when none
        is. The runs' threads say idle as the last one ends, but two that end
        together can each see the other in flight, and a state Redis did not
        take is sent again only here."""
        if not hasattr(self, "runs") or self._stop_requested:
            return
        if self._state in (WorkerStatus.SUSPENDED, WorkerStatus.STARTED):
            return
        wanted = WorkerStatus.BUSY if self.runs.count() else WorkerStatus.IDLE
        if self._state != wanted:
            self.set_state(wanted)

    def check_for_suspension(self, burst):
        """``rq suspend``, looked for at most once a second."""
        if time.monotonic() - self._suspension_checked_at < self.heartbeat_seconds:
            return
        self._suspension_checked_at = time.monotonic()
        super().check_for_suspension(burst)

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
        if self._waiting:
            raise StopRequested()
        # Between taking jobs and starting them: RQ's loop stops at its next
        # turn, a moment from now, and the jobs taken run in the drain.

    def teardown(self):
        """Drain: in burst mode, or after RQ's loop quit, until the runs in
        flight end; after a stop request for up to
        ``NRLLM_WORKER_DRAIN_SECONDS``, then the rest are handed back (a
        second signal: at once)."""
        if not self.is_horse:
            self._tearing_down = True
            grace = settings.NRLLM_WORKER_DRAIN_SECONDS if self._stop_requested else None
            self.runs.drain(grace, while_waiting=self.heartbeat)
        try:
            super().teardown()
        finally:
            # A worker of rqworker-pool leaves by os._exit after this: no
            # atexit hook will export its runs' spans.
            tracing.flush(timeout_seconds=settings.NRLLM_TRACES_EXIT_SECONDS)


#: Takes up to ARGV[1] job ids from the lists KEYS, one from each in turn,
#: skipping those that run dry: (index of the list, job id) flattened. With
#: an intermediate list (ARGV[2]; one queue only) each is moved there.
_TAKE_IN_TURN = """
local wanted, intermediate = tonumber(ARGV[1]), ARGV[2]
local taken, dry, dry_count, at = {}, {}, 0, 0
while #taken < 2 * wanted and dry_count < #KEYS do
    at = at % #KEYS + 1
    if not dry[at] then
        local job_id
        if intermediate ~= "" then
            job_id = redis.call("LMOVE", KEYS[at], intermediate, "LEFT", "RIGHT")
        else
            job_id = redis.call("LPOP", KEYS[at])
        end
        if job_id then
            taken[#taken + 1] = at
            taken[#taken + 1] = job_id
        else
            dry[at] = true
            dry_count = dry_count + 1
        end
    end
end
return taken
"""


def _take_in_turn(connection):
    """The script, registered once per connection (redis-py sends its hash,
    and the script itself only to a server that does not know it)."""
    script = getattr(connection, "_nrllm_take_in_turn", None)
    if script is None:
        script = connection._nrllm_take_in_turn = connection.register_script(_TAKE_IN_TURN)
    return script


def _two_by_two(flat: list) -> list[tuple]:
    return list(zip(flat[::2], flat[1::2], strict=True))
