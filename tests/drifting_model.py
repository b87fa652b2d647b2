"""A model that is not deterministic, behind the fake chat-completions server.

It follows the plan written in its prompt (``plan_prompt``), one entry per
assistant turn of the conversation it is sent, as a model continues the
conversation it sees. But it words every answer differently: each answer is
a new *take*, numbered, and ``{take}`` in the plan's strings (a tool call's
arguments, the final answer) becomes that number; the calls' protocol ids
change with it. A repeated request for a turn therefore gets the same intent
with other arguments, and so another idempotency key: the way a sampled
model answers. A guarantee that holds only because the model repeats itself
fails against it.

Tests can make the request for a turn fail (``fail_turn``) or hold it until
released (``hold_turn``), and count the requests each turn received.
"""

import itertools
import json
import threading
import time
from collections import Counter, defaultdict

from tests.fake_openai import Reply, completion

PLAN_MARK = "\nPLAN: "


def plan_prompt(text: str, plan: list[dict]) -> str:
    """A prompt carrying ``plan``: entries ``{"calls": [{"name": ..., "arguments":
    {...}}, ...]}`` (one turn of tool calls) or ``{"answer": "..."}``, either
    with ``"delay_seconds"``: how long the model takes to answer that turn."""
    return f"{text}{PLAN_MARK}{json.dumps(plan)}"


def openai_request(text: str, plan: list[dict], tools, **extra) -> dict:
    """A run request for the ``openai`` provider, pointed at this model by its plan."""
    return {
        "prompt": plan_prompt(text, plan),
        "tools": list(tools),
        "provider": {"kind": "openai", "model": "drifting"},
        **extra,
    }


def _worded(value, take):
    if isinstance(value, str):
        return value.replace("{take}", str(take))
    if isinstance(value, dict):
        return {key: _worded(item, take) for key, item in value.items()}
    if isinstance(value, list):
        return [_worded(item, take) for item in value]
    return value


class DriftingModel:
    def __init__(self):
        self._takes = itertools.count(1)
        self._lock = threading.Lock()
        self._failures: dict[int, list[Reply]] = defaultdict(list)
        self._holds: set[int] = set()
        self._held_always: set[int] = set()
        #: Set when a held request arrives; the test sets ``release`` to answer it.
        self.held = threading.Event()
        self.release = threading.Event()
        #: Requests received, by the turn they asked for (0: the first).
        self.requests_by_turn: Counter = Counter()
        #: Every conversation it was sent, in order: what the model was told.
        self.conversations: list[list[dict]] = []

    def fail_turn(self, turn: int, *replies: Reply) -> None:
        """The next requests for ``turn`` get ``replies`` (errors), one each."""
        with self._lock:
            self._failures[turn].extend(replies)

    def hold_turn(self, turn: int, *, every: bool = False) -> None:
        """The next request for ``turn`` (``every`` one, until released)
        waits for ``release`` before it is answered."""
        with self._lock:
            (self._held_always if every else self._holds).add(turn)

    def __call__(self, body: dict) -> Reply:
        messages = body["messages"]
        turn = sum(1 for message in messages if message["role"] == "assistant")
        # The plan is in the user's prompt (a system message may come first).
        prompt = next(message for message in messages if message["role"] == "user")
        _, _, plan = prompt["content"].partition(PLAN_MARK)
        plan = json.loads(plan) if plan else []
        with self._lock:
            take = next(self._takes)
            self.requests_by_turn[turn] += 1
            self.conversations.append(messages)
            failure = self._failures[turn].pop(0) if self._failures[turn] else None
            hold = turn in self._holds or turn in self._held_always
            self._holds.discard(turn)
        if hold:
            self.held.set()
            self.release.wait(timeout=120)
        if failure is not None:
            return failure
        entry = plan[turn] if turn < len(plan) else {"answer": "nothing left to do (take {take})"}
        if entry.get("delay_seconds"):
            time.sleep(entry["delay_seconds"])
        if "answer" in entry:
            return Reply(body=completion(_worded(entry["answer"], take)))
        calls = [
            (f"call_{take}_{index}", call["name"], json.dumps(_worded(call["arguments"], take)))
            for index, call in enumerate(entry["calls"])
        ]
        return Reply(body=completion(f"on it (take {take})", tool_calls=calls))


def scripted_request(
    text: str,
    plan: list[dict],
    tools,
    *,
    before: dict | None = None,
    delays: dict | None = None,
    usage: dict | None = None,
) -> dict:
    """The same plan for the ``scripted`` provider, which words every answer
    the same way (``{take}`` is always "same"); ``before`` maps a turn index
    to a scripted turn played before it (a simulated failure), ``delays`` to
    the seconds that turn takes; ``usage``: the tokens every answer reports
    (as the fake server's do: ``FAKE_USAGE``), unless a plan entry names its
    own."""
    turns = []
    for index, entry in enumerate(plan):
        if before and index in before:
            turns.append(before[index])
        if "answer" in entry:
            turn = {"content": _worded(entry["answer"], "same")}
        else:
            calls = [
                {"name": call["name"], "arguments": _worded(call["arguments"], "same")}
                for call in entry["calls"]
            ]
            turn = {"tool_calls": calls}
        if "delay_seconds" in entry:
            turn["delay_seconds"] = entry["delay_seconds"]
        if delays and index in delays:
            turn["delay_seconds"] = delays[index]
        if usage:
            turn["usage"] = usage
        if "usage" in entry:  # this turn's own (``{}``: none reported)
            turn["usage"] = entry["usage"]
        turns.append(turn)
    return {
        "prompt": text,
        "tools": list(tools),
        "provider": {"kind": "scripted", "turns": turns},
    }


#: Plan entries the recovery tests share: a notification (a non-idempotent
#: write) and a search (a read), each worded anew by every take.
NOTIFY = {
    "name": "send_notification",
    "arguments": {"recipient": "team", "message": "v2 is out (take {take})"},
}
SEARCH = {"name": "search_notes", "arguments": {"query": "release (take {take})"}}

#: The providers every recovery guarantee is tried with (the ``model`` fixture).
MODELS = ["scripted", "drifting"]


#: What every answer of the fake chat-completions server reports (``tests.fake_openai``).
FAKE_USAGE = {"prompt_tokens": 11, "completion_tokens": 7}


def request_for(
    model,
    plan,
    tools,
    *,
    scripted_before=None,
    scripted_delays=None,
    scripted_usage=None,
    **extra,
):
    """The run request for ``plan`` on ``model`` ("scripted" or "drifting");
    ``scripted_before``/``scripted_delays``/``scripted_usage``:
    ``scripted_request``'s ``before``/``delays``/``usage``, for the scripted
    provider only."""
    if model == "drifting":
        return openai_request("ship it", plan, tools, **extra)
    request = scripted_request(
        "ship it",
        plan,
        tools,
        before=scripted_before,
        delays=scripted_delays,
        usage=scripted_usage,
    )
    return {**request, **extra}
