"""Ending a run: settle, dead-letter, requeue for retry, failed dispatch, cancel (G9)."""

import enum
from collections.abc import Sequence

from django.db import DatabaseError, connection, transaction
from django.db.models import Case, F, Q, Value, When

from runs.models import AgentRun, DeadLetter
from runs.step_journal import finish_in_one_statement
from runs.transitions._common import (
    Lease,
    _append_steps,
    _back_in_queue,
    _drop_broken_connection,
    _ended,
    _log_change,
    _owned,
    db_time,
    logger,
)
from runs.transitions.steps import _usage_totals, _usage_values
from runs.vocabulary import RunStatus, TerminationReason
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

    The write fence is left as it stands: a run that ends with a fence up has
    a write in doubt, and that must stay visible. ``fence`` (``effect``,
    ``tool``, ``arguments``, ``idempotency_key``) stands it again for a call
    that may have run although its fence was cleared since (G12).
    """
    if status not in RunStatus.terminal():
        raise ValueError(f"settle needs a terminal status, not {status!r}")
    standing = {}
    if fence is not None:
        call = {key: fence[key] for key in ("tool", "arguments", "idempotency_key")}
        standing = {"pending_effect": fence["effect"], "pending_call": call}
    matched = _owned(lease).update(
        **_ended(
            status,
            reason,
            output=output,
            failure_class=failure_class,
            error_type=error_type,
            error_message=error_message,
            **standing,
        )
    )
    if matched:
        _log_change("settle", lease.run_id, lease_token=lease.token, status=status, reason=reason)
    if not matched:
        logger.warning(
            "settle ignored: run=%s lease_token=%s is no longer this lease's (wanted %s/%s)",
            lease.run_id,
            lease.token,
            status,
            reason,
        )
    return bool(matched)


class FinishOutcome(enum.Enum):
    COMPLETED = "completed"
    #: A cancel had been requested: it won over the final answer (G9).
    CANCELLED = "cancelled"
    LEASE_LOST = "lease_lost"
    #: The database refused the step; nothing changed.
    FAILED = "failed"


def finish(lease: Lease, steps: Sequence[dict], *, output: str) -> FinishOutcome:
    """Record the final answer's step (the last of ``steps``, after any
    earlier ones still unwritten) and settle the run in one write:
    ``completed`` with ``output`` — or ``cancelled`` if a cancel was requested.
    Never raises. ``FAILED`` leaves the run as it was, for the caller to settle
    without the steps (a non-tool step is fail-soft, G2).
    """
    try:
        if connection.vendor == "postgresql":
            finished = finish_in_one_statement(
                lease, steps, output=output, usage=_usage_values(steps)
            )
            if finished is None:
                return FinishOutcome.LEASE_LOST
            cancel_at, sequence = finished
        else:
            cancelled = Q(cancel_requested_at__isnull=False)
            with transaction.atomic():
                matched = _owned(lease).update(
                    step_count=F("step_count") + len(steps),
                    **_ended(
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
                    **_usage_totals(steps),
                )
                if not matched:
                    return FinishOutcome.LEASE_LOST
                sequence, cancel_at = _append_steps(lease.run_id, lease.token, list(steps))
    except DatabaseError as error:
        logger.error(
            "final step not persisted: run=%s lease_token=%s: %s", lease.run_id, lease.token, error
        )
        _drop_broken_connection()
        return FinishOutcome.FAILED
    outcome = FinishOutcome.COMPLETED if cancel_at is None else FinishOutcome.CANCELLED
    _log_change(
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
    (``fence``: as ``settle``'s)."""
    with transaction.atomic():
        if not settle(
            lease,
            RunStatus.FAILED,
            reason,
            failure_class=failure_class,
            error_type=error_type,
            error_message=error_message,
            fence=fence,
        ):
            return False
        DeadLetter.objects.create(
            run_id=lease.run_id,
            reason=reason,
            failure_class=failure_class,
            error_type=error_type,
            error_message=error_message,
        )
    return True


def requeue_for_retry(
    lease: Lease,
    *,
    failure_class: str,
    error_type: str,
    error_message: str,
    delay_seconds: float = 0,
) -> bool:
    """Give a failed attempt back to the queue: ``running → queued``, budget spent +1,
    due after ``delay_seconds``. Refused while the fence stands on a
    non-idempotent write: that write may have landed (G8)."""
    requeued = bool(
        _owned(lease)
        .exclude(pending_effect=ToolEffect.NON_IDEMPOTENT_WRITE)
        .update(
            **_back_in_queue(delay_seconds),
            failure_class=failure_class,
            error_type=error_type,
            error_message=error_message,
        )
    )
    if requeued:
        _log_change("requeue_for_retry", lease.run_id, lease_token=lease.token)
    return requeued


def fail_dispatch(run_id, error: BaseException, failure_class: str) -> bool:
    """A ``queued`` run whose job could not be dispatched fails, rather than
    waiting for a wake-up that will never come."""
    return bool(
        AgentRun.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
            **_ended(
                RunStatus.FAILED,
                TerminationReason.DISPATCH_FAILED,
                failure_class=failure_class,
                error_type=type(error).__name__,
                error_message=str(error),
            )
        )
    )


class CancelOutcome(enum.Enum):
    CANCELLED = "cancelled"  # it was queued: it will never start
    REQUESTED = "requested"  # it is running: its worker stops at the next step boundary
    ALREADY_REQUESTED = "already_requested"
    TERMINAL = "terminal"  # it had already ended; nothing changed
    NOT_FOUND = "not_found"


def cancel(run_id) -> CancelOutcome:
    """Cancel a run: at once if queued; by fence if running (G9)."""
    queued = AgentRun.objects.filter(pk=run_id, status=RunStatus.QUEUED)
    if queued.update(**_ended(RunStatus.CANCELLED, TerminationReason.CANCELLED)):
        _log_change("cancel", run_id, status=RunStatus.CANCELLED)
        return CancelOutcome.CANCELLED
    running = AgentRun.objects.filter(
        pk=run_id, status=RunStatus.RUNNING, cancel_requested_at__isnull=True
    )
    if running.update(cancel_requested_at=db_time()):
        _log_change("cancel_requested", run_id)
        return CancelOutcome.REQUESTED
    status = AgentRun.objects.filter(pk=run_id).values_list("status", flat=True).first()
    if status is None:
        return CancelOutcome.NOT_FOUND
    if status == RunStatus.RUNNING:
        return CancelOutcome.ALREADY_REQUESTED
    if status == RunStatus.QUEUED:
        # Claimed and requeued between our two updates: try once more.
        return cancel(run_id)
    return CancelOutcome.TERMINAL
