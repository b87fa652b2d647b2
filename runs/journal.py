"""A run's journal, read back for a re-executed attempt to replay (G12).

The journal is the run's llm and tool steps after ``journal_begins_after``,
in sequence order: one conversation, continued by every attempt where the
last one stopped. ``read_journal`` reads it in one query and checks that it
can be replayed as it stands. It refuses (``JournalUnreplayable``, naming
the step) rather than improvise: a recorded outcome of a tool that is gone
or switched off, a gap, a turn that is not what a model turn looks like.
What the attempt does then is the runtime's decision.
"""

from collections.abc import Collection
from dataclasses import dataclass

from django.db.models import Count, Max, Q, Subquery

from runs.loop import RecordedOutcome, RecordedTurn
from runs.models import AgentRun, RunStep
from runs.providers.base import ToolCall, Turn
from runs.vocabulary import StepKind
from tools.effects import ToolEffect

_JOURNAL_KINDS = (StepKind.LLM, StepKind.TOOL)
_WRITES = (ToolEffect.IDEMPOTENT_WRITE, ToolEffect.NON_IDEMPOTENT_WRITE)


class JournalUnreplayable(Exception):
    """The journal cannot be replayed without contradicting it; the message
    names the step (or the stored request) and why."""

    def __init__(self, message: str, *, sequence: int | None = None):
        super().__init__(message)
        self.sequence = sequence


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

    def __bool__(self) -> bool:
        return bool(self.turns)

    def resume_step(self) -> dict:
        """The step that records what a resumed attempt replayed."""
        return {
            "kind": StepKind.RESUME,
            "result": {
                "resumed_after": self.last_sequence,
                "model_turns": len(self.turns),
                "tool_results": self.tool_results,
                "writes": self.writes,
                "tokens_saved": self.tokens,
                "summary": self.describe(),
            },
        }

    def describe(self) -> str:
        return (
            f"resumed after step {self.last_sequence}: {len(self.turns)} model turns and "
            f"{self.tool_results} tool results replayed ({self.writes} writes not repeated)"
        )


def journal_steps(run_id):
    """The run's journal steps, in order, as a queryset (served by the steps'
    (run, sequence) index; the run's ``journal_begins_after`` is read by the
    same statement)."""
    begins_after = AgentRun.objects.filter(pk=run_id).values("journal_begins_after")
    return RunStep.objects.filter(
        run_id=run_id, kind__in=_JOURNAL_KINDS, sequence__gt=Subquery(begins_after)
    ).order_by("sequence")


def read_journal(
    run_id,
    *,
    registered: Collection[str],
    disabled: Collection[str],
    max_iterations: int,
) -> Journal:
    """The run's journal, ready to replay, in one query. Raises
    ``JournalUnreplayable`` when it cannot be replayed as it stands."""
    rows = journal_steps(run_id).values_list(
        "sequence", "kind", "tool_name", "effect", "result", "error"
    )
    turns: list[tuple[int, Turn, list[RecordedOutcome]]] = []
    tool_results = writes = tokens = 0
    last_sequence = 0
    for sequence, kind, tool_name, effect, result, error in rows:
        last_sequence = sequence
        if kind == StepKind.LLM:
            _check_turn_complete(turns, sequence)
            turn = _recorded_turn(sequence, result)
            turns.append((sequence, turn, []))
            tokens += _tokens_of(result)
            continue
        if not turns:
            raise JournalUnreplayable(
                f"step {sequence}: a tool result before any model turn", sequence=sequence
            )
        turn_sequence, turn, outcomes = turns[-1]
        if len(outcomes) >= len(turn.tool_calls):
            raise JournalUnreplayable(
                f"step {sequence}: more tool results than the {len(turn.tool_calls)} calls "
                f"the model turn at step {turn_sequence} asked for",
                sequence=sequence,
            )
        asked = turn.tool_calls[len(outcomes)].name
        if tool_name != asked:
            raise JournalUnreplayable(
                f"step {sequence} records {tool_name!r} where the model turn at step "
                f"{turn_sequence} asked for {asked!r}",
                sequence=sequence,
            )
        if effect:  # the tool was planned: its code ran (or an old attempt replayed it)
            _check_tool_available(sequence, tool_name, effect, registered, disabled)
            writes += effect in _WRITES
        outcomes.append(RecordedOutcome(sequence, result, error))
        tool_results += 1
    if len(turns) > max_iterations:
        raise JournalUnreplayable(
            f"step {turns[max_iterations][0]}: the journal holds {len(turns)} model turns, "
            f"more than the run's max_iterations of {max_iterations}",
            sequence=turns[max_iterations][0],
        )
    return Journal(
        turns=tuple(
            RecordedTurn(sequence, turn, tuple(outcomes)) for sequence, turn, outcomes in turns
        ),
        last_sequence=last_sequence,
        tool_results=tool_results,
        writes=writes,
        tokens=tokens,
    )


def _tokens_of(result) -> int:
    usage = result.get("usage") if isinstance(result, dict) else None
    if not isinstance(usage, dict):
        return 0
    return int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)


def _check_turn_complete(turns: list, sequence: int) -> None:
    """A new model turn follows only a turn whose every call has its outcome."""
    if not turns:
        return
    turn_sequence, turn, outcomes = turns[-1]
    if not turn.tool_calls:
        raise JournalUnreplayable(
            f"step {sequence}: a model turn after the final answer at step {turn_sequence}",
            sequence=sequence,
        )
    if len(outcomes) < len(turn.tool_calls):
        raise JournalUnreplayable(
            f"step {sequence}: the model turn at step {turn_sequence} asked for "
            f"{len(turn.tool_calls)} calls, but the journal records {len(outcomes)} "
            "outcomes before the next turn (a gap)",
            sequence=sequence,
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
            sequence=sequence,
        ) from None
    if not isinstance(content, str) or not all(isinstance(call.name, str) for call in calls):
        raise JournalUnreplayable(
            f"step {sequence}: the recorded model turn is not in the shape of one",
            sequence=sequence,
        )
    return Turn(content=content, tool_calls=calls)


def _check_tool_available(sequence, tool_name, effect, registered, disabled) -> None:
    """A recorded outcome of a tool that is gone or switched off is not
    replayed: continuing that conversation would contradict the world as an
    operator has since made it."""
    if tool_name not in registered:
        raise JournalUnreplayable(
            f"step {sequence} records the {effect} tool {tool_name!r}, which is no longer "
            "registered",
            sequence=sequence,
        )
    if tool_name in disabled:
        raise JournalUnreplayable(
            f"step {sequence} records the {effect} tool {tool_name!r}, which an operator "
            "has disabled since",
            sequence=sequence,
        )


@dataclass(frozen=True)
class JournalSummary:
    """What a resume of the run would replay, without reading the steps' bodies."""

    last_sequence: int
    model_turns: int
    tool_results: int
    writes: int
    #: Tools whose recorded outcomes would be replayed.
    executed_tools: frozenset[str]


def summarize_journal(run: AgentRun) -> JournalSummary:
    """Two aggregate queries over the run's journal steps."""
    steps = RunStep.objects.filter(
        run_id=run.pk, kind__in=_JOURNAL_KINDS, sequence__gt=run.journal_begins_after
    )
    totals = steps.aggregate(
        last=Max("sequence"),
        turns=Count("pk", filter=Q(kind=StepKind.LLM)),
        results=Count("pk", filter=Q(kind=StepKind.TOOL)),
        writes=Count("pk", filter=Q(kind=StepKind.TOOL, effect__in=_WRITES)),
    )
    executed = steps.filter(kind=StepKind.TOOL).exclude(effect="")
    names = frozenset(executed.values_list("tool_name", flat=True).distinct())
    return JournalSummary(
        last_sequence=totals["last"] or 0,
        model_turns=totals["turns"],
        tool_results=totals["results"],
        writes=totals["writes"],
        executed_tools=names,
    )
