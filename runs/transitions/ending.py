"""Ending a run: settle, dead-letter, requeue for retry, failed dispatch, cancel (G9)."""

import enum

from django.db import transaction

from runs.models import AgentRun, DeadLetter
from runs.transitions._common import (
    Lease,
    _back_in_queue,
    _ended,
    _log_change,
    _owned,
    db_time,
    logger,
)
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
) -> bool:
    """Move a running run to a terminal status; a late settle changes nothing (G9).

    The write fence is left as it stands: a run that ends with a fence up has
    a write in doubt, and that must stay visible.
    """
    if status not in RunStatus.terminal():
        raise ValueError(f"settle needs a terminal status, not {status!r}")
    matched = _owned(lease).update(
        **_ended(
            status,
            reason,
            output=output,
            failure_class=failure_class,
            error_type=error_type,
            error_message=error_message,
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


def dead_letter(
    lease: Lease, reason: str, *, failure_class: str, error_type: str, error_message: str
) -> bool:
    """Fail a queued run for good and open a dead letter, atomically."""
    with transaction.atomic():
        if not settle(
            lease,
            RunStatus.FAILED,
            reason,
            failure_class=failure_class,
            error_type=error_type,
            error_message=error_message,
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
