"""Serving every team's queue, each in turn (G22).

A run due now is dispatched on its team's queue (``runs.queue.dispatch``),
so that one team's backlog of a thousand runs is not a line another team's
ten wait at the end of. A worker is started on the deployment's queue
(``manage.py rqworker default``) and serves, besides it, every team queue
named after it that Redis knows (RQ's own set of queues, ``rq:queues``):
a team's queue appears there with its first job, and a worker looks for
new ones at most once a second, while it waits for a job too, so a team
created after the worker started is served within ``dequeue_seconds``.

Its queues are taken from in turn, always (RQ's ``round_robin``, whatever
the ``--dequeue-strategy``): after a job from one queue, the next job
comes from the next queue that has one. Within a team's queue, first in,
first out. The deployment's own queue (the reaper's and retention's
periodic jobs, a retry's delayed job once due) is one more turn.
"""

import threading
import time

from redis.exceptions import RedisError

from runs.queue.dispatch import TEAM_QUEUE_INFIX


class ServesTeamQueues:
    """An RQ worker that serves the team queues of its queues, in turn."""

    #: At most this often a worker asks Redis for new team queues.
    refresh_seconds = 1.0
    #: A blocking dequeue waits at most this long, then looks again: a team
    #: queue new since then is served after it (RQ's own wait is minutes).
    dequeue_seconds = 5

    @property
    def dequeue_timeout(self) -> int:
        return self.dequeue_seconds

    def heartbeat(self, timeout=None, pipeline=None):
        # RQ's dequeue heartbeats before each wait for a job: the moment to
        # add the queues it should wait on. Only the main thread changes
        # the lists RQ's dequeue reads; a work horse dequeues nothing.
        if (
            threading.current_thread() is threading.main_thread()
            and not self.is_horse
            and self.takes_jobs
        ):
            self.serve_team_queues()
        return super().heartbeat(timeout, pipeline)

    #: False on a copy that performs one job (``ConcurrentWorker``'s): it
    #: shares the worker's lists, and only the worker that takes jobs
    #: changes them.
    takes_jobs = True

    def serve_team_queues(self) -> None:
        """Add the team queues Redis knows and this worker does not serve yet
        (last in the turn's order); at most once per ``refresh_seconds``."""
        now = time.monotonic()
        if now - getattr(self, "_team_queues_seen_at", float("-inf")) < self.refresh_seconds:
            return
        self._team_queues_seen_at = now
        if not hasattr(self, "_team_queue_prefixes"):
            # The queues it was started on: their teams' queues are its own.
            self._team_queue_prefixes = tuple(queue.key + TEAM_QUEUE_INFIX for queue in self.queues)
        try:
            keys = self.connection.smembers(self.queue_class.redis_queues_keys)
        except RedisError:
            return  # the dequeue that follows waits for Redis (WaitsOutRedis)
        team_keys = sorted(
            key
            for key in (key.decode() if isinstance(key, bytes) else key for key in keys)
            if key.startswith(self._team_queue_prefixes)
        )
        # Each list on its own: a queue served is one the dequeue's order
        # (``_ordered_queues``, which each take replaces) holds.
        for queues in (self.queues, self._ordered_queues):
            served = {queue.key for queue in queues}
            queues.extend(self._queue(key) for key in team_keys if key not in served)

    def _queue(self, key: str):
        return self.queue_class(
            key.removeprefix(self.queue_class.redis_queue_namespace_prefix),
            connection=self.connection,
            job_class=self.job_class,
            serializer=self.serializer,
        )

    def reorder_queues(self, reference_queue):
        """Round robin, whatever strategy RQ was given: the queue after the
        one a job just came from goes first."""
        queues = self._ordered_queues
        if reference_queue in queues:
            position = queues.index(reference_queue) + 1
            self._ordered_queues = queues[position:] + queues[:position]
