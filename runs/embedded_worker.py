"""The embedded default's worker: what ``manage.py embedded_worker`` does.

Without Redis there is no ``rqworker --with-scheduler`` to execute a delayed
retry when it is due and no ``rqcron`` to run the reaper. This loop stands
in for both, in one process beside the web server: every pass is one reaper
pass, then the queued runs that are due, oldest first, a bounded batch,
executed one after another in this process's main thread (so a tool's time
limit applies, as in an RQ worker).

Due-ness is the database's clock, like every lease. Two executors may go
for the same run — the web process executes a new run in the request that
created it, a second embedded worker may be running —: the claim decides,
exactly one wins, the others do nothing.
"""

import logging
import threading

from django.db import close_old_connections

from runs.dispatch import executing_in_embedded_worker
from runs.models import AgentRun
from runs.reaper import reap_stale_runs
from runs.runtime import run_queued
from runs.transitions import db_time
from runs.vocabulary import RunStatus

logger = logging.getLogger(__name__)


def next_due_run():
    """The id of the queued run due longest by the database's clock, or None."""
    return (
        AgentRun.objects.filter(status=RunStatus.QUEUED, available_at__lte=db_time())
        .order_by("available_at")
        .values_list("pk", flat=True)
        .first()
    )


def execute_due_runs(*, limit: int, stopping=lambda: False) -> int:
    """Claim and execute up to ``limit`` due runs, one after another, until
    none is due or ``stopping()``; returns how many were tried.

    The next due run is looked up afresh before each claim, so a run that a
    longer run before it let fall due meanwhile is taken in order, and one
    that another executor took meanwhile is not tried again.
    """
    tried = 0
    while tried < limit and not stopping():
        run_id = next_due_run()
        if run_id is None:
            break
        run_queued(run_id)  # never raises for the run's outcome
        tried += 1
    return tried


def serve(*, interval: float, batch_size: int, stop: threading.Event) -> None:
    """Pass after pass until ``stop`` is set; a run being executed when it is
    set is finished first. A pass that fails (the database away, say) is
    logged and tried again after ``interval``: a run it left behind is the
    next pass's or the reaper's."""
    with executing_in_embedded_worker():
        while not stop.is_set():
            backlog = False
            try:
                report = reap_stale_runs()
                if report.decisions or report.lost_races:
                    logger.info("embedded worker: reaper pass: %s", report.summary())
                tried = execute_due_runs(limit=batch_size, stopping=stop.is_set)
                # A full batch: more may be due; the next pass starts at once.
                backlog = tried == batch_size
            except Exception:
                logger.exception("embedded worker: pass failed; next one in %ss", interval)
            finally:
                close_old_connections()
            if not backlog:
                stop.wait(interval)
