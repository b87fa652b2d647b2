"""Recording a step under the lease (G2, G6)."""

import enum
from dataclasses import dataclass

from django.db import DatabaseError, connection, transaction
from django.db.models import F, JSONField, Value
from django.db.models.expressions import Case, When

from runs.step_journal import record_step_in_one_statement
from runs.transitions._common import (
    Lease,
    _append_step,
    _drop_broken_connection,
    _expiry,
    _log_change,
    _owned,
    logger,
)


class RecordOutcome(enum.Enum):
    PERSISTED = "persisted"
    #: Persisted, and an operator has asked to cancel the run.
    PERSISTED_CANCEL_REQUESTED = "persisted_cancel_requested"
    LEASE_LOST = "lease_lost"
    FAILED = "failed"

    @property
    def persisted(self) -> bool:
        return self in (RecordOutcome.PERSISTED, RecordOutcome.PERSISTED_CANCEL_REQUESTED)


@dataclass(frozen=True)
class NextCall:
    """The tool call that follows the step being recorded: the record's renewal
    is that call's renewal (G5), and a write's fence is stamped with it (G6)."""

    #: The write's effect, or "" for a read (no fence).
    fence: str
    #: What the fence names: tool, arguments, idempotency key (None for a read).
    call: dict | None


def record_step(
    lease: Lease,
    lease_seconds: float,
    step: dict,
    *,
    clear_fence: bool,
    next_call: NextCall | None = None,
) -> RecordOutcome:
    """Append a step under the lease, renewing it; never raises.

    With ``clear_fence`` the write fence is cleared in the same transaction
    as the insert, so the fence stands exactly until the write is audited (G6).
    With ``next_call`` the same UPDATE stamps the next call's fence instead —
    unless a cancel was requested, which the outcome then reports and the
    call never runs. A database error rolls back everything and returns
    ``FAILED`` (G2).
    """
    try:
        if connection.vendor == "postgresql":
            matched, cancel_at, sequence = record_step_in_one_statement(
                lease,
                lease_seconds,
                step,
                clear_fence=clear_fence,
                next_call=next_call,
                usage=_usage_values(step),
            )
            if not matched:
                return RecordOutcome.LEASE_LOST
        else:
            changes = _record_changes(lease_seconds, step, clear_fence, next_call)
            with transaction.atomic():
                if not _owned(lease).update(**changes):
                    return RecordOutcome.LEASE_LOST
                sequence, cancel_at = _append_step(lease.run_id, lease.token, step)
        _log_change(
            "record_step",
            lease.run_id,
            lease_token=lease.token,
            sequence=sequence,
            kind=step.get("kind"),
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


def _record_changes(lease_seconds: float, step: dict, clear_fence: bool, next_call) -> dict:
    """The ORM's version of what ``step_journal`` writes on PostgreSQL (built
    only when needed: the expressions cost more than the statement's Python)."""
    changes = {"step_count": F("step_count") + 1, "lease_expires_at": _expiry(lease_seconds)}
    changes.update(_usage_totals(step))
    if next_call is not None:
        changes.update(_stamp_unless_cancelled(next_call))
    elif clear_fence:
        changes["pending_effect"] = ""
        changes["pending_call"] = None
    return changes


def _stamp_unless_cancelled(next_call: NextCall) -> dict:
    if not next_call.fence:
        return {"pending_effect": "", "pending_call": None}
    not_cancelled = {"cancel_requested_at__isnull": True}
    fence = Value(next_call.fence)
    return {
        "pending_effect": Case(When(**not_cancelled, then=fence), default=Value("")),
        "pending_call": Case(
            When(**not_cancelled, then=Value(next_call.call, output_field=JSONField())),
            default=None,
            output_field=JSONField(),
        ),
    }


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
