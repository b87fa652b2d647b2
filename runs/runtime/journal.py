"""A run's journal, read back for a re-executed attempt to replay (G12).

The journal is the run's llm and tool steps after ``journal_begins_after``,
in sequence order: one conversation, continued by every attempt where the
last one stopped. ``read_journal`` reads it in one query and checks that it
can be replayed as it stands. It refuses (``JournalUnreplayable``, naming
the step) rather than improvise: an outcome that is not the outcome of the
call at its place (another call's key: a gap, a duplicate), a recorded
outcome of a tool that is gone or switched off, a write whose outcome is
not recorded and whose tool is gone, a non-idempotent write recorded
outside the journal that the journal does not hold, a turn that is not
what a model turn looks like. What the attempt does then is the runtime's
decision; the requeue verdict reads the journal the same way.
"""

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from django.db import connection

from runs.models import AgentRun, ApprovalRequest, RunStep
from runs.models.selectors import calls_going_live
from runs.models.vocabulary import ApprovalStatus, StepKind
from runs.providers.base import ToolCall, Turn
from runs.runtime.loop import RecordedOutcome, RecordedTurn, StepEvent
from runs.runtime.run_request import RunRequest
from spend.prices import Usage
from tools.contract import idempotency_key_for
from tools.effects import ToolEffect
from tools.registry import effect_for, get_registry

_JOURNAL_KINDS = (StepKind.LLM, StepKind.TOOL)

# The journal's rows in one fixed statement (a resumed attempt reads it on
# its hot path; the ORM's compiling and converting cost as much as the query):
# the llm and tool steps after ``journal_begins_after``, and the
# non-idempotent writes recorded before it (a restart is refused after one,
# so only a run recorded before attempts resumed has them, migration 0013).
_JOURNAL_ROWS = f"""
    SELECT step.sequence, step.kind, step.tool_name, step.effect, step.result, step.error,
        step.idempotency_key, run.journal_begins_after
    FROM "{RunStep._meta.db_table}" step
    JOIN "{AgentRun._meta.db_table}" run ON run.id = step.run_id
    WHERE step.run_id = %(run_id)s AND (
        (step.kind IN ({", ".join(f"'{kind}'" for kind in _JOURNAL_KINDS)})
         AND step.sequence > run.journal_begins_after)
        OR (step.kind = '{StepKind.TOOL}' AND step.effect = '{ToolEffect.NON_IDEMPOTENT_WRITE}'
            AND step.sequence <= run.journal_begins_after AND step.idempotency_key <> ''))
    ORDER BY step.sequence
"""
_WRITES = (ToolEffect.IDEMPOTENT_WRITE, ToolEffect.NON_IDEMPOTENT_WRITE)


class JournalUnreplayable(Exception):
    """The journal cannot be replayed without contradicting it; the message
    names the step (or the stored request) and why."""

    def __init__(self, message: str, *, write: dict | None = None):
        super().__init__(message)
        #: A write call whose outcome is not recorded, as a fence names one
        #: (effect, tool, arguments, idempotency key): it may have run.
        self.write = write


@dataclass(frozen=True)
class Journal:
    turns: tuple[RecordedTurn, ...] = ()
    #: The last recorded llm or tool step: the attempt goes live after it.
    last_sequence: int = 0
    tool_results: int = 0
    #: Tool outcomes of writes that executed: replayed, never repeated.
    writes: int = 0
    #: Prompt and completion tokens the recorded turns cost.
    tokens: int = 0
    #: Recorded turns whose provider did not report their usage: what the
    #: run spent is unknown (G17).
    unreported_turns: int = 0
    #: The last recorded turn's result (its usage and cost), or None.
    last_turn_result: Any = None

    def __bool__(self) -> bool:
        return bool(self.turns)

    @property
    def model_turns(self) -> int:
        return len(self.turns)

    @property
    def ends_with_final_answer(self) -> bool:
        return bool(self.turns) and not self.turns[-1].turn.tool_calls

    def goes_live_with(self, run_id, idempotency_key: str) -> bool:
        """Whether a call of the last turn that has no outcome yet carries
        ``idempotency_key``: a resumed attempt runs that very call, with that
        key. (A write whose turn is not in the journal is asked of the model
        again, which may word it otherwise.)"""
        if not self.turns:
            return False
        last = self.turns[-1]
        calls = [(call.name, call.arguments) for call in last.turn.tool_calls]
        return idempotency_key in calls_going_live(
            run_id, len(self.turns), calls, len(last.outcomes)
        )

    @property
    def ends_with_whole_turn(self) -> bool:
        """The last turn asked for calls and every one has its outcome: the
        next thing would be a model turn."""
        if not self.turns:
            return False
        last = self.turns[-1]
        return bool(last.turn.tool_calls) and len(last.outcomes) == len(last.turn.tool_calls)

    def resume_event(self) -> StepEvent:
        """The step that records what a resumed attempt replayed."""
        return StepEvent(
            kind=StepKind.RESUME,
            result={
                "resumed_after": self.last_sequence,
                "model_turns": len(self.turns),
                "tool_results": self.tool_results,
                "writes": self.writes,
                "tokens_saved": self.tokens,
                "summary": self.describe(),
            },
        )

    def describe(self) -> str:
        return (
            f"resumed after step {self.last_sequence}: {len(self.turns)} model turns and "
            f"{self.tool_results} tool results replayed ({self.writes} writes not repeated)"
        )


def read_journal(
    run_id,
    *,
    registered: Collection[str],
    disabled: Collection[str],
    max_iterations: int,
    requested: Collection[str],
    before: int | None = None,
) -> Journal:
    """The run's journal, ready to replay, in one query. Raises
    ``JournalUnreplayable`` when it cannot be replayed as it stands.
    ``requested``: the tools the run's request names. ``before``: only
    the journal's steps before this sequence (a rerun's prefix, G20)."""
    with connection.cursor() as cursor:
        run_pk = AgentRun._meta.pk.get_db_prep_value(run_id, connection)  # SQLite: its hex
        cursor.execute(_JOURNAL_ROWS, {"run_id": run_pk})
        rows = cursor.fetchall()
    run_key = str(run_id)
    turns: list[tuple[int, Turn, list[RecordedOutcome]]] = []
    outside: dict[str, tuple[int, str]] = {}
    keys_in_journal: set[str] = set()
    tool_results = writes = tokens = unreported_turns = 0
    last_sequence = 0
    last_turn_result = None
    for sequence, kind, tool_name, effect, result, error, key, journal_begins_after in rows:
        if isinstance(result, str):  # Django loads jsonb as text; the ORM would decode it
            result = json.loads(result)
        if before is not None and sequence >= before:
            break
        if sequence <= journal_begins_after:
            outside.setdefault(key, (sequence, tool_name))
            continue
        last_sequence = sequence
        if kind == StepKind.LLM:
            _check_turn_complete(turns, sequence)
            turns.append((sequence, _recorded_turn(sequence, result), []))
            usage = Usage.of_result(result)
            if usage is not None:
                tokens += usage.total
                unreported_turns += not usage.reported
            last_turn_result = result
            continue
        if not turns:
            raise JournalUnreplayable(f"step {sequence}: a tool result before any model turn")
        turn_sequence, turn, outcomes = turns[-1]
        if len(outcomes) >= len(turn.tool_calls):
            raise JournalUnreplayable(
                f"step {sequence}: more tool results than the {len(turn.tool_calls)} calls "
                f"the model turn at step {turn_sequence} asked for",
            )
        call = turn.tool_calls[len(outcomes)]
        if tool_name != call.name:
            raise JournalUnreplayable(
                f"step {sequence} records {tool_name!r} where the model turn at step "
                f"{turn_sequence} asked for {call.name!r}",
            )
        if effect:  # the tool was planned: its code ran (or an old attempt replayed it)
            position = f"{len(turns)}.{len(outcomes)}"
            if key != idempotency_key_for(
                run_key, position, call.name, call.arguments
            ) and not _edited_as(run_key, turn_sequence, position, key):
                raise JournalUnreplayable(
                    f"step {sequence} records the outcome of another call than the one the "
                    f"model turn at step {turn_sequence} asked for at its place {position}",
                )
            _check_tool_available(sequence, tool_name, effect, registered, disabled)
            writes += effect in _WRITES
            keys_in_journal.add(key)
        outcomes.append(RecordedOutcome(sequence, result, error))
        tool_results += 1
    if len(turns) > max_iterations:
        raise JournalUnreplayable(
            f"step {turns[max_iterations][0]}: the journal holds {len(turns)} model turns, "
            f"more than the run's max_iterations of {max_iterations}",
        )
    if turns:
        _check_calls_to_go_live(turns[-1], len(turns), run_key, requested, registered, disabled)
    for key, (sequence, tool_name) in sorted(outside.items(), key=lambda item: item[1]):
        if key not in keys_in_journal:
            raise JournalUnreplayable(
                f"step {sequence} executed the non_idempotent_write {tool_name!r} before the "
                "journal begins (an attempt that started over, before attempts resumed), and "
                "the journal does not hold it: resuming could repeat it",
            )
    return Journal(
        turns=tuple(
            RecordedTurn(sequence, turn, tuple(outcomes)) for sequence, turn, outcomes in turns
        ),
        last_sequence=last_sequence,
        tool_results=tool_results,
        writes=writes,
        tokens=tokens,
        unreported_turns=unreported_turns,
        last_turn_result=last_turn_result,
    )


def read_journal_of(
    run_id, request: RunRequest, *, disabled: Collection[str], before: int | None = None
) -> Journal:
    """``read_journal`` as a resumed attempt reads it: the tools registered
    now, the run's request's tools and iteration cap."""
    registry = get_registry()
    # An MCP tool its toolset does not declare is registered once its
    # server listed it, which ``in`` asks for (``names`` never does).
    registered = {*registry.names(), *(name for name in request.tools if name in registry)}
    return read_journal(
        run_id,
        registered=registered,
        disabled=disabled,
        max_iterations=request.max_iterations,
        requested=request.tools,
        before=before,
    )


def _check_turn_complete(turns: list, sequence: int) -> None:
    """A new model turn follows only a turn whose every call has its outcome."""
    if not turns:
        return
    turn_sequence, turn, outcomes = turns[-1]
    if not turn.tool_calls:
        raise JournalUnreplayable(
            f"step {sequence}: a model turn after the final answer at step {turn_sequence}",
        )
    if len(outcomes) < len(turn.tool_calls):
        raise JournalUnreplayable(
            f"step {sequence}: the model turn at step {turn_sequence} asked for "
            f"{len(turn.tool_calls)} calls, but the journal records {len(outcomes)} "
            "outcomes before the next turn (a gap)",
        )


def _recorded_turn(sequence: int, result) -> Turn:
    """The turn an llm step recorded (``loop.llm_step_result``'s shape)."""
    try:
        content = result.get("content") or ""
        calls = [
            ToolCall(
                name=call["name"],
                arguments=call.get("arguments"),
                id=call.get("id", ""),
                problem=call.get("problem", ""),
            )
            for call in result.get("tool_calls") or []
        ]
    except (AttributeError, KeyError, TypeError):
        raise JournalUnreplayable(
            f"step {sequence}: the recorded model turn is not in the shape of one",
        ) from None
    if not isinstance(content, str) or not all(isinstance(call.name, str) for call in calls):
        raise JournalUnreplayable(
            f"step {sequence}: the recorded model turn is not in the shape of one",
        )
    return Turn(content=content, tool_calls=calls)


def _unavailable(tool_name, registered, disabled) -> str:
    """Why a tool can no longer be offered, or ""."""
    if tool_name not in registered:
        return "is no longer registered"
    if tool_name in disabled:
        return "an operator has disabled since"
    return ""


def _check_tool_available(sequence, tool_name, effect, registered, disabled) -> None:
    """A recorded outcome of a tool that is gone or switched off is not
    replayed: continuing that conversation would contradict the world as an
    operator has since made it."""
    why = _unavailable(tool_name, registered, disabled)
    if why:
        raise JournalUnreplayable(
            f"step {sequence} records the {effect} tool {tool_name!r}, which {why}",
        )


def _check_calls_to_go_live(last, turn_number, run_key, requested, registered, disabled) -> None:
    """A call of the last turn without a recorded outcome goes live. If its
    tool is a write the run was given and can no longer be offered, it may
    have run before the attempt stopped: telling the model it was never
    offered would contradict the world."""
    turn_sequence, turn, outcomes = last
    for index in range(len(outcomes), len(turn.tool_calls)):
        call = turn.tool_calls[index]
        if call.problem or call.name not in requested:
            continue
        why = _unavailable(call.name, registered, disabled)
        effect = effect_for(call.name)
        if why and effect.is_write:
            position = f"{turn_number}.{index}"
            key = idempotency_key_for(run_key, position, call.name, call.arguments)
            if _denied(run_key, turn_sequence, position, key):
                continue  # denied: it never ran, in any attempt (G14)
            arguments, key = _as_approved(run_key, turn_sequence, position, call.arguments, key)
            raise JournalUnreplayable(
                f"step {turn_sequence}: the model turn asked for the {effect} tool "
                f"{call.name!r}, whose outcome is not recorded and which {why}",
                write={
                    "effect": effect.value,
                    "tool": call.name,
                    "arguments": arguments,
                    "idempotency_key": key,
                },
            )


def _edited_as(run_id, turn_sequence: int, position: str, key: str) -> bool:
    """Whether a person edited the call at ``position`` of the turn into the
    call with ``key`` and it was approved (G24): its outcome is the edited
    call's, which ran in the model's call's place. Asked only when a key
    differs from the model's call's, so a journal without edits asks nothing."""
    return ApprovalRequest.objects.filter(
        run_id=run_id,
        turn_sequence=turn_sequence,
        position=position,
        idempotency_key=key,
        replaces__isnull=False,
        status=ApprovalStatus.APPROVED,
    ).exists()


def _as_approved(run_id, turn_sequence: int, position: str, arguments, key: str) -> tuple:
    """The arguments and key the call at ``position`` would run with: a
    person's approved edit's (G24), or the model's as asked."""
    edit = (
        ApprovalRequest.objects.filter(
            run_id=run_id,
            turn_sequence=turn_sequence,
            position=position,
            asked_key=key,
            replaces__isnull=False,
            status=ApprovalStatus.APPROVED,
        )
        .values_list("arguments", "idempotency_key")
        .first()
    )
    return edit if edit is not None else (arguments, key)


def _denied(run_id, turn_sequence: int, position: str, key: str) -> bool:
    """Whether an operator denied this call of the turn: a denied call is
    never executed by any attempt, so its outcome is known (G14)."""
    return ApprovalRequest.objects.filter(
        run_id=run_id,
        turn_sequence=turn_sequence,
        position=position,
        asked_key=key,
        status=ApprovalStatus.DENIED,
    ).exists()
