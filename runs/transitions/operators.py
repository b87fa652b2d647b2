"""Operators' transitions (G10, G11), and a step recorded outside any
attempt's records: what a write returned after its time limit (G15)."""

from django.db.models import F

from ground.commits import reaching_disk
from runs.models import AgentRun
from runs.models.vocabulary import RunMode, RunStatus
from runs.transitions.common import (
    Lease,
    append_step,
    db_time,
    log_change,
    update_returning,
)
from runs.transitions.unused_approvals import void_unused_decisions


def operator_requeue(run_id, *, seen_status: str, seen_step_count: int, step: dict) -> int | None:
    """``failed``/``cancelled`` → ``queued`` by an operator, with a fresh
    budget; the next attempt resumes from the journal (G12). Returns the
    new job's dispatch number (never one used before: the budget is reset,
    the dispatch count is not), or None if nothing matched.

    Guarded by the status and step count the requeue verdict was made on:
    of two concurrent requeues of one run exactly one matches.
    """
    return _back_in_queue_by_operator(
        "operator_requeue", run_id, seen_status, seen_step_count, step, {}
    )


def operator_restart(run_id, *, seen_status: str, seen_step_count: int, step: dict) -> int | None:
    """``operator_requeue``, but the next attempt starts from the beginning:
    the journal begins after this operator step, so nothing is replayed."""
    # SET sees the old step_count: + 1 is the operator step appended below.
    restarted = {"journal_begins_after": F("step_count") + 1}
    return _back_in_queue_by_operator(
        "operator_restart", run_id, seen_status, seen_step_count, step, restarted
    )


def _back_in_queue_by_operator(
    action: str, run_id, seen_status: str, seen_step_count: int, step: dict, extra: dict
) -> int | None:
    with reaching_disk():
        rows = update_returning(
            AgentRun.objects.filter(
                pk=run_id,
                status=seen_status,
                status__in=[RunStatus.FAILED, RunStatus.CANCELLED],
                step_count=seen_step_count,
            ),
            ("dispatch_count",),
            status=RunStatus.QUEUED,
            # A worker executes it from now on, whoever started it: the
            # reaper must not take it for a caller's (G7).
            mode=RunMode.QUEUED,
            termination_reason="",
            failure_class="",
            error_type="",
            error_message="",
            output="",
            lease_owner="",
            lease_expires_at=None,
            pending_effect="",
            pending_call=None,
            cancel_requested_at=None,
            requeue_count=0,
            dispatch_count=F("dispatch_count") + 1,
            available_at=db_time(),
            finished_at=None,
            step_count=F("step_count") + 1,
            **extra,
        )
        if not rows:
            return None
        # The run ended before it used these decisions: its next attempt
        # asks again rather than spend an approval of a run someone stopped.
        void_unused_decisions([run_id])
        sequence, _ = append_step(run_id, None, step)
    log_change(action, run_id, sequence=sequence, status=RunStatus.QUEUED)
    return rows[0][0]


def append_operator_step(run_id, step: dict) -> bool:
    """Record an operator's action on the run's step stream, whatever its status."""
    with reaching_disk():
        if not AgentRun.objects.filter(pk=run_id).update(step_count=F("step_count") + 1):
            return False
        sequence, _ = append_step(run_id, None, step)
    log_change("operator_step", run_id, sequence=sequence, kind=step.get("kind"))
    return True


def record_late_write(lease: Lease, step: dict) -> bool:
    """Record what a write returned after its run had stopped counting on
    it (a ``late_result`` step, G15), whatever the run's status now, under
    the lease token of the attempt that ran it: the operator who reconciles
    the write in doubt reads it there."""
    with reaching_disk():
        if not AgentRun.objects.filter(pk=lease.run_id).update(step_count=F("step_count") + 1):
            return False
        sequence, _ = append_step(lease.run_id, lease.token, step)
    log_change("late_result", lease.run_id, sequence=sequence, lease_token=lease.token)
    return True
