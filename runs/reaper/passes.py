"""One reaper pass (G7): recovers runs whose worker stopped renewing its lease,
and queued runs whose wake-up job Redis lost.

A stale run is requeued when that is safe and the budget allows, and
dead-lettered otherwise. A run that waited for approval longer than
``NRLLM_APPROVAL_TIMEOUT_SECONDS`` ends ``failed``/``approval_expired``; one
still within it holds no lease and is left alone (G14).

Every mutation is a transition that re-checks staleness inside its UPDATE,
so running two reapers at once, or racing a slow-but-alive worker, changes
each run at most once. Time is the database's.

A pass that completes is recorded (``runs.models.last_passes``): the
console's only sign that the reaper, or the embedded worker whose passes are
the reaper's, is alive. Then the pass delivers the run-ended webhooks that
are due (G19): retries, and events a worker died before sending.
"""

import functools
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef

from runs import transitions
from runs.models import AgentRun, ApprovalRequest, HeldRun
from runs.models.last_passes import REAPER, WRITE_EVERY_SECONDS, LastPass
from runs.models.metrics import APPROVAL_DECISIONS, REAPER_DECISIONS
from runs.models.vocabulary import ApprovalStatus, RunMode, RunStatus, StepKind, WaitKind
from runs.queue.dispatch import dispatch_many_or_fail, dispatch_or_fail, job_id_for, live_job_ids
from runs.queue.held_runs import wake_held_runs
from runs.reaper.decisions import (
    ABANDON,
    CANCEL,
    DEAD_LETTER,
    EXPIRE,
    EXPIRE_INPUT,
    REDISPATCH,
    REQUEUE,
    ReapDecision,
    decide_reap,
)
from runs.run_webhooks import DeliveryReport, deliver_due
from runs.transitions import Reaping, StaleLease, db_time
from spend.reservations import release_dead

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Beat:
    """Which row a pass is recorded in, and how often its process passes."""

    name: str
    every_seconds: float


@dataclass
class ReapReport:
    decisions: dict = field(default_factory=dict)  # run id -> "action: reason"
    #: Stale when looked at, renewed (or taken) before the reaper's UPDATE.
    lost_races: int = 0
    #: The run-ended webhooks this pass tried (G19).
    webhooks: DeliveryReport = field(default_factory=DeliveryReport)
    #: Reservations of dead attempts released (G21).
    reservations_released: int = 0

    def count(self, action: str) -> int:
        return sum(1 for outcome in self.decisions.values() if outcome.startswith(action))

    def summary(self) -> str:
        actions = (REQUEUE, DEAD_LETTER, CANCEL, ABANDON, REDISPATCH, EXPIRE, EXPIRE_INPUT)
        counts = ", ".join(f"{action} {self.count(action)}" for action in actions)
        return f"{counts}, left to a live worker {self.lost_races}, {self.webhooks.summary()}"


#: Stale runs reaped per transaction: one commit and one Redis pipeline per
#: chunk instead of per run, while row locks are held only briefly.
CHUNK_SIZE = 100


_STALE_FIELDS = (
    "id",
    "mode",
    "lease_token",
    "lease_owner",
    "lease_expires_at",
    "pending_effect",
    "pending_call",
    "requeue_count",
    "cancel_requested_at",
    "team_id",
)


def reap_stale_runs(
    *, as_of: datetime | None = None, batch_size: int = 1000, beat: Beat | None = None
) -> ReapReport:
    """One reaper pass. ``as_of`` replaces the database's "now" (for tests).
    A pass that completes is recorded for the console (``runs.models.last_passes``):
    as the reaper's, or as ``beat`` says (the embedded worker's); one made
    ``as_of`` another time is not."""
    report = ReapReport()
    now = as_of if as_of is not None else db_time()
    stale = AgentRun.objects.filter(status=RunStatus.RUNNING, lease_expires_at__lt=now)
    stale_runs = list(stale.order_by("lease_expires_at").values(*_STALE_FIELDS)[:batch_size])
    lost = []
    for start in range(0, len(stale_runs), CHUNK_SIZE):
        lost += _reap_chunk(stale_runs[start : start + CHUNK_SIZE], as_of, report)
    if lost:
        # A run that changed between the look and the UPDATE (a fence, a
        # cancel) is decided again on what it is now, once in this pass.
        again = list(stale.filter(pk__in=lost).values(*_STALE_FIELDS))
        report.lost_races -= len(again)
        _reap_chunk(again, as_of, report)
    # After the reaping: a reaped attempt's reservations are dead now (G21).
    report.reservations_released = release_dead(AgentRun._meta.db_table)
    _expire_approvals(as_of, report)
    _expire_input_waits(as_of, batch_size, report)
    if settings.REDIS_URL:
        # Without Redis no queued run has a job to lose: the embedded worker
        # executes every queued run once it is due.
        _redispatch_lost_jobs(as_of, batch_size, report)
    # A run whose team's cap held it back waits for the worker that frees a
    # slot to wake it; one that died first, or a cap raised, leaves it here.
    _wake_held_runs()
    if as_of is None:
        # A pass "as of" another time (a test's, reap_stale_runs --as-of) is
        # no sign of life: recorded, a future one would show a dead reaper
        # alive until that time.
        _record_pass(beat or Beat(REAPER, settings.NRLLM_REAPER_INTERVAL_SECONDS))
    # Last, after every run is decided: a slow receiver delays no reaping.
    # Each event's claim re-checks that it is still due (G19).
    report.webhooks = deliver_due(
        as_of=as_of, deadline=time.monotonic() + settings.NRLLM_REAPER_INTERVAL_SECONDS / 2
    )
    return report


def _reap_chunk(runs: list[dict], as_of, report: ReapReport) -> list[str]:
    """Decide each run, then carry out each decision for its whole group in
    one transition; requeued runs are dispatched in one pipeline after
    commit. Returns the runs that changed before the reaper's UPDATE."""
    groups: dict[ReapDecision, list[Reaping]] = {}
    for run in runs:
        decision = decide_reap(
            pending_effect=run["pending_effect"],
            audit_failed=bool((run["pending_call"] or {}).get(transitions.AUDIT_FAILED)),
            interactive=run["mode"] == RunMode.INTERACTIVE,
            requeue_count=run["requeue_count"],
            max_requeues=settings.NRLLM_MAX_REQUEUES,
            cancel_requested=run["cancel_requested_at"] is not None,
        )
        groups.setdefault(decision, []).append(_reaping(run, decision))
    lost, teams = [], {str(run["id"]): run["team_id"] for run in runs}
    with transaction.atomic():
        for decision, reapings in groups.items():
            if decision.action == REQUEUE:
                reaped = transitions.reap_requeue(reapings, as_of)
                requeued = [(run_id, count, teams[run_id]) for run_id, count in reaped]
                transaction.on_commit(functools.partial(dispatch_many_or_fail, requeued))
            elif decision.action == CANCEL:
                reaped = transitions.reap_cancelled(reapings, as_of)
            elif decision.action == ABANDON:
                reaped = transitions.reap_abandoned(reapings, as_of)
            else:
                reaped = transitions.reap_dead_letter(reapings, as_of, reason=decision.reason)
            lost += _report(decision, reapings, [run_id for run_id, _ in reaped], report)
    return lost


def _reaping(run: dict, decision: ReapDecision) -> Reaping:
    step = {
        "kind": StepKind.REAPER,
        "result": {
            "decision": decision.action,
            "reason": decision.reason,
            "stale_lease_owner": run["lease_owner"],
            "stale_lease_token": run["lease_token"],
            "lease_expired_at": run["lease_expires_at"].isoformat(),
            "pending_effect": run["pending_effect"],
            "requeue_count": run["requeue_count"],
        },
    }
    error = ""
    if decision.action == DEAD_LETTER:
        error = (
            f"lease of {run['lease_owner']} (token {run['lease_token']}) expired at "
            f"{run['lease_expires_at'].isoformat()} with fence {run['pending_effect']!r}"
        )
    seen = StaleLease(
        str(run["id"]),
        run["lease_token"],
        pending_effect=run["pending_effect"],
        pending_call=run["pending_call"],
        cancel_requested=run["cancel_requested_at"] is not None,
        requeue_count=run["requeue_count"],
    )
    return Reaping(seen, step, error)


def _report(
    decision: ReapDecision, reapings: list[Reaping], reaped: list[str], report
) -> list[str]:
    """Count and log what was done; returns the runs that were not reaped."""
    done, lost = set(reaped), []
    for reaping in reapings:
        run_id = reaping.stale.run_id
        if run_id not in done:
            report.lost_races += 1
            lost.append(run_id)
            logger.info("reaper: run=%s renewed or changed before the reaper acted", run_id)
            continue
        report.decisions[run_id] = f"{decision.action}: {decision.reason}"
        REAPER_DECISIONS.labels(decision.action).inc()
        logger.warning(
            "reaper: run=%s lease_token=%s %s (%s)",
            run_id,
            reaping.stale.token,
            decision.action,
            decision.reason,
        )
    return lost


def _expire_approvals(as_of, report: ReapReport) -> None:
    ended, expired = transitions.expire_approvals(as_of)
    if expired:
        APPROVAL_DECISIONS.labels("expired").inc(expired)
    for run_id in ended:
        report.decisions[run_id] = f"{EXPIRE}: nobody decided in time"
        REAPER_DECISIONS.labels(EXPIRE).inc()
        logger.warning("reaper: run=%s failed: its approval request expired", run_id)


def _expire_input_waits(as_of, batch_size: int, report: ReapReport) -> None:
    """End the waits for an answer or a completion past their expiry (G24),
    each in a transaction of its own: a question's result says nobody
    answered, a deferred read or idempotent write goes back to the queue to
    run again with its key, a deferred non-idempotent write is in doubt.
    At most ``batch_size`` a pass, the longest overdue first; the next pass
    takes the rest."""
    now = as_of if as_of is not None else db_time()
    overdue = ApprovalRequest.objects.filter(
        status=ApprovalStatus.PENDING,
        kind__in=[WaitKind.QUESTION, WaitKind.DEFERRED],
        expires_at__lte=now,
    ).values_list("pk", "run_id")
    for request_id, run_id in overdue.order_by("expires_at")[:batch_size]:
        with transaction.atomic():
            what, answered = transitions.expire_input_wait(
                request_id, as_of=as_of, max_requeues=settings.NRLLM_MAX_REQUEUES
            )
            if answered.outcome is transitions.AnswerOutcome.RELEASED:
                release = (str(run_id), answered.dispatch_count, answered.team_id)
                transaction.on_commit(
                    lambda release=release: dispatch_or_fail(
                        release[0], dispatch_count=release[1], team_id=release[2]
                    )
                )
        if what:
            report.decisions[str(run_id)] = f"{EXPIRE_INPUT}: {_INPUT_EXPIRY[what]}"
            REAPER_DECISIONS.labels(EXPIRE_INPUT).inc()
            logger.warning("reaper: run=%s %s", run_id, _INPUT_EXPIRY[what])


_INPUT_EXPIRY = {
    "question": "its question expired unanswered; the model is told",
    "retry": "its deferred call was not completed in time; it runs again with its key",
    "retries_exhausted": "its deferred call was not completed in time, too often; failed",
    "in_doubt": "its deferred non-idempotent write was not completed in time: in doubt",
}


def _redispatch_lost_jobs(as_of, batch_size: int, report: ReapReport) -> None:
    threshold = settings.NRLLM_REDISPATCH_AFTER_SECONDS
    cutoff = as_of - timedelta(seconds=threshold) if as_of is not None else db_time(-threshold)
    waiting = list(
        AgentRun.objects.filter(status=RunStatus.QUEUED, available_at__lt=cutoff)
        # Held by its team's cap (G22): it has no job on purpose, and waits
        # to be woken (``_wake_held_runs``).
        .exclude(Exists(HeldRun.objects.filter(run=OuterRef("pk"))))
        .order_by("available_at")
        .values_list("id", "dispatch_count", "team_id")[:batch_size]
    )
    live = live_job_ids(
        [job_id_for(run_id, count) for run_id, count, _team in waiting],
        grace_seconds=threshold,
    )
    for run_id, dispatch_count, team_id in waiting:
        if job_id_for(run_id, dispatch_count) in live:
            continue
        step = {
            "kind": StepKind.REAPER,
            "result": {"decision": REDISPATCH, "reason": "queued run had no job in Redis"},
        }
        # Re-checked in its UPDATE: still queued, for the same job, still
        # long past due, no cancel (G7).
        dispatched = transitions.note_redispatch(
            run_id, seen_dispatch=dispatch_count, due_before=cutoff, step=step
        )
        if dispatched is not None:
            report.decisions[str(run_id)] = f"{REDISPATCH}: no job in Redis"
            REAPER_DECISIONS.labels(REDISPATCH).inc()
            logger.warning("reaper: run=%s redispatched (its job was lost)", run_id)
            _dispatch_after_commit(run_id, dispatched, team_id)


def _wake_held_runs() -> None:
    for team_id in transitions.teams_holding():
        try:
            woken = wake_held_runs(team_id)
        except Exception:
            # One team's failure leaves the other teams' wakes, and the pass.
            logger.exception("reaper: team=%s held runs not woken", team_id)
            continue
        if woken:
            logger.info("reaper: team=%s %d held runs woken", team_id, woken)


def _record_pass(beat: Beat) -> None:
    """Record a pass now (the database's now) in ``LastPass``. Off every
    run's path, at the end of a pass: one UPDATE of one row when the row is
    older than ``WRITE_EVERY_SECONDS``; otherwise that UPDATE and an INSERT
    that conflicts, neither writing anything. The first pass ever inserts
    the row (two passes racing to: one wins, both fine)."""
    at, older = db_time(), db_time(-WRITE_EVERY_SECONDS)
    # Read when the pass is made: a forking worker's job runs in a child.
    fields = {
        "at": at,
        "process": f"{socket.gethostname()}:{os.getpid()}",
        "every_seconds": beat.every_seconds,
    }
    if LastPass.objects.filter(name=beat.name, at__lt=older).update(**fields):
        return
    LastPass.objects.bulk_create([LastPass(name=beat.name, **fields)], ignore_conflicts=True)


def _dispatch_after_commit(run_id, dispatch_count: int, team_id: int) -> None:
    transaction.on_commit(
        functools.partial(dispatch_or_fail, run_id, dispatch_count=dispatch_count, team_id=team_id)
    )
