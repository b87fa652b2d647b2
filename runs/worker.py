"""The RQ worker classes ``NRLLM_WORKER_CLASS`` names.

``ConcurrentWorker`` (``runs.workers.concurrent``), the default: up to
``NRLLM_WORKER_CONCURRENCY`` runs at once, each in a thread of its process.
``Worker``: RQ's forking worker, loading what runs need before
its first fork (``runs.workers.preload.load_for_runs``), folding each finished work
horse's metric files (``ground.metrics_files``) when
``PROMETHEUS_MULTIPROC_DIR`` is set, and having each horse export its
spans before it exits when traces are on (``ground.tracing``).
``SimpleWorker``: RQ's worker that runs jobs in its own process, loading
the same at its start rather than in its first run, and exporting its
spans as it stops, within ``NRLLM_TRACES_EXIT_SECONDS`` (a worker of
``rqworker-pool`` leaves by ``os._exit``).

All three wait out a Redis outage (``runs.workers.redis_outage.WaitsOutRedis``):
started while Redis is away, or finding it gone, they wait and go on. And
all three serve the teams' queues of the queue they are started on, in
turn (``runs.workers.team_queues.ServesTeamQueues``, G22).
"""

import logging

from django.conf import settings
from django.db import connection
from rq.worker import SimpleWorker as RQSimpleWorker
from rq.worker import Worker as RQWorker

from ground import metrics_files, tracing
from runs.workers.concurrent import ConcurrentWorker
from runs.workers.preload import load_for_runs
from runs.workers.redis_outage import WaitsOutRedis
from runs.workers.team_queues import ServesTeamQueues

__all__ = ["ConcurrentWorker", "SimpleWorker", "Worker"]

logger = logging.getLogger(__name__)

#: How long a work horse waits for the collector to take its run's spans:
#: the worker starts no job meanwhile, so a collector that does not answer
#: costs each job this long, and the spans.
HORSE_FLUSH_SECONDS = 2


class Worker(WaitsOutRedis, ServesTeamQueues, RQWorker):
    def bootstrap(self, *args, **kwargs):
        # First: a worker that cannot load them registers nothing in Redis.
        load_for_runs(url_configuration=True)
        super().bootstrap(*args, **kwargs)

    def fork_work_horse(self, job, queue):
        # A connection pool's threads do not survive a fork, and its sockets
        # must not be shared with a horse: the parent gives its pool up, each
        # horse opens its own.
        if connection.settings_dict["OPTIONS"].get("pool"):
            connection.close()
            connection.close_pool()
        super().fork_work_horse(job, queue)

    def perform_job(self, job, queue):
        # In the work horse, which leaves by os._exit: no atexit hook will
        # export the spans of its run, so they go now (nothing when off).
        try:
            return super().perform_job(job, queue)
        finally:
            tracing.flush(timeout_seconds=HORSE_FLUSH_SECONDS)

    def monitor_work_horse(self, job, queue):
        horse = self.horse_pid
        super().monitor_work_horse(job, queue)
        # Returning, RQ has waited for the horse: it has exited, whatever the
        # job did (if monitoring raised, the horse may live on: not folded).
        if horse:
            metrics_files.fold_exited(horse, logger.exception)


class SimpleWorker(WaitsOutRedis, ServesTeamQueues, RQSimpleWorker):
    def bootstrap(self, *args, **kwargs):
        load_for_runs()
        super().bootstrap(*args, **kwargs)

    def teardown(self):
        try:
            super().teardown()
        finally:
            # A worker of rqworker-pool leaves by os._exit after this: no
            # atexit hook will export its runs' spans.
            tracing.flush(timeout_seconds=settings.NRLLM_TRACES_EXIT_SECONDS)
