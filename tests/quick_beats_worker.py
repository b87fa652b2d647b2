"""A concurrent worker that sends its jobs' RQ heartbeats every second, two
jobs to a round trip, so a test sees several batches within seconds."""

from runs.workers.concurrent import ConcurrentWorker


class QuickBeats(ConcurrentWorker):
    jobs_per_heartbeat = 2

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "job_monitoring_interval": 1})
