"""Waiting out a Redis outage in the processes that live on Redis: the RQ
workers (``runs.worker``) and the reaper's scheduler (``rqcron runs.cron``,
``runs.workers.cron_scheduler``).

Redis holds only wake-ups and RQ's books; the run rows in PostgreSQL are the
state (G4). So a process that finds Redis away does what it does when
PostgreSQL is away: it stays up and tries again. It says so once per
outage (not a traceback per try), tries again after 1 s, doubling up to
``LONGEST_WAIT_SECONDS``, and says once more when Redis answers. What it
could not write meanwhile needs no redoing or is redone: a worker's
heartbeat and registration are written again, a job's end is in its run's
row (RQ's books for it are lost, never the run), a job taken and not started
is dispatched again by the reaper (G7), a cron job not enqueued is enqueued
once Redis answers.
"""

import logging
import threading
import time

from redis import RedisError
from rq import worker_registration

logger = logging.getLogger(__name__)

#: The first wait after Redis failed; each one after doubles, up to the longest.
FIRST_WAIT_SECONDS = 1.0
LONGEST_WAIT_SECONDS = 30.0


class RedisOutage:
    """Whether one process finds Redis away, since when, and how long it
    waits before trying again. Shared by the process's threads."""

    def __init__(self, who: str):
        #: The process, as its log lines name it ("rqworker <name>").
        self.who = who
        self._since: float | None = None
        self._wait = FIRST_WAIT_SECONDS
        self._lock = threading.Lock()

    @property
    def away(self) -> bool:
        return self._since is not None

    def noticed(self, error: BaseException) -> None:
        """Redis failed: logged if it is the first failure of this outage."""
        with self._lock:
            if self._since is not None:
                return
            self._since = time.monotonic()
        logger.warning(
            "%s: Redis unreachable (%s: %s); waiting for it, trying again every %g s at most",
            self.who,
            type(error).__name__,
            error,
            LONGEST_WAIT_SECONDS,
        )

    def over(self) -> bool:
        """Redis answered: whether that ends an outage (then it is logged)."""
        with self._lock:
            since, self._since, self._wait = self._since, None, FIRST_WAIT_SECONDS
        if since is None:
            return False
        logger.warning("%s: Redis answers again, after %.0f s", self.who, time.monotonic() - since)
        return True

    def next_wait(self) -> float:
        """Seconds to wait before the next try: 1, 2, 4, ... up to the longest."""
        with self._lock:
            wait, self._wait = self._wait, min(self._wait * 2, LONGEST_WAIT_SECONDS)
        return wait

    def wait_for(self, attempt, *args):
        """``attempt(*args)`` until Redis lets it through; its result."""
        while True:
            try:
                result = attempt(*args)
            except RedisError as error:
                self.noticed(error)
                time.sleep(self.next_wait())
                continue
            self.over()
            return result

    def tolerate(self, attempt, *args) -> bool:
        """``attempt(*args)`` once; a Redis failure is noticed, not raised.
        Whether it went through."""
        try:
            attempt(*args)
        except RedisError as error:
            self.noticed(error)
            return False
        return True


class _RedisErrorsFolded(logging.LoggerAdapter):
    """RQ's worker log, with RQ's line for each try at a Redis that is away
    (its dequeue's, its pub/sub thread's, a job's books': an error whose
    arguments name a Redis error) folded into the outage's one line."""

    def __init__(self, rq_logger: logging.Logger, outage: RedisOutage):
        super().__init__(rq_logger, {})
        self.outage = outage

    @property
    def level(self) -> int:
        return self.logger.level  # RQ reads it to start its scheduler

    def error(self, msg, *args, **kwargs):
        redis_error = next((arg for arg in args if isinstance(arg, RedisError)), None)
        if redis_error is not None and not kwargs.get("exc_info"):
            self.outage.noticed(redis_error)
            return
        super().error(msg, *args, **kwargs)


class WaitsOutRedis:
    """An RQ worker that outlives a Redis outage (first among its bases).

    Starting, it waits for Redis (RQ's own start would exit at once). In its
    loop, a Redis failure is noticed, never raised (RQ's loop quits on
    one): RQ's own dequeue then waits for Redis with backoff, capped here
    at ``LONGEST_WAIT_SECONDS``, whether Redis refuses connections, times
    out or refuses writes. A job that ends while Redis is away has
    its run's end in its row; RQ's books for it are not kept, and no
    traceback says so. When Redis answers again, maybe empty (restarted
    without persistence), the worker registers itself again, so the
    overview lists it, and runs RQ's maintenance at once."""

    max_connection_wait_time = LONGEST_WAIT_SECONDS

    def __init__(self, *args, **kwargs):
        self.redis_outage = RedisOutage("rqworker")
        self._maintenance_due = False
        super().__init__(*args, **kwargs)
        self.log = _RedisErrorsFolded(self.log, self.redis_outage)

    # --- starting: waits for Redis ---------------------------------------

    def _set_ip_address(self, connection):
        # The first thing RQ asks Redis, as the worker is made (named).
        self.redis_outage.who = f"rqworker {self.name}"
        self.redis_outage.wait_for(super()._set_ip_address, connection)

    def register_birth(self):
        self.redis_outage.wait_for(super().register_birth)

    def subscribe(self):
        self.redis_outage.wait_for(super().subscribe)

    # --- the loop: a failure is noticed, not raised ----------------------

    def dequeue_job_and_maintain_ttl(self, timeout, max_idle_time=None):
        """RQ's, which waits out a Redis that refuses connections and ends
        the worker on any other Redis error: an answer that times out (a
        stalled host, a network dropping packets) or a write refused by a
        failover's old master (UNBLOCKED, READONLY). Each is an outage as
        well: noticed, and tried again after its wait (a stop request
        interrupts the wait, as it does RQ's)."""
        while True:
            try:
                return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            except RedisError as error:
                self.redis_outage.noticed(error)
                time.sleep(self.redis_outage.next_wait())

    def heartbeat(self, timeout=None, pipeline=None):
        if pipeline is not None:
            return super().heartbeat(timeout, pipeline)  # sent by the caller
        if self.redis_outage.tolerate(super().heartbeat, timeout):
            self.redis_answers()
        return None

    def redis_answers(self) -> None:
        """Redis took a heartbeat. If that ends an outage: the worker's hash
        and its place in RQ's registry (which the overview reads) are
        written again, in case Redis came back empty; and RQ's maintenance
        is due at once, not in up to ten minutes: it starts RQ's scheduler
        again (``--with-scheduler``: the outage ended its process, which
        moves the retries to the queue when due) and cleans the registries
        (a job whose books were lost is moved to the failed ones)."""
        if not self.redis_outage.over():
            return
        with self.connection.pipeline() as pipeline:
            pipeline.hset(self.key, mapping=self.serialize())
            worker_registration.register(self, pipeline)
            pipeline.expire(self.key, self.worker_ttl + 60)
            self.redis_outage.tolerate(pipeline.execute)
        self._maintenance_due = True

    @property
    def should_run_maintenance_tasks(self):
        return self._maintenance_due or super().should_run_maintenance_tasks

    def set_state(self, state, pipeline=None):
        """RQ's; without a pipeline, whether Redis took it."""
        if pipeline is not None:
            return super().set_state(state, pipeline)
        return self.redis_outage.tolerate(super().set_state, state)

    def check_for_suspension(self, burst):
        self.redis_outage.tolerate(super().check_for_suspension, burst)

    def run_maintenance_tasks(self):
        if self.redis_outage.tolerate(super().run_maintenance_tasks):
            self._maintenance_due = False

    def set_shutdown_requested_date(self):
        # Called from the stop signal's handler: raised, it would land in
        # whatever the worker was doing.
        self.redis_outage.tolerate(super().set_shutdown_requested_date)

    def set_current_job_working_time(self, current_job_working_time, pipeline=None):
        if pipeline is not None:
            return super().set_current_job_working_time(current_job_working_time, pipeline)
        self.redis_outage.tolerate(super().set_current_job_working_time, current_job_working_time)
        return None

    def maintain_heartbeats(self, job):
        self.redis_outage.tolerate(super().maintain_heartbeats, job)

    def register_death(self):
        self.redis_outage.tolerate(super().register_death)

    def unsubscribe(self):
        self.redis_outage.tolerate(super().unsubscribe)

    # --- a job: its run's row is its state --------------------------------

    def execute_job(self, job, queue):
        try:
            super().execute_job(job, queue)
        except RedisError as error:
            # Taken, and Redis went before it started (or as it ended): a
            # run it did not start is dispatched again by the reaper (G7).
            self.redis_outage.noticed(error)
            logger.debug("job %s: RQ's books not kept, Redis away", job.id)

    def perform_job(self, job, queue):
        try:
            return super().perform_job(job, queue)
        except RedisError as error:
            # The job ran (its run's end is in its row); RQ's books for it
            # could not be written, and are not needed.
            self.redis_outage.noticed(error)
            logger.debug("job %s: ended; RQ's books for it not kept, Redis away", job.id)
            return False

    def handle_exception(self, job, *exc_info):
        if isinstance(exc_info[1], RedisError):
            # RQ's own books failing after the job ran, not the job: no
            # traceback (RQ's handlers log one for a job's exception).
            self.redis_outage.noticed(exc_info[1])
            return None
        return super().handle_exception(job, *exc_info)
