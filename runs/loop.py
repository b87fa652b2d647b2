"""The agent loop: provider ↔ tools until a final answer or the iteration cap.

It knows nothing of persistence. The runtime watches it through an observer
with two hooks — ``before_tool`` (may refuse by raising) and ``after_step`` —
and owns the lease, the fence, the audit and the settle. ``after_step`` is
told which call comes next, so the observer can renew the lease for it (and
stamp its fence) in the same write that records the step.
"""

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from runs.providers import Provider
from runs.vocabulary import StepKind, TerminationReason
from tools.contract import Tool, ToolContext, ToolError
from tools.deadline import time_limit
from tools.effects import ToolEffect
from tools.validation import argument_errors

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlannedCall:
    """A tool call about to execute; ``position`` identifies it within the run."""

    tool: Tool
    arguments: Any
    position: str


@dataclass(frozen=True)
class RecordedOutcome:
    """The outcome an earlier attempt recorded for this very call (same
    idempotency key); the observer returns it instead of a context when the
    call must not execute again."""

    sequence: int
    idempotency_key: str
    result: Any
    error: str


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
    replay_of: int | None = None

    @property
    def is_executed_write(self) -> bool:
        return self.executed and ToolEffect(self.effect).is_write


@dataclass
class LoopOutcome:
    reason: str
    output: str = ""
    messages: list[dict] = field(default_factory=list)


class LoopObserver(Protocol):
    def before_tool(self, call: PlannedCall) -> ToolContext | RecordedOutcome: ...

    def after_step(self, event: StepEvent, next_call: PlannedCall | None = None) -> None: ...

    def finish(self, event: StepEvent, output: str) -> None: ...


def tool_spec(tool: Tool) -> dict:
    return {"name": tool.name, "description": tool.description, "parameters": tool.parameters}


def run_agent_loop(
    *,
    prompt: str,
    provider: Provider,
    tools: Mapping[str, Tool],
    max_iterations: int,
    observer: LoopObserver,
) -> LoopOutcome:
    """Drive the conversation. Exceptions from the provider or the observer
    propagate: the runtime decides what they mean for the run."""
    messages: list[dict] = [{"role": "user", "content": prompt}]
    specs = [tool_spec(tool) for tool in tools.values()]
    for iteration in range(1, max_iterations + 1):
        turn = provider.next_turn(messages, specs)
        planned = [
            call.problem or _plan_call(call.name, call.arguments, f"{iteration}.{index}", tools)
            for index, call in enumerate(turn.tool_calls)
        ]
        calls = [{"name": call.name, "arguments": call.arguments} for call in turn.tool_calls]
        event = StepEvent(
            kind=StepKind.LLM,
            result={"content": turn.content, "tool_calls": calls, **turn.meta},
        )
        if not turn.tool_calls:
            # The final answer: its step is recorded with the run's settle.
            observer.finish(event, turn.content)
            messages.append({"role": "assistant", "content": turn.content})
            return LoopOutcome(TerminationReason.COMPLETED, turn.content, messages)
        observer.after_step(event, next_call=_runnable(planned, 0))
        # The conversation is kept in the chat-completions shape, which
        # OpenAI-compatible providers take as is.
        call_ids = [
            call.id or f"call_{iteration}_{index}" for index, call in enumerate(turn.tool_calls)
        ]
        assistant = {
            "role": "assistant",
            "content": turn.content,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                }
                for call_id, call in zip(call_ids, turn.tool_calls, strict=True)
            ],
        }
        messages.append(assistant)
        for index, (call_id, call, plan) in enumerate(
            zip(call_ids, turn.tool_calls, planned, strict=True)
        ):
            if isinstance(plan, PlannedCall):
                event = _execute_call(plan, observer)
            else:
                # Never executed: the model's call was malformed, named a tool
                # this run was not given, or its arguments were invalid.
                event = StepEvent(
                    kind=StepKind.TOOL,
                    tool_name=call.name,
                    arguments=None if call.problem else call.arguments,
                    error=plan,
                )
            observer.after_step(event, next_call=_runnable(planned, index + 1))
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": event.error or json.dumps(event.result, sort_keys=True),
                }
            )
    return LoopOutcome(TerminationReason.MAX_ITERATIONS, "", messages)


def _plan_call(
    name: str, arguments: Any, position: str, tools: Mapping[str, Tool]
) -> PlannedCall | str:
    """The call to execute, or why it must not execute."""
    tool = tools.get(name)
    if tool is None:
        return f"tool {name!r} is not offered to this run; offered: {sorted(tools)}"
    problems = argument_errors(tool.parameters, arguments)
    if problems:
        return "invalid arguments: " + "; ".join(problems)
    return PlannedCall(tool=tool, arguments=arguments, position=position)


def _runnable(planned: list, index: int) -> PlannedCall | None:
    if index < len(planned) and isinstance(planned[index], PlannedCall):
        return planned[index]
    return None


def _execute_call(call: PlannedCall, observer: LoopObserver) -> StepEvent:
    tool, name, arguments = call.tool, call.tool.name, call.arguments
    context = observer.before_tool(call)
    if isinstance(context, RecordedOutcome):
        return StepEvent(
            kind=StepKind.TOOL,
            tool_name=name,
            effect=tool.effect.value,
            arguments=arguments,
            result=context.result,
            error=context.error,
            idempotency_key=context.idempotency_key,
            replay_of=context.sequence,
        )
    event = StepEvent(
        kind=StepKind.TOOL,
        tool_name=name,
        effect=tool.effect.value,
        arguments=arguments,
        idempotency_key=context.idempotency_key,
        executed=True,
    )
    try:
        with time_limit(context.timeout_seconds, name):
            result = tool.run(arguments, context)
    except ToolError as error:
        event.error = str(error) or type(error).__name__
        return event
    except Exception as error:
        logger.exception("tool %s raised", name)
        event.error = f"tool {name!r} failed: {type(error).__name__}: {error}"
        return event
    try:
        json.dumps(result)
    except (TypeError, ValueError) as error:
        event.error = f"tool {name!r} returned a result that is not JSON: {error}"
    else:
        event.result = result
    return event
