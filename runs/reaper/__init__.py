"""The reaper (G7): recovers runs whose worker stopped renewing its lease,
ends approvals that waited too long, and dispatches again queued runs
whose wake-up job Redis lost.

``decisions`` holds what to do with a stale run; ``passes`` makes one pass
over the database and records it for the console. It runs as
``manage.py reap_stale_runs``, as RQ's cron job (``runs.cron``) and inside
the embedded worker.

``retention`` is the other periodic upkeep of runs: deleting whole runs
past their age (``manage.py prune_runs``, RQ's cron job ``prune_job``).
"""

from runs.reaper.passes import Beat, ReapReport, reap_stale_runs

__all__ = ["Beat", "ReapReport", "reap_stale_runs"]
