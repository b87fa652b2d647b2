"""A provider that plays the turns written in the request.

The embedded default and the test double: no network. A turn is a final
answer ``{"content": ...}``, tool calls ``{"tool_calls": [...]}`` or a
simulated failure ``{"error": "<failure class>"}``; with ``"attempts": N``
the failure happens only on the run's first N attempts and is skipped after.
Any turn may add ``"delay_seconds"``, and an answer ``"usage"`` (the
tokens it reports, as a model's provider would: ``prompt_tokens``,
``completion_tokens``, ``cached_tokens``); without it a turn reports none.
The script may set ``max_tokens``, the completion bound a model's request
sets (what a run's limits must have room for); it plays its turns whatever
they report.

It records the system message it was sent (an agent's instructions, G18)
in each turn's meta, as ``instructions`` (its first ``INSTRUCTIONS_SHOWN``
characters), so a test or an operator can see what the model was told.

Like a model, it answers the conversation it is given: the turn it plays is
the one after the assistant turns already in it, so an attempt that resumed
from the journal (G12) goes on with the script where the journal ends.
"""

import time

from runs.models.vocabulary import FailureClass
from runs.providers.base import ProviderError, ToolCall, Turn

#: Of the system message, what a scripted turn's meta records.
INSTRUCTIONS_SHOWN = 200

_DELAY = {"type": "number", "minimum": 0, "maximum": 3600}
_COUNT = {"type": "integer", "minimum": 0, "maximum": 10**8}
_USAGE = {
    "type": "object",
    "properties": {"prompt_tokens": _COUNT, "completion_tokens": _COUNT, "cached_tokens": _COUNT},
    "additionalProperties": False,
}
_TURN_SCHEMA = {
    "oneOf": [
        {
            "type": "object",
            "properties": {
                "content": {"type": "string"},
                "delay_seconds": _DELAY,
                "usage": _USAGE,
            },
            "required": ["content"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "tool_calls": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}, "arguments": {}},
                        "required": ["name"],
                        "additionalProperties": False,
                    },
                },
                "delay_seconds": _DELAY,
                "usage": _USAGE,
            },
            "required": ["tool_calls"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "error": {"enum": [value for value in FailureClass.values]},
                "attempts": {"type": "integer", "minimum": 1},
                "retry_after": {"type": "number", "minimum": 0},
                "delay_seconds": _DELAY,
            },
            "required": ["error"],
            "additionalProperties": False,
        },
    ]
}


class ScriptedProvider:
    kind = "scripted"
    spec_schema = {
        "type": "object",
        "properties": {
            "kind": {"const": "scripted"},
            "turns": {"type": "array", "minItems": 1, "items": _TURN_SCHEMA},
            "max_tokens": {"type": "integer", "minimum": 1, "maximum": 10**9},
        },
        "required": ["kind", "turns"],
        "additionalProperties": False,
    }

    @staticmethod
    def configuration_problem() -> str | None:
        return None

    def __init__(self, turns: list[dict], *, attempt: int, max_tokens: int | None = None):
        #: As a model's: the completion's bound, which a run's limits and its
        #: submitter's budget must have room for before each call (G17,
        #: G21). A script's ``usage`` may report more, as a provider may.
        self.options = {"max_tokens": max_tokens} if max_tokens else {}
        # Error turns limited to earlier attempts are skipped on this one.
        self._turns = [
            turn
            for turn in turns
            if not ("error" in turn and turn.get("attempts", attempt) < attempt)
        ]

    @classmethod
    def from_spec(cls, spec: dict, *, attempt: int) -> "ScriptedProvider":
        return cls(spec["turns"], attempt=attempt, max_tokens=spec.get("max_tokens"))

    def next_turn(self, messages: list[dict], tool_specs: list[dict]) -> Turn:
        played = sum(1 for message in messages if message["role"] == "assistant")
        if played >= len(self._turns):
            raise ProviderError(
                f"the script has no turn {played + 1}",
                failure_class=FailureClass.CONFIGURATION,
            )
        turn = self._turns[played]
        if turn.get("delay_seconds"):
            time.sleep(turn["delay_seconds"])
        if "error" in turn:
            raise ProviderError(
                f"scripted {turn['error']} failure",
                failure_class=turn["error"],
                retry_after=turn.get("retry_after"),
            )
        meta = {"usage": dict(turn["usage"])} if "usage" in turn else {}
        if messages and messages[0]["role"] == "system":
            meta["instructions"] = messages[0]["content"][:INSTRUCTIONS_SHOWN]
        if "tool_calls" in turn:
            return Turn(
                tool_calls=[
                    ToolCall(name=call["name"], arguments=call.get("arguments", {}))
                    for call in turn["tool_calls"]
                ],
                meta=meta,
            )
        return Turn(content=turn["content"], meta=meta)
