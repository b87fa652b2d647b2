"""Ending a run: settle, dead-letter, requeue for retry, failed dispatch, cancel (G9)."""

import enum
from collections.abc import Sequence

from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.db.models import Case, F, Q, Value, When

from ground.commits import reaching_disk
from runs.models import AgentRun, DeadLetter
from runs.models.metrics import APPROVAL_DECISIONS
from runs.models.vocabulary import DeadLetterReason, RunStatus, TerminationReason
from runs.transitions.common import (
    Lease,
    append_steps,
    db_time,
    drop_broken_connection,
    ending_changes,
    log_change,
    logger,
    owned_run,
    owned_run_holding,
    requeue_changes,
    steps_lost,
    update_returning,
)
from runs.transitions.step_journal import finish_in_one_statement
from runs.transitions.steps import add_spend_through_the_orm, usage_totals, usage_values
from runs.transitions.unused_approvals import withdraw_approvals
from tools.effects import ToolEffect


def settle(
    lease: Lease,
    status: str,
    reason: str,
    *,
    output: str = "",
    failure_class: str = "",
    error_type: str = "",
    error_message: str = "",
    fence: dict | None = None,
) -> bool:
    """Move a running run to a terminal status; a late settle changes nothing (G9).

    A run that would end ``failed`` while a cancel is requested ends
    ``cancelled`` instead (the failure's details kept): the operator's
    decision wins — unless its fence stands on a ``non_idempotent_write``,
    whose doubt must reach the dead letters. The write fence is left as it
    stands: a run that ends with a fence up has a write in doubt, and that
    must stay visible. ``fence`` (``effect``, ``tool``, ``arguments``,
    ``idempotency_key``) stands it again for a call that may have run
    although its fence was cleared since (G12).
    """
    return (
        _settle(
            lease,
            status,
            reason,
            output=output,
            failure_class=failure_class,
            error_type=error_type,
            error_message=error_message,
            fence=fence,
        )
        is not None
    )


def _settle(lease: Lease, status: str, reason: str, *, fence: dict | None, **fields) -> str | None:
    """``settle``: the status the run ended with, or None if the lease was
    not this one's any more."""
    if status not in RunStatus.terminal():
        raise ValueError(f"settle needs a terminal status, not {status!r}")
    standing = {}
    if fence is not None:
        call = {key: fence[key] for key in ("tool", "arguments", "idempotency_key")}
        standing = {"pending_effect": fence["effect"], "pending_call": call}
    ending_status, ending_reason = status, reason
    if (
        status == RunStatus.FAILED
        and standing.get("pending_effect") != ToolEffect.NON_IDEMPOTENT_WRITE
    ):
        # One UPDATE decides, on the row as it is: a cancel requested a
        # moment ago is seen, and nothing can come between.
        cancel_wins = Q(cancel_requested_at__isnull=False)
        if not standing:
            cancel_wins &= ~Q(pending_effect=ToolEffect.NON_IDEMPOTENT_WRITE)
        ending_status = Case(
            When(cancel_wins, then=Value(RunStatus.CANCELLED)), default=Value(status)
        )
        ending_reason = Case(
            When(cancel_wins, then=Value(TerminationReason.CANCELLED)), default=Value(reason)
        )
    with reaching_disk():
        rows = update_returning(
            owned_run(lease),
            ("status",),
            **ending_changes(ending_status, ending_reason, **fields, **standing),
        )
    if not rows:
        logger.warning(
            "settle ignored: run=%s lease_token=%s is no longer this lease's (wanted %s/%s)",
            lease.run_id,
            lease.token,
            status,
            reason,
        )
        return None
    (ended,) = rows[0]
    log_change("settle", lease.run_id, lease_token=lease.token, status=ended, reason=reason)
    return ended


def _unmatched(lease: Lease, recorded: int | None) -> "FinishOutcome":
    return FinishOutcome.STEPS_LOST if steps_lost(lease, recorded) else FinishOutcome.LEASE_LOST


class FinishOutcome(enum.Enum):
    COMPLETED = "completed"
    #: A cancel had been requested: it won over the final answer (G9).
    CANCELLED = "cancelled"
    LEASE_LOST = "lease_lost"
    #: Nothing changed: the run holds fewer of the attempt's steps than it
    #: had recorded (``RecordOutcome.STEPS_LOST``).
    STEPS_LOST = "steps_lost"
    #: The database refused the step; nothing changed.
    FAILED = "failed"
    #: The connection broke before the database answered: the run may have
    #: been settled or not (``attempt_step_count`` tells which).
    UNKNOWN = "unknown"


def finish(
    lease: Lease,
    steps: Sequence[dict],
    *,
    output: str,
    recorded: int | None = None,
    settle_reservations: bool = False,
) -> FinishOutcome:
    """Record the final answer's step (the last of ``steps``, after any
    earlier ones still unwritten) and settle the run in one write:
    ``completed`` with ``output`` — or ``cancelled`` if a cancel was requested.
    Never raises. ``FAILED`` leaves the run as it was, for the caller to settle
    without the steps (a non-tool step is fail-soft, G2). ``recorded``: as
    ``record_steps``'. ``settle_reservations``: the attempt's reservations are settled
    by the same statement (G21).
    """
    try:
        if connection.vendor == "postgresql":
            finished = finish_in_one_statement(
                lease,
                steps,
                output=output,
                usage=usage_values(steps),
                recorded=recorded,
                settle_reservations=settle_reservations,
            )
            if finished is None:
                return _unmatched(lease, recorded)
            cancel_at, sequence = finished
        else:
            cancelled = Q(cancel_requested_at__isnull=False)
            with transaction.atomic():
                matched = owned_run_holding(lease, recorded).update(
                    step_count=F("step_count") + len(steps),
                    attempt_steps=F("attempt_steps") + len(steps),
                    **ending_changes(
                        Case(
                            When(cancelled, then=Value(RunStatus.CANCELLED)),
                            default=Value(RunStatus.COMPLETED),
                        ),
                        Case(
                            When(cancelled, then=Value(TerminationReason.CANCELLED)),
                            default=Value(TerminationReason.COMPLETED),
                        ),
                        output=Case(When(cancelled, then=Value("")), default=Value(output)),
                        failure_class="",
                        error_type="",
                        error_message="",
                    ),
                    **usage_totals(steps),
                )
                if not matched:
                    return _unmatched(lease, recorded)
                sequence, cancel_at = append_steps(lease.run_id, lease.token, list(steps))
                add_spend_through_the_orm(lease.run_id, steps)
    except DatabaseError as error:
        logger.error(
            "final step not persisted: run=%s lease_token=%s: %s", lease.run_id, lease.token, error
        )
        drop_broken_connection()
        if isinstance(error, OperationalError | InterfaceError):
            return FinishOutcome.UNKNOWN
        return FinishOutcome.FAILED
    outcome = FinishOutcome.COMPLETED if cancel_at is None else FinishOutcome.CANCELLED
    log_change(
        "settle",
        lease.run_id,
        lease_token=lease.token,
        sequence=sequence,
        status=outcome.value,
        reason=outcome.value,
    )
    return outcome


def dead_letter(
    lease: Lease,
    reason: str,
    *,
    failure_class: str,
    error_type: str,
    error_message: str,
    fence: dict | None = None,
) -> bool:
    """Fail a queued run for good and open a dead letter, atomically
    (``fence``: as ``settle``'s). A cancel requested meanwhile wins as it
    does in ``settle``: the run ends ``cancelled``, with no dead letter."""
    details = {"failure_class": failure_class, "error_type": error_type}
    with reaching_disk():
        ended = _settle(
            lease,
            RunStatus.FAILED,
            reason,
            error_message=error_message,
            fence=fence,
            **details,
        )
        if ended == RunStatus.FAILED:
            DeadLetter.objects.create(
                run_id=lease.run_id, reason=reason, error_message=error_message, **details
            )
    return ended is not None


@reaching_disk()
def requeue_for_retry(
    lease: Lease,
    *,
    failure_class: str,
    error_type: str,
    error_message: str,
    delay_seconds: float = 0,
) -> int | None:
    """Give a failed attempt back to the queue: ``running → queued``, budget
    spent +1, due after ``delay_seconds``. Returns its new dispatch number
    (its job's), or None if it was not requeued.

    Refused while the fence stands on a non-idempotent write: that write may
    have landed (G8). A cancel requested before the retry wins: the run ends
    ``cancelled`` instead and is not requeued (G9).
    """
    details = {
        "failure_class": failure_class,
        "error_type": error_type,
        "error_message": error_message,
    }
    # The cancel first, then the requeue guarded on there being none; a
    # cancel requested between the two fails the second, and the first,
    # tried again, ends the run. (A cancel is never withdrawn from a
    # running run, so twice is enough.)
    for _ in range(2):
        if _cancel_instead(lease, details):
            return None
        rows = update_returning(
            owned_run(lease)
            .filter(cancel_requested_at__isnull=True)
            .exclude(pending_effect=ToolEffect.NON_IDEMPOTENT_WRITE),
            ("dispatch_count",),
            **requeue_changes(delay_seconds),
            **details,
        )
        if rows:
            log_change("requeue_for_retry", lease.run_id, lease_token=lease.token)
            return rows[0][0]
        if not owned_run(lease).filter(cancel_requested_at__isnull=False).exists():
            return None  # lost, or fenced on a non-idempotent write
    return None


def _cancel_instead(lease: Lease, details: dict) -> bool:
    """End the run ``cancelled`` if a cancel is pending (and no
    non-idempotent write is in doubt, which ``settle`` keeps for the dead
    letters); whether it did."""
    cancelled = bool(
        owned_run(lease)
        .filter(cancel_requested_at__isnull=False)
        .exclude(pending_effect=ToolEffect.NON_IDEMPOTENT_WRITE)
        .update(**ending_changes(RunStatus.CANCELLED, TerminationReason.CANCELLED, **details))
    )
    if cancelled:
        log_change("settle", lease.run_id, lease_token=lease.token, status=RunStatus.CANCELLED)
    return cancelled


def fail_dispatch(run_id, dispatch_count: int, error: BaseException, failure_class: str) -> bool:
    """A ``queued`` run whose job could not be enqueued, for a reason trying
    again would not cure, fails with a dead letter rather than wait for a
    wake-up that will never come. Guarded by the dispatch it was for: a run
    queued again since (a newer job) is left alone."""
    details = {
        "failure_class": failure_class,
        "error_type": type(error).__name__,
        "error_message": str(error),
    }
    with reaching_disk():
        failed = AgentRun.objects.filter(
            pk=run_id, status=RunStatus.QUEUED, dispatch_count=dispatch_count
        ).update(**ending_changes(RunStatus.FAILED, TerminationReason.DISPATCH_FAILED, **details))
        if failed:
            DeadLetter.objects.create(
                run_id=run_id, reason=DeadLetterReason.DISPATCH_FAILED, **details
            )
    return bool(failed)


class CancelOutcome(enum.Enum):
    CANCELLED = "cancelled"  # it was queued: it will never start
    REQUESTED = "requested"  # it is running: its worker stops at the next step boundary
    ALREADY_REQUESTED = "already_requested"
    TERMINAL = "terminal"  # it had already ended; nothing changed
    NOT_FOUND = "not_found"


@reaching_disk()
def cancel(run_id) -> CancelOutcome:
    """Cancel a run: at once if queued or waiting (for approval or input: its
    pending requests are withdrawn with it); by fence if running (G9)."""
    queued = AgentRun.objects.filter(pk=run_id, status=RunStatus.QUEUED)
    if queued.update(**ending_changes(RunStatus.CANCELLED, TerminationReason.CANCELLED)):
        log_change("cancel", run_id, status=RunStatus.CANCELLED)
        return CancelOutcome.CANCELLED
    with transaction.atomic():
        # The run's row first, then its approvals (the order decide_approval
        # locks in): a decision racing this cancel either comes first and
        # releases the run, or finds it cancelled and its request withdrawn.
        waiting = AgentRun.objects.filter(pk=run_id, status__in=RunStatus.waiting())
        if waiting.update(**ending_changes(RunStatus.CANCELLED, TerminationReason.CANCELLED)):
            withdrawn = withdraw_approvals(run_id)
            transaction.on_commit(lambda: APPROVAL_DECISIONS.labels("withdrawn").inc(withdrawn))
            log_change("cancel", run_id, status=RunStatus.CANCELLED)
            return CancelOutcome.CANCELLED
    running = AgentRun.objects.filter(
        pk=run_id, status=RunStatus.RUNNING, cancel_requested_at__isnull=True
    )
    if running.update(cancel_requested_at=db_time()):
        log_change("cancel_requested", run_id)
        return CancelOutcome.REQUESTED
    status = AgentRun.objects.filter(pk=run_id).values_list("status", flat=True).first()
    if status is None:
        return CancelOutcome.NOT_FOUND
    if status == RunStatus.RUNNING:
        return CancelOutcome.ALREADY_REQUESTED
    if status in (RunStatus.QUEUED, *RunStatus.waiting()):
        # Claimed and requeued (or parked) between our updates: once more.
        return cancel(run_id)
    return CancelOutcome.TERMINAL
