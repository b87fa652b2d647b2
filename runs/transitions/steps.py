"""Recording steps under the lease (G2, G6, G12)."""

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.db.models import F, JSONField, Value
from django.db.models.expressions import Case, When

from runs.models import AgentRun, RunStep
from runs.models.vocabulary import StepKind
from runs.transitions.common import (
    Lease,
    append_steps,
    db_time,
    drop_broken_connection,
    log_change,
    logger,
    owned_run_holding,
    steps_lost,
)
from runs.transitions.step_journal import record_steps_in_one_statement
from spend import reservations
from spend.prices import priced_model
from spend.recording import TurnsSpend, add_daily_spend, turns_spend, user_spent_since
from tools.canonical import token_count
from tools.effects import ToolEffect


class RecordOutcome(enum.Enum):
    PERSISTED = "persisted"
    #: Persisted, and an operator has asked to cancel the run.
    PERSISTED_CANCEL_REQUESTED = "persisted_cancel_requested"
    LEASE_LOST = "lease_lost"
    #: Nothing was recorded: the run is still the lease's, but holds fewer
    #: of the attempt's steps than it had recorded (a database server crash
    #: lost commits that had not reached disk, G12).
    STEPS_LOST = "steps_lost"
    #: The database refused the statement: nothing was recorded.
    FAILED = "failed"
    #: The connection broke before the database answered: the statement may
    #: have committed or not (``attempt_step_count`` tells which).
    UNKNOWN = "unknown"

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
    recorded: int | None = None,
) -> RecordOutcome:
    """``record_steps`` with one step."""
    return record_steps(
        lease,
        lease_seconds,
        [step],
        clear_fence=clear_fence,
        next_call=next_call,
        recorded=recorded,
    )


def record_steps(
    lease: Lease,
    lease_seconds: float,
    steps: Sequence[dict],
    *,
    clear_fence: bool,
    next_call: NextCall | None = None,
    recorded: int | None = None,
    wait_for_flush: bool | None = None,
    tally=None,
) -> RecordOutcome:
    """Append ``steps`` in order under the lease, renewing it; never raises.
    All of them or none: the journal never has a gap (G12).

    With ``clear_fence`` the write fence is cleared in the same transaction
    as the insert, so the fence stands exactly until the write is audited (G6).
    With ``next_call`` the same UPDATE stamps the next call's fence instead —
    unless a cancel was requested, which the outcome then reports and the
    call never runs. A database error rolls back everything and returns
    ``FAILED`` (G2) — or ``UNKNOWN`` when the connection broke, since the
    statement may have committed before it did.

    With ``recorded`` (how many steps the attempt has recorded) nothing is
    written unless the run holds exactly those: ``STEPS_LOST`` if it holds
    fewer (G12: the journal never has a gap). ``wait_for_flush``: whether the
    commit waits for the WAL flush; by default ``must_reach_disk`` decides.

    Model turns add their spend to the run's totals and the submitter's day
    in the same transaction (G17); ``tally`` (a ``spend.recording.Tally``)
    learns the totals as they stand after the record.
    """
    last = steps[-1] if steps else {}
    try:
        if connection.vendor == "postgresql":
            matched, cancel_at, sequence = record_steps_in_one_statement(
                lease,
                lease_seconds,
                steps,
                clear_fence=clear_fence,
                next_call=next_call,
                usage=usage_values(steps),
                wait_for_flush=must_reach_disk(steps, clear_fence=clear_fence, next_call=next_call)
                if wait_for_flush is None
                else wait_for_flush,
                recorded=recorded,
                tally=tally,
            )
            if not matched:
                return _unmatched(lease, recorded)
        else:
            changes = _record_changes(lease_seconds, steps, clear_fence, next_call)
            with transaction.atomic():
                if not owned_run_holding(lease, recorded).update(**changes):
                    return _unmatched(lease, recorded)
                sequence, cancel_at = append_steps(lease.run_id, lease.token, steps)
                add_spend_through_the_orm(lease.run_id, steps, tally)
        log_change(
            "record_step",
            lease.run_id,
            lease_token=lease.token,
            sequence=sequence,
            kind=last.get("kind"),
            **({"steps": len(steps)} if len(steps) != 1 else {}),
        )
    except DatabaseError as error:
        logger.error(
            "step not persisted: run=%s lease_token=%s kind=%s tool=%s (%d steps): %s",
            lease.run_id,
            lease.token,
            last.get("kind"),
            last.get("tool_name", ""),
            len(steps),
            error,
        )
        drop_broken_connection()
        if isinstance(error, OperationalError | InterfaceError):
            return RecordOutcome.UNKNOWN
        return RecordOutcome.FAILED
    if cancel_at is not None:
        return RecordOutcome.PERSISTED_CANCEL_REQUESTED
    return RecordOutcome.PERSISTED


def must_reach_disk(steps: Sequence[dict], *, clear_fence: bool, next_call) -> bool:
    """Whether the record's commit waits for its WAL to reach disk.

    A record of model turns, reads and resume steps only, stamping no
    write's fence, does not wait (``synchronous_commit = off`` for its own
    transaction, as the claim's). Only a crash of the database server before its WAL writer
    flushes (a fraction of a second, ``wal_writer_delay``) can lose it, and
    what that loses is what G12 already allows a crash to lose: a tail of
    read and model steps after the last durable one, which the attempt
    still holds and writes again, or else its retry redoes (a read is safe
    to repeat; a lost model turn was acted on by reads only).

    Every statement that something outside the database depends on waits:
    a write's fence (G6) — so the turn that asked for the write and
    everything before it is on disk before the write starts, since
    PostgreSQL flushes its WAL in order —, a write's record (G2), the
    settle. Every record is guarded on how many steps the attempt has
    recorded, so one whose earlier steps a crash lost matches nothing and
    the attempt writes them again (``StepLedger.restore_lost_steps``).
    """
    if clear_fence or not steps or (next_call is not None and next_call.fence):
        return True
    return not all(_may_be_lost(step) for step in steps)


def skips_the_flush(steps: Sequence[dict], *, clear_fence: bool, next_call) -> bool:
    """Whether ``record_steps`` commits these without waiting for the flush."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return False  # the ORM's records, or a caller's transaction, commit as it does
    return not must_reach_disk(steps, clear_fence=clear_fence, next_call=next_call)


def add_spend_through_the_orm(
    run_id, steps: Sequence[dict], tally=None, *, lease_token: int | None = None
) -> None:
    """What ``step_journal``'s statements do for spend, for the records that
    go through the ORM: the model turns among ``steps`` are added to the
    submitter's day (and settle the reservations of the attempt
    ``lease_token``, G21), and ``tally`` learns the run's totals. Inside the
    transaction of the guarded UPDATE that added them to the run."""
    spend = turns_spend(steps)
    if not spend and tally is None:
        return
    run = (
        AgentRun.objects.filter(pk=run_id)
        .values(
            "submitted_by_id",
            "team_id",
            "request",
            "prompt_tokens",
            "completion_tokens",
            "cost",
            "unpriced_turns",
        )
        .get()
    )
    if spend:
        provider, model = priced_model((run["request"] or {}).get("provider") or {})
        add_daily_spend(
            run_id, run["submitted_by_id"] or 0, provider, model, spend, team=run["team_id"]
        )
        if lease_token is not None:
            reservations.settle(run_id, lease_token, spend)
    if tally is not None:
        tally.saw_run(
            run["prompt_tokens"], run["completion_tokens"], run["cost"], run["unpriced_turns"]
        )
        if tally.budget_since is not None:
            spent = user_spent_since(tally)
            tally.saw_user(spent.tokens, spent.cost, TurnsSpend())


def _may_be_lost(step: dict) -> bool:
    kind = step.get("kind")
    # A resume step only says what the attempt replayed (and the tokens that
    # saved): nothing outside the database depends on it.
    return kind in (StepKind.LLM, StepKind.RESUME) or (
        kind == StepKind.TOOL and step.get("effect") == ToolEffect.READ_ONLY
    )


def _unmatched(lease: Lease, recorded: int | None) -> RecordOutcome:
    return RecordOutcome.STEPS_LOST if steps_lost(lease, recorded) else RecordOutcome.LEASE_LOST


#: The kinds of step an attempt records itself (the claim's request step
#: included); reaper and operator steps may carry its token too.
_ATTEMPT_KINDS = (StepKind.REQUEST, StepKind.RESUME, StepKind.LLM, StepKind.TOOL)


def attempt_step_count(lease: Lease) -> int:
    """How many steps the attempt holding ``lease`` has recorded: after an
    ``UNKNOWN`` record, whether its steps are there. Raises DatabaseError."""
    return RunStep.objects.filter(
        run_id=lease.run_id, lease_token=lease.token, kind__in=_ATTEMPT_KINDS
    ).count()


def _record_changes(
    lease_seconds: float, steps: Sequence[dict], clear_fence: bool, next_call
) -> dict:
    """The ORM's version of what ``step_journal`` writes on PostgreSQL (built
    only when needed: the expressions cost more than the statement's Python)."""
    changes = {"lease_expires_at": db_time(lease_seconds)}
    if steps:
        changes["step_count"] = F("step_count") + len(steps)
        changes["attempt_steps"] = F("attempt_steps") + len(steps)
    changes.update(usage_totals(steps))
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


def usage_values(steps: Sequence[dict]) -> dict:
    """What ``steps`` add to the run's totals: the llm steps' tokens, cost
    and latency (``prompt_tokens``, ``cached_tokens``, ``completion_tokens``,
    ``cost``, ``unpriced_turns``, ``latency_ms``), a resume step's saved
    tokens (``tokens_saved``); {} if nothing."""
    values: dict = {}
    spend = turns_spend(steps)
    if spend:
        values.update(
            prompt_tokens=spend.input_tokens,
            cached_tokens=spend.cached_input_tokens,
            completion_tokens=spend.output_tokens,
            cost=spend.cost,
            unpriced_turns=spend.unpriced_turns,
            latency_ms=sum(
                token_count(step["result"].get("latency_ms"))
                for step in steps
                if step.get("kind") == StepKind.LLM
                and isinstance(step.get("result"), dict)
                and "usage" in step["result"]
            ),
        )
    saved = sum(
        token_count(step["result"]["tokens_saved"])
        for step in steps
        if step.get("kind") == StepKind.RESUME
        and isinstance(step.get("result"), dict)
        and step["result"].get("tokens_saved")
    )
    if saved:
        values["tokens_saved"] = saved
    return values


def usage_totals(steps: Sequence[dict]) -> dict:
    """The run's totals grow with each llm step that reports usage, and with
    what a resume step saved."""
    values = usage_values(steps)
    totals = {}
    if "prompt_tokens" in values:
        for column, key in _TOTALS:
            totals[column] = F(column) + values[key]
    if "tokens_saved" in values:
        totals["tokens_saved_by_replay"] = F("tokens_saved_by_replay") + values["tokens_saved"]
    return totals


#: The run's total columns and what each adds (``usage_values``' keys).
_TOTALS = (
    ("prompt_tokens", "prompt_tokens"),
    ("cached_prompt_tokens", "cached_tokens"),
    ("completion_tokens", "completion_tokens"),
    ("cost", "cost"),
    ("unpriced_turns", "unpriced_turns"),
    ("llm_latency_ms", "latency_ms"),
)
