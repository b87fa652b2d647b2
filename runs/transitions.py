"""Every guarded state change of a run, and the only writer of its status.

Each transition is one conditional UPDATE whose WHERE states what must still
be true (status, lease owner, lease token), and each reports whether it
matched. A worker that lost its run — reaped, re-claimed, cancelled, settled
by someone else — matches nothing and so changes nothing (G4–G6, G9).
"""

import enum
import logging
from dataclasses import dataclass
from datetime import timedelta

from django.db import DatabaseError, connection, transaction
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, Value
from django.db.models.functions import Now

from runs.models import AgentRun, DeadLetter, RunStep
from runs.step_journal import record_step_in_one_statement
from runs.vocabulary import RunMode, RunStatus, TerminationReason
from tools.effects import ToolEffect

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lease:
    """Proof of ownership of a running run: every guarded write names it."""

    run_id: str
    owner: str
    token: int


def _log_change(action: str, run_id, **fields) -> None:
    """Every state change is logged with the fields a JSON log line carries."""
    logger.info(
        "%s run=%s %s",
        action,
        run_id,
        " ".join(f"{key}={value}" for key, value in fields.items()),
        extra={"action": action, "run_id": str(run_id), **fields},
    )


def _owned(lease: Lease):
    # The status is part of the guard: a run settled or cancelled by anyone
    # else is no longer this lease's to touch.
    return AgentRun.objects.filter(
        pk=lease.run_id,
        status=RunStatus.RUNNING,
        lease_owner=lease.owner,
        lease_token=lease.token,
    )


def db_time(after_seconds: float = 0):
    """The database's clock, ``after_seconds`` from now, as an SQL expression.

    Every lease and every staleness check uses the database's clock, so
    workers and reapers on machines whose clocks disagree still agree on
    which leases have expired.
    """
    if not after_seconds:
        return Now()
    return ExpressionWrapper(
        Now() + Value(timedelta(seconds=after_seconds), output_field=DurationField()),
        output_field=DateTimeField(),
    )


def _expiry(lease_seconds: float):
    return db_time(lease_seconds)


# --- creating runs -------------------------------------------------------


def create_queued_run(request: dict, prompt: str) -> AgentRun:
    """Store a ``queued`` run; the caller dispatches its job after commit."""
    return AgentRun.objects.create(
        request=request,
        prompt=prompt,
        status=RunStatus.QUEUED,
        mode=RunMode.QUEUED,
        available_at=db_time(),
    )


def begin_interactive(request: dict, prompt: str, owner: str, lease_seconds: float) -> Lease:
    """Store an ``interactive`` run already running under a first lease."""
    run = AgentRun.objects.create(
        request=request,
        prompt=prompt,
        status=RunStatus.RUNNING,
        mode=RunMode.INTERACTIVE,
        lease_owner=owner,
        lease_token=1,
        lease_expires_at=_expiry(lease_seconds),
        started_at=db_time(),
    )
    return Lease(str(run.pk), owner, 1)


# --- the lease -------------------------------------------------------------


def claim(run_id, owner: str, lease_seconds: float) -> Lease | None:
    """Take a ``queued`` run: ``queued → running`` with a new lease token.

    Of any number of concurrent claims exactly one matches; a duplicate or
    stale job gets None and must do nothing.
    """
    with transaction.atomic():
        claimed = AgentRun.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
            status=RunStatus.RUNNING,
            lease_owner=owner,
            lease_token=F("lease_token") + 1,
            lease_expires_at=_expiry(lease_seconds),
            pending_effect="",
            pending_call=None,
            started_at=db_time(),
        )
        if not claimed:
            return None
        # The UPDATE's row lock is held until commit, so this reads our token.
        token = AgentRun.objects.filter(pk=run_id).values_list("lease_token", flat=True).get()
    _log_change("claim", run_id, lease_token=token)
    return Lease(str(run_id), owner, token)


def renew_lease(
    lease: Lease, lease_seconds: float, *, fence: str = "", call: dict | None = None
) -> bool:
    """Extend the lease (heartbeat); with ``fence``, also stamp the write fence.

    Before a tool call (``fence`` given, possibly empty) the renewal also
    requires that no cancel was requested, so a cancelled run starts no tool.
    False means the lease is lost or the run must stop.
    """
    return bool(
        _owned(lease)
        .filter(cancel_requested_at__isnull=True)
        .update(
            lease_expires_at=_expiry(lease_seconds),
            pending_effect=fence,
            pending_call=call if fence else None,
        )
    )


def heartbeat(lease: Lease, lease_seconds: float) -> bool:
    """Extend the lease at a step boundary; False if the lease is lost."""
    return bool(_owned(lease).update(lease_expires_at=_expiry(lease_seconds)))


def cancel_requested(lease: Lease) -> bool:
    """Whether the run is still this lease's and an operator asked to cancel."""
    return _owned(lease).filter(cancel_requested_at__isnull=False).exists()


# --- steps -----------------------------------------------------------------


class RecordOutcome(enum.Enum):
    PERSISTED = "persisted"
    #: Persisted, and an operator has asked to cancel the run.
    PERSISTED_CANCEL_REQUESTED = "persisted_cancel_requested"
    LEASE_LOST = "lease_lost"
    FAILED = "failed"

    @property
    def persisted(self) -> bool:
        return self in (RecordOutcome.PERSISTED, RecordOutcome.PERSISTED_CANCEL_REQUESTED)


def record_step(
    lease: Lease, lease_seconds: float, step: dict, *, clear_fence: bool
) -> RecordOutcome:
    """Append a step under the lease, renewing it; never raises.

    With ``clear_fence`` the write fence is cleared in the same transaction
    as the insert, so the fence stands exactly until the write is audited (G6).
    A database error rolls back both and returns ``FAILED`` (G2).
    """
    changes = {"step_count": F("step_count") + 1, "lease_expires_at": _expiry(lease_seconds)}
    changes.update(_usage_totals(step))
    if clear_fence:
        changes["pending_effect"] = ""
        changes["pending_call"] = None
    try:
        if connection.vendor == "postgresql":
            matched, cancel_at = record_step_in_one_statement(
                lease, lease_seconds, step, clear_fence=clear_fence, usage=_usage_values(step)
            )
            if not matched:
                return RecordOutcome.LEASE_LOST
        else:
            with transaction.atomic():
                if not _owned(lease).update(**changes):
                    return RecordOutcome.LEASE_LOST
                cancel_at = _append_step(lease.run_id, lease.token, step)
        logger.debug(
            "step run=%s kind=%s",
            lease.run_id,
            step.get("kind"),
            extra={"action": "record_step", "run_id": lease.run_id, "lease_token": lease.token},
        )
    except DatabaseError as error:
        logger.error(
            "step not persisted: run=%s lease_token=%s kind=%s tool=%s: %s",
            lease.run_id,
            lease.token,
            step.get("kind"),
            step.get("tool_name", ""),
            error,
        )
        _drop_broken_connection()
        return RecordOutcome.FAILED
    if cancel_at is not None:
        return RecordOutcome.PERSISTED_CANCEL_REQUESTED
    return RecordOutcome.PERSISTED


def _usage_values(step: dict) -> dict:
    """What an llm step adds to the run's token and latency totals ({} if nothing)."""
    result = step.get("result") if step.get("kind") == "llm" else None
    if not isinstance(result, dict) or "usage" not in result:
        return {}
    usage = result.get("usage") or {}
    return {
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
        "completion_tokens": int(usage.get("completion_tokens") or 0),
        "latency_ms": int(result.get("latency_ms") or 0),
    }


def _usage_totals(step: dict) -> dict:
    """The run's token and latency totals grow with each llm step that reports them."""
    values = _usage_values(step)
    if not values:
        return {}
    return {
        "prompt_tokens": F("prompt_tokens") + values["prompt_tokens"],
        "completion_tokens": F("completion_tokens") + values["completion_tokens"],
        "llm_latency_ms": F("llm_latency_ms") + values["latency_ms"],
    }


def _append_step(run_id, lease_token: int | None, step: dict):
    """Insert a step numbered by the ``step_count`` the caller's guarded UPDATE
    just incremented (its row lock is held until commit, so the number is
    ours alone). ``lease_token`` None: the run's current one. Returns the
    run's ``cancel_requested_at``."""
    sequence, cancel_at, current_token = (
        AgentRun.objects.filter(pk=run_id)
        .values_list("step_count", "cancel_requested_at", "lease_token")
        .get()
    )
    token = current_token if lease_token is None else lease_token
    RunStep.objects.create(run_id=run_id, sequence=sequence, lease_token=token, **step)
    return cancel_at


def _drop_broken_connection() -> None:
    """After a database error, drop the connection if it is dead so the next
    statement reconnects instead of failing on a closed socket forever."""
    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()


# --- ending a run ------------------------------------------------------------


def _ended(status: str, reason: str, **fields) -> dict:
    return {
        "status": status,
        "termination_reason": reason,
        "finished_at": db_time(),
        "lease_owner": "",
        "lease_expires_at": None,
        **fields,
    }


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


def _back_in_queue(delay_seconds: float = 0) -> dict:
    # The fence is cleared: whoever requeues has decided that no
    # non-idempotent write is in doubt.
    return {
        "status": RunStatus.QUEUED,
        "lease_owner": "",
        "lease_expires_at": None,
        "pending_effect": "",
        "pending_call": None,
        "requeue_count": F("requeue_count") + 1,
        "available_at": db_time(delay_seconds),
    }


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


# --- the reaper (G7) ----------------------------------------------------------


@dataclass(frozen=True)
class StaleLease:
    """What the reaper saw of a run whose lease had expired."""

    run_id: str
    token: int


def _still_stale(stale: StaleLease, as_of):
    # Re-checked inside every reaper UPDATE: a worker that renewed after the
    # reaper looked (a slow-but-alive worker) no longer matches, and keeps its run.
    return AgentRun.objects.filter(
        pk=stale.run_id,
        status=RunStatus.RUNNING,
        lease_token=stale.token,
        lease_expires_at__lt=as_of if as_of is not None else Now(),
    )


def _reap(stale: StaleLease, as_of, changes: dict, step: dict, dead_letter_fields=None) -> bool:
    with transaction.atomic():
        matched = _still_stale(stale, as_of).update(step_count=F("step_count") + 1, **changes)
        if not matched:
            return False
        _append_step(stale.run_id, stale.token, step)
        if dead_letter_fields is not None:
            DeadLetter.objects.create(run_id=stale.run_id, **dead_letter_fields)
    _log_change("reap", stale.run_id, lease_token=stale.token, decision=step["result"]["decision"])
    return True


def reap_requeue(stale: StaleLease, as_of, step: dict) -> bool:
    """``running → queued`` for a stale run that is safe to run again."""
    return _reap(stale, as_of, _back_in_queue(), step)


def reap_dead_letter(stale: StaleLease, as_of, step: dict, *, reason: str, error: str) -> bool:
    """``running → failed`` with a dead letter; the fence is left standing."""
    details = {"failure_class": "", "error_type": "LeaseExpired", "error_message": error}
    return _reap(
        stale,
        as_of,
        _ended(RunStatus.FAILED, reason, **details),
        step,
        dead_letter_fields={"reason": reason, **details},
    )


def reap_cancelled(stale: StaleLease, as_of, step: dict) -> bool:
    """A stale run an operator asked to cancel ends ``cancelled``."""
    return _reap(stale, as_of, _ended(RunStatus.CANCELLED, TerminationReason.CANCELLED), step)


def note_redispatch(run_id, step: dict) -> bool:
    """Record on a still-``queued`` run that its lost job was dispatched again."""
    with transaction.atomic():
        matched = AgentRun.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
            step_count=F("step_count") + 1, available_at=db_time()
        )
        if matched:
            token = AgentRun.objects.filter(pk=run_id).values_list("lease_token", flat=True).get()
            _append_step(run_id, token, step)
    return bool(matched)


# --- operators (G10, G11) ------------------------------------------------------


def operator_requeue(run_id, *, seen_status: str, seen_step_count: int, step: dict) -> bool:
    """``failed``/``cancelled`` → ``queued`` by an operator, with a fresh budget.

    Guarded by the status and step count the requeue verdict was made on:
    of two concurrent requeues of one run exactly one matches.
    """
    with transaction.atomic():
        matched = AgentRun.objects.filter(
            pk=run_id,
            status=seen_status,
            status__in=[RunStatus.FAILED, RunStatus.CANCELLED],
            step_count=seen_step_count,
        ).update(
            status=RunStatus.QUEUED,
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
            available_at=db_time(),
            finished_at=None,
            step_count=F("step_count") + 1,
        )
        if matched:
            _append_step(run_id, None, step)
            _log_change("operator_requeue", run_id, status=RunStatus.QUEUED)
    return bool(matched)


def append_operator_step(run_id, step: dict) -> bool:
    """Record an operator's action on the run's step stream, whatever its status."""
    with transaction.atomic():
        if not AgentRun.objects.filter(pk=run_id).update(step_count=F("step_count") + 1):
            return False
        _append_step(run_id, None, step)
    return True


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
