"""The agent loop: provider ↔ tools until a final answer or the iteration cap.

It knows nothing of persistence. The runtime watches it through an observer
with hooks — ``before_tool`` (may refuse by raising) and ``after_step`` —
and owns the lease, the fence, the audit and the settle. ``after_step`` is
told which call comes next, so the observer can renew the lease for it (and
stamp its fence) in the same write that records the step. Before any call
of a turn runs, ``gate`` is shown the turn's calls: it may stop the loop
while calls wait for an operator's approval (G14), and it says which calls
an operator denied — those never run, and the model is told why.

A re-executed attempt hands the loop the turns its journal recorded (G12):
the loop replays them — their tool calls' recorded outcomes included —
without asking the provider or running a tool, and without telling the
observer (they are recorded already), then goes live where the journal
ends: the calls of the last recorded turn that have no outcome yet, then
the next turn.
"""

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from runs.models.edit_notice import told_of_edit
from runs.models.vocabulary import StepKind, TerminationReason
from runs.providers import Provider
from runs.providers.base import ToolCall, Turn
from runs.runtime import spans
from runs.runtime.errors import WriteOutcomeUnknown
from tools.canonical import NAME_LIMIT, as_journaled, storable_text
from tools.contract import WAITING_RESULTS, Tool, ToolContext, ToolError, ToolOutcomeUnknown
from tools.deadline import ToolTimeout, call_within
from tools.effects import ToolEffect
from tools.validation import argument_errors

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlannedCall:
    """A tool call about to execute; ``position`` identifies it within the run."""

    tool: Tool
    arguments: Any
    position: str
    #: A person edited the model's call (G24): who. It runs with
    #: ``arguments`` (theirs), and the model is told so with its result.
    edited_by: str = ""


@dataclass(frozen=True)
class RecordedOutcome:
    """What the journal recorded for one tool call: its result or its error."""

    sequence: int
    result: Any
    error: str


@dataclass(frozen=True)
class RecordedTurn:
    """A model turn the journal recorded, with the outcomes recorded for its
    calls, in order: as many as its calls, or fewer for the journal's last turn."""

    sequence: int
    turn: Turn
    outcomes: tuple[RecordedOutcome, ...] = ()


@dataclass
class StepEvent:
    """Something that happened, for the runtime to record."""

    kind: str
    tool_name: str = ""
    effect: str = ""
    arguments: Any = None
    result: Any = None
    error: str = ""
    idempotency_key: str = ""
    #: True when a tool's code ran: its effect may have reached the world.
    executed: bool = False

    @property
    def is_executed_write(self) -> bool:
        return self.executed and ToolEffect(self.effect).is_write


@dataclass
class LoopOutcome:
    reason: str
    output: str = ""
    messages: list[dict] = field(default_factory=list)


class LoopObserver(Protocol):
    def before_tool(self, call: PlannedCall) -> ToolContext: ...

    def after_step(self, event: StepEvent, next_call: PlannedCall | None = None) -> None: ...

    def finish(self, event: StepEvent, output: str) -> None: ...

    def write_returned_late(self, event: StepEvent, result: Any, error: str) -> None:
        """A write the run stopped counting on at its limit finished after
        all (G15): ``event`` is its call, ``result`` or ``error`` what came."""

    def gate(
        self,
        calls: Sequence[PlannedCall],
        *,
        turn_sequence: int | None,
        turn_event: StepEvent | None,
    ) -> Mapping[str, "str | PlannedCall"]: ...

    def wait_for_input(self, call: PlannedCall, event: StepEvent, waiting: Any) -> None:
        """``call`` returned ``waiting`` (a ``Question`` or ``Deferred``):
        park the run until it is answered. Always raises."""


def tool_spec(tool: Tool) -> dict:
    return {"name": tool.name, "description": tool.description, "parameters": tool.parameters}


def llm_step_result(turn: Turn) -> dict:
    """What an llm step records of a turn: everything replaying it needs
    (content, each call's name, arguments, protocol id and problem) and the
    provider's meta (model, finish reason, usage, latency)."""
    calls = []
    for call in turn.tool_calls:
        recorded = {"name": call.name, "arguments": call.arguments}
        if call.id:
            recorded["id"] = call.id
        if call.problem:
            recorded["problem"] = call.problem
        calls.append(recorded)
    return {"content": turn.content, "tool_calls": calls, **turn.meta}


def run_agent_loop(
    *,
    prompt: str,
    instructions: str = "",
    provider: Provider,
    tools: Mapping[str, Tool],
    max_iterations: int,
    observer: LoopObserver,
    journal: Sequence[RecordedTurn] = (),
) -> LoopOutcome:
    """Drive the conversation, replaying ``journal`` first. Exceptions from
    the provider or the observer propagate: the runtime decides what they
    mean for the run. A replayed final answer ends the loop ``completed``
    without a call to ``observer.finish`` (it is recorded already).
    ``instructions``, when given, are the system message, sent first: they
    come from the stored request, so a replay sends the same (G12, G18)."""
    messages: list[dict] = [{"role": "user", "content": prompt}]
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    specs = [tool_spec(tool) for tool in tools.values()]
    for iteration in range(1, max_iterations + 1):
        recorded = journal[iteration - 1] if iteration <= len(journal) else None
        turn = recorded.turn if recorded else _as_journaled(provider.next_turn(messages, specs))
        replayed = recorded.outcomes if recorded else ()
        if not turn.tool_calls:
            if recorded is None:
                # The final answer: its step is recorded with the run's settle.
                event = StepEvent(kind=StepKind.LLM, result=llm_step_result(turn))
                observer.finish(event, turn.content)
            messages.append({"role": "assistant", "content": turn.content})
            return LoopOutcome(TerminationReason.COMPLETED, turn.content, messages)
        # Only the calls that go live are planned; replayed ones ran already.
        planned = [
            None if index < len(replayed) else _plan(call, f"{iteration}.{index}", tools)
            for index, call in enumerate(turn.tool_calls)
        ]
        event = None if recorded else StepEvent(kind=StepKind.LLM, result=llm_step_result(turn))
        live = [plan for plan in planned if isinstance(plan, PlannedCall)]
        if live:
            # Before anything of the turn runs: the gate raises if a call
            # waits for approval (having recorded the turn), and names the
            # calls an operator denied, which are answered with the denial,
            # and those a person edited, which run as edited.
            denied = observer.gate(
                live, turn_sequence=recorded.sequence if recorded else None, turn_event=event
            )
            planned = [
                denied.get(plan.position, plan) if isinstance(plan, PlannedCall) else plan
                for plan in planned
            ]
        if event is not None:
            observer.after_step(event, next_call=_runnable(planned, 0))
        # The conversation is kept in the chat-completions shape, which
        # OpenAI-compatible providers take as is.
        call_ids = [
            call.id or f"call_{iteration}_{index}" for index, call in enumerate(turn.tool_calls)
        ]
        messages.append(_assistant_message(turn, call_ids))
        for index, (call_id, call, plan) in enumerate(
            zip(call_ids, turn.tool_calls, planned, strict=True)
        ):
            if index < len(replayed):
                outcome = replayed[index]
                messages.append(_tool_message(call_id, outcome.result, outcome.error))
                continue
            if isinstance(plan, PlannedCall):
                event = _execute_call(plan, observer, call_id)
            else:
                # Never executed: the model's call was malformed, named a tool
                # this run was not given, its arguments were invalid, or an
                # operator denied it.
                event = StepEvent(
                    kind=StepKind.TOOL,
                    tool_name=call.name,
                    arguments=None if call.problem else call.arguments,
                    error=plan,
                )
            observer.after_step(event, next_call=_runnable(planned, index + 1))
            messages.append(_tool_message(call_id, event.result, event.error))
    return LoopOutcome(TerminationReason.MAX_ITERATIONS, "", messages)


def _as_journaled(turn: Turn) -> Turn:
    """The live turn as the journal will hold it (``tools.canonical``): the
    attempt goes on with what a resumed one would replay."""
    return Turn(
        content=storable_text(turn.content or ""),
        tool_calls=[
            ToolCall(
                name=storable_text(call.name or "")[:NAME_LIMIT],
                arguments=as_journaled(call.arguments),
                id=storable_text(call.id or ""),
                problem=storable_text(call.problem or ""),
            )
            for call in turn.tool_calls
        ],
        meta=as_journaled(turn.meta),
    )


def _assistant_message(turn: Turn, call_ids: list[str]) -> dict:
    return {
        "role": "assistant",
        "content": turn.content,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                # Sorted, as the journal returns them: a resumed attempt
                # tells the model the very turn the first one did.
                "function": {
                    "name": call.name,
                    "arguments": json.dumps(call.arguments, sort_keys=True),
                },
            }
            for call_id, call in zip(call_ids, turn.tool_calls, strict=True)
        ],
    }


def _tool_message(call_id: str, result: Any, error: str) -> dict:
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "content": error or json.dumps(result, sort_keys=True),
    }


def _plan(call: ToolCall, position: str, tools: Mapping[str, Tool]) -> PlannedCall | str:
    """The call to execute, or why it must not execute."""
    if call.problem:
        return call.problem
    tool = tools.get(call.name)
    if tool is None:
        return f"tool {call.name!r} is not offered to this run; offered: {sorted(tools)}"
    problems = argument_errors(tool.parameters, call.arguments)
    if problems:
        return "invalid arguments: " + "; ".join(problems)
    return PlannedCall(tool=tool, arguments=call.arguments, position=position)


def _runnable(planned: list, index: int) -> PlannedCall | None:
    if index < len(planned) and isinstance(planned[index], PlannedCall):
        return planned[index]
    return None


def _outcome_unknown(tool: Tool, context: ToolContext, error: Exception) -> WriteOutcomeUnknown:
    return WriteOutcomeUnknown(
        f"the {tool.effect} tool {tool.name!r} cannot tell whether its write took effect "
        f"(idempotency key {context.idempotency_key}): {type(error).__name__}: {error}",
        effect=tool.effect.value,
    )


def _execute_call(call: PlannedCall, observer: LoopObserver, call_id: str) -> StepEvent:
    tool, name, arguments = call.tool, call.tool.name, call.arguments
    context = observer.before_tool(call)
    event = StepEvent(
        kind=StepKind.TOOL,
        tool_name=name,
        effect=tool.effect.value,
        arguments=arguments,
        idempotency_key=context.idempotency_key,
        executed=True,
    )

    def late(late_result, late_error) -> None:
        error = f"{type(late_error).__name__}: {late_error}" if late_error else ""
        observer.write_returned_late(event, late_result, storable_text(error))

    try:
        with spans.tool_call(call, context, call_id):
            result = call_within(
                context.timeout_seconds,
                name,
                lambda: tool.run(arguments, context),
                on_late=late if tool.effect.is_write else None,
            )
    except ToolTimeout as error:
        if tool.effect.is_write:
            # Stopped mid-call: the write may have gone out.
            raise _outcome_unknown(tool, context, error) from error
        event.error = storable_text(str(error))
        return event
    except ToolError as error:
        event.error = storable_text(str(error) or type(error).__name__)
        return event
    except ToolOutcomeUnknown as error:
        if tool.effect.is_write:
            raise _outcome_unknown(tool, context, error) from error
        event.error = storable_text(f"tool {name!r}: outcome unknown: {error}")
        return event
    except Exception as error:
        logger.exception("tool %s raised", name)
        if tool.effect.is_write:
            # Not reported as a ToolError: nothing says the write did not land.
            raise _outcome_unknown(tool, context, error) from error
        event.error = storable_text(f"tool {name!r} failed: {type(error).__name__}: {error}")
        return event
    except (SystemExit, GeneratorExit) as error:
        # A write tool that exits the process (or a generator's close inside
        # it) must not leave its run running with the write unaccounted for.
        if tool.effect.is_write:
            raise _outcome_unknown(tool, context, error) from error
        raise
    if isinstance(result, WAITING_RESULTS):
        # A question for a person, or a call handed to another system: the
        # run waits, and the answer becomes this call's outcome (G24).
        observer.wait_for_input(call, event, result)
    # What the model is told and what the journal records, alike.
    result = as_journaled(result)
    try:
        json.dumps(result)
    except (TypeError, ValueError) as error:
        event.error = storable_text(f"tool {name!r} returned a result that is not JSON: {error}")
    else:
        event.result = result
    return _told_of_edit(call, event)


def _told_of_edit(call: PlannedCall, event: StepEvent) -> StepEvent:
    """The model is told that a person edited its call, and what it ran
    with; the step records what the model was told (G24)."""
    if call.edited_by:
        event.result, event.error = told_of_edit(
            call.edited_by, call.arguments, event.result, event.error
        )
    return event
