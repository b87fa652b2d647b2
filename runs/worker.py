"""The RQ worker classes ``NRLLM_WORKER_CLASS`` names.

``Worker``, the default: RQ's forking worker, loading what runs need before
its first fork (``runs.jobs.load_for_runs``) and folding each finished work
horse's metric files (``nrllm_ops.metrics_files``) when
``PROMETHEUS_MULTIPROC_DIR`` is set. ``SimpleWorker``: RQ's worker that
runs jobs in its own process, loading the same at its start rather than
in its first run.
"""

import logging

from rq.worker import SimpleWorker as RQSimpleWorker
from rq.worker import Worker as RQWorker

from nrllm_ops import metrics_files
from runs.jobs import load_for_runs

logger = logging.getLogger(__name__)


class Worker(RQWorker):
    def bootstrap(self, *args, **kwargs):
        # First: a worker that cannot load them registers nothing in Redis.
        load_for_runs()
        super().bootstrap(*args, **kwargs)

    def monitor_work_horse(self, job, queue):
        horse = self.horse_pid
        super().monitor_work_horse(job, queue)
        # Returning, RQ has waited for the horse: it has exited, whatever the
        # job did (if monitoring raised, the horse may live on: not folded).
        if horse:
            metrics_files.fold_exited(horse, logger.exception)


class SimpleWorker(RQSimpleWorker):
    def bootstrap(self, *args, **kwargs):
        load_for_runs()
        super().bootstrap(*args, **kwargs)
