"""The default RQ worker class: RQ's forking worker, loading what runs need
before its first fork (``runs.jobs.load_for_runs``) and folding each
finished work horse's metric files (``nrllm_ops.metrics_files``) when
``PROMETHEUS_MULTIPROC_DIR`` is set.
"""

import logging

from rq.worker import Worker as RQWorker

from nrllm_ops import metrics_files
from runs.jobs import load_for_runs

logger = logging.getLogger(__name__)


class Worker(RQWorker):
    def bootstrap(self, *args, **kwargs):
        super().bootstrap(*args, **kwargs)
        load_for_runs()

    def monitor_work_horse(self, job, queue):
        horse = self.horse_pid
        super().monitor_work_horse(job, queue)
        # Returning, RQ has waited for the horse: it has exited, whatever the
        # job did (if monitoring raised, the horse may live on: not folded).
        if horse:
            metrics_files.fold_exited(horse, logger.exception)
