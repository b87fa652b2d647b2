"""The embedded default's worker: what ``manage.py embedded_worker`` does.

Without Redis there is no ``rqworker --with-scheduler`` to execute a run and
no ``rqcron`` to run the reaper. This loop stands in for both, in one
process beside the web server: every pass is one reaper pass, then the
queued runs that are due, the team with the fewest in flight first, and
its oldest first, each claimed here and executed in a
thread of its own, up to ``NRLLM_WORKER_CONCURRENCY`` at once — as
``runs.worker.ConcurrentWorker`` executes them in production (G15), tool
time limits included. The web server executes no run itself (a new run
waits here for the next pass), unless ``NRLLM_EXECUTE_IN_CALLER`` says so.

Due-ness is the database's clock, like every lease. Two executors may go
for the same run (a second embedded worker, say): the claim decides,
exactly one wins, the others do nothing.
"""

import logging
import threading

from django.db import close_old_connections
from django.db.models import Count, Exists, OuterRef, Subquery
from django.db.models.functions import Coalesce

from runs.models import AgentRun, HeldRun
from runs.models.last_passes import EMBEDDED_WORKER
from runs.models.vocabulary import RunStatus
from runs.queue.dispatch import executing_in_embedded_worker
from runs.reaper import Beat, reap_stale_runs
from runs.runtime import claim_queued, execute_claimed, run_queued
from runs.transitions import db_time
from runs.workers.run_threads import RunThreads
from triggers.firing import fire_due_schedules

logger = logging.getLogger(__name__)


def next_due_run():
    """The id of the queued run to claim next, or None: of the teams with a
    run due (by the database's clock), the one with the fewest runs
    ``running``, and its run due longest; none that its team's cap holds
    back. So one team's backlog does not hold back another's runs (G22)."""
    running = (
        AgentRun.objects.filter(status=RunStatus.RUNNING, team_id=OuterRef("team_id"))
        .order_by()
        .values("team_id")
        .annotate(count=Count("pk"))
        .values("count")
    )
    return (
        AgentRun.objects.filter(status=RunStatus.QUEUED, available_at__lte=db_time())
        .exclude(Exists(HeldRun.objects.filter(run=OuterRef("pk"))))
        .annotate(team_running=Coalesce(Subquery(running), 0))
        .order_by("team_running", "available_at")
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


def start_due_runs(runs: RunThreads, *, stopping=lambda: False) -> int:
    """Claim due runs, oldest first, and start each in a thread of its own
    while ``runs`` has a free slot; returns how many were started."""
    started = 0
    while not stopping() and runs.take_slot(timeout=0):
        try:
            run_id = next_due_run()
            claimed = claim_queued(run_id) if run_id is not None else None
        except BaseException:
            runs.give_back()  # the database away, say: the pass fails, the slot stays free
            raise
        if claimed is None:
            runs.give_back()
            if run_id is None:
                break
            continue  # another executor took it, or its team's cap held it: the next one
        runs.start(lambda claimed=claimed: execute_claimed(claimed), name=f"run-{run_id}")
        started += 1
    return started


def serve(*, interval: float, runs: RunThreads, stop: threading.Event) -> None:
    """Pass after pass until ``stop`` is set, leaving the runs it started in
    flight (the caller drains them). A pass that fails (the database away,
    say) is logged and tried again after ``interval``: a run it left behind
    is the next pass's or the reaper's. Each pass is recorded as the
    embedded worker's (``runs.models.last_passes``): the console shows it alive."""
    beat = Beat(EMBEDDED_WORKER, interval)
    with executing_in_embedded_worker():
        while not stop.is_set():
            try:
                report = reap_stale_runs(beat=beat)
                if report.decisions or report.lost_races:
                    logger.info("embedded worker: reaper pass: %s", report.summary())
                # Schedules fire here too (G23): their runs start in this pass.
                fired = fire_due_schedules()
                if fired.fired or fired.paused or fired.refused:
                    logger.info("embedded worker: %s", fired.summary())
                start_due_runs(runs, stopping=stop.is_set)
            except Exception:
                logger.exception("embedded worker: pass failed; next one in %ss", interval)
            finally:
                close_old_connections()
            stop.wait(interval)
