"""The reaper (G7): recovers runs whose worker stopped renewing its lease,
ends approvals that waited too long, and dispatches again queued runs
whose wake-up job Redis lost.

``decisions`` holds what to do with a stale run; ``passes`` makes one pass
over the database; ``liveness`` records the pass for the console. It runs
as ``manage.py reap_stale_runs``, as RQ's cron job (``runs.cron``) and
inside the embedded worker.
"""

from runs.reaper.liveness import Beat
from runs.reaper.passes import ReapReport, reap_stale_runs

__all__ = ["Beat", "ReapReport", "reap_stale_runs"]
