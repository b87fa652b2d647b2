"""What the agent loop needs from a model: the next turn, given the conversation."""

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Any
    #: The protocol's id for the call, echoed with its result.
    id: str = ""
    #: Set when the model's call is malformed (unparsable arguments): it is
    #: not executed, and this becomes the tool error fed back to the model.
    problem: str = ""


@dataclass(frozen=True)
class Turn:
    """The model's answer: final ``content``, or ``tool_calls`` to execute."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    #: What the llm step records about the call: model, finish reason,
    #: token usage, latency.
    meta: dict = field(default_factory=dict)


class ProviderError(Exception):
    """A provider call failed; ``failure_class`` says how (DESIGN.md §2)."""

    def __init__(self, message: str, *, failure_class: str, retry_after: float | None = None):
        super().__init__(message)
        self.failure_class = failure_class
        self.retry_after = retry_after


class Provider(Protocol):
    #: JSON Schema of the request's ``provider`` object for this kind.
    spec_schema: dict

    def next_turn(self, messages: list[dict], tool_specs: list[dict]) -> Turn: ...
