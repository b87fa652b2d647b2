"""The reaper's transitions (G7): each re-checks staleness in its UPDATE, run by
run, and takes a whole group of runs with the same decision at once."""

import functools
import json
import operator
from dataclasses import dataclass

from django.db.models import Case, F, Q, TextField, Value, When
from django.db.models.functions import Now

from ground.commits import reaching_disk
from runs.models import AgentRun, DeadLetter, RunStep
from runs.models.vocabulary import RunStatus, TerminationReason
from runs.transitions.common import (
    append_step,
    db_time,
    ending_changes,
    log_change,
    requeue_changes,
    update_returning,
)


@dataclass(frozen=True)
class StaleLease:
    """What the reaper saw of a run whose lease had expired: everything its
    decision rests on, which its UPDATE checks again (G7)."""

    run_id: str
    token: int
    pending_effect: str = ""
    pending_call: dict | None = None
    cancel_requested: bool = False
    requeue_count: int = 0

    def seen_state(self) -> tuple:
        """What the decision rested on besides the attempt: the fence (a
        fence stamped, withdrawn or marked since must not be cleared by a
        decision made without it), the cancel request, the budget."""
        call = None if self.pending_call is None else json.dumps(self.pending_call, sort_keys=True)
        return (self.pending_effect, call, self.cancel_requested, self.requeue_count)


def _as_seen(stale: list[StaleLease]) -> Q:
    """These runs, each as it was seen. Runs seen in the same state (most:
    no fence, no cancel) share one condition on it, and each adds only its
    own id and token, so the UPDATE stays about as long as the group."""
    groups: dict[tuple, list[StaleLease]] = {}
    for lease in stale:
        groups.setdefault(lease.seen_state(), []).append(lease)
    conditions = []
    for (effect, _, cancel_requested, requeue_count), leases in groups.items():
        call = leases[0].pending_call
        state = Q(
            pending_effect=effect,
            cancel_requested_at__isnull=not cancel_requested,
            requeue_count=requeue_count,
        ) & (Q(pending_call__isnull=True) if call is None else Q(pending_call=call))
        attempts = functools.reduce(
            operator.or_, (Q(pk=lease.run_id, lease_token=lease.token) for lease in leases)
        )
        conditions.append(state & attempts)
    return functools.reduce(operator.or_, conditions)


@dataclass(frozen=True)
class Reaping:
    """A stale run, the reaper step that explains the decision, and for a
    dead letter the error it records."""

    stale: StaleLease
    step: dict
    error: str = ""


def _still_stale(reapings: list[Reaping], as_of):
    # Re-checked inside every reaper UPDATE, run by run: a worker that
    # renewed after the reaper looked (a slow-but-alive worker) no longer
    # matches, and keeps its run; nor does a run whose fence or cancel
    # changed since the reaper decided (the next pass decides again).
    return AgentRun.objects.filter(
        _as_seen([r.stale for r in reapings]),
        status=RunStatus.RUNNING,
        lease_expires_at__lt=as_of if as_of is not None else Now(),
    )


def _reap(reapings: list[Reaping], as_of, changes: dict, dead_letter: dict | None = None):
    """One UPDATE for the whole group, then its steps (and dead letters) in one
    INSERT each, in one transaction. Returns the ids of the runs it changed,
    each with its dispatch number as the UPDATE left it."""
    if not reapings:
        return []
    by_run = {r.stale.run_id: r for r in reapings}
    with reaching_disk():
        rows = update_returning(
            _still_stale(reapings, as_of),
            ("id", "step_count", "dispatch_count"),
            step_count=F("step_count") + 1,
            **changes,
        )
        reaped = [(str(run_id), sequence) for run_id, sequence, _ in rows]
        RunStep.objects.bulk_create(
            RunStep(
                run_id=run_id,
                sequence=sequence,
                lease_token=by_run[run_id].stale.token,
                **by_run[run_id].step,
            )
            for run_id, sequence in reaped
        )
        if dead_letter is not None:
            DeadLetter.objects.bulk_create(
                DeadLetter(run_id=run_id, error_message=by_run[run_id].error, **dead_letter)
                for run_id, _ in reaped
            )
    for run_id, sequence in reaped:
        reaping = by_run[run_id]
        decision = reaping.step["result"]["decision"]
        log_change(
            "reap", run_id, lease_token=reaping.stale.token, sequence=sequence, decision=decision
        )
    return [(str(run_id), dispatch_count) for run_id, _, dispatch_count in rows]


def reap_requeue(reapings: list[Reaping], as_of) -> list[tuple[str, int]]:
    """``running → queued`` for stale runs that are safe to run again; returns
    the ids it requeued, each with its new dispatch number (the others were
    renewed, taken or changed meanwhile)."""
    return _reap(reapings, as_of, requeue_changes())


def reap_dead_letter(reapings: list[Reaping], as_of, *, reason: str) -> list[tuple[str, int]]:
    """``running → failed`` with a dead letter each; the fence is left standing."""
    details = {"failure_class": "", "error_type": "LeaseExpired"}
    # Each run keeps its own error; one CASE sets them all in the same UPDATE.
    errors = Case(
        *(When(pk=r.stale.run_id, then=Value(r.error)) for r in reapings),
        default=Value(""),
        output_field=TextField(),
    )
    return _reap(
        reapings,
        as_of,
        ending_changes(RunStatus.FAILED, reason, error_message=errors, **details),
        dead_letter={"reason": reason, **details},
    )


def reap_cancelled(reapings: list[Reaping], as_of) -> list[tuple[str, int]]:
    """Stale runs an operator asked to cancel end ``cancelled``."""
    return _reap(reapings, as_of, ending_changes(RunStatus.CANCELLED, TerminationReason.CANCELLED))


def reap_abandoned(reapings: list[Reaping], as_of) -> list[tuple[str, int]]:
    """Stale interactive runs end ``failed``/``abandoned``: their caller is
    gone, and no worker finishes what a caller started (and may have
    stopped on purpose)."""
    return _reap(reapings, as_of, ending_changes(RunStatus.FAILED, TerminationReason.ABANDONED))


def note_redispatch(run_id, *, seen_dispatch: int, due_before, step: dict) -> int | None:
    """Record on a still-``queued`` run that its lost job is dispatched again;
    returns the new job's dispatch number, or None if the run changed since
    the reaper looked: claimed, cancelled, queued anew (another job), or no
    longer due before ``due_before`` (G7). One with a cancel pending ends
    ``cancelled`` instead."""
    seen = AgentRun.objects.filter(
        pk=run_id,
        status=RunStatus.QUEUED,
        dispatch_count=seen_dispatch,
        available_at__lt=due_before,
    )
    # A cancel requested of a running run that was queued again before this
    # check existed wins over its redispatch (G9).
    with reaching_disk():
        cancelled = seen.filter(cancel_requested_at__isnull=False).update(
            **ending_changes(RunStatus.CANCELLED, TerminationReason.CANCELLED)
        )
    if cancelled:
        log_change("cancel", run_id, status=RunStatus.CANCELLED)
        return None
    with reaching_disk():
        rows = update_returning(
            seen.filter(cancel_requested_at__isnull=True),
            ("lease_token", "dispatch_count"),
            step_count=F("step_count") + 1,
            dispatch_count=F("dispatch_count") + 1,
            available_at=db_time(),
        )
        if not rows:
            return None
        token, dispatch_count = rows[0]
        sequence, _ = append_step(run_id, token, step)
    log_change("redispatch", run_id, lease_token=token, sequence=sequence)
    return dispatch_count
