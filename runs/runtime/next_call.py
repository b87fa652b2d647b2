"""The model call an attempt would make first, measured without making it.

A requeue or restart verdict must tell whether the run's own limits (G17)
have room for that call's largest cost, as the attempt will check before
it. The conversation it would send is rebuilt by the agent loop itself,
replaying the journal as a resumed attempt does, with a provider that
stops at the first call: the verdict sizes the very call, not a copy of
how the loop builds one.
"""

from runs.runtime.loop import RecordedOutcome, RecordedTurn, run_agent_loop
from runs.runtime.run_request import RunRequest
from spend.call_size import CallSize
from spend.prices import Price
from tools.registry import offered_tools


class _Asked(Exception):
    def __init__(self, messages: list[dict], tool_specs: list[dict]):
        super().__init__("the first model call")
        self.messages, self.tool_specs = messages, tool_specs


class _StopsAtTheCall:
    def next_turn(self, messages, tool_specs):
        raise _Asked(messages, tool_specs)


#: The shortest outcome a call can tell the model: a result is JSON (one
#: character at least), an error or a denial some words.
_SHORTEST_OUTCOME = RecordedOutcome(sequence=0, result=0, error="")


def first_call_size(request: RunRequest, turns, disabled, price: Price | None) -> CallSize | None:
    """The largest cost of the first model call of an attempt that replays
    ``turns`` (a journal's; none for a restart) offering ``request``'s tools
    less ``disabled``; None if it would make none (the journal ends with
    the final answer, or its calls are the last the run may take). Calls
    of the last turn without an outcome go live before that call, which
    sends their outcomes: each is taken as the shortest (``going_live``),
    so the size is the least the attempt's own check can find."""
    try:
        run_agent_loop(
            prompt=request.prompt,
            instructions=request.instructions,
            provider=_StopsAtTheCall(),
            tools=offered_tools(request.tools, disabled),
            max_iterations=request.max_iterations,
            # Never called: every call of a turn replayed has an outcome.
            observer=None,
            journal=_with_every_outcome(turns),
        )
    except _Asked as asked:
        return CallSize.of(
            asked.messages, asked.tool_specs, request.provider.get("max_tokens"), price
        )
    return None


def going_live(turns) -> int:
    """How many calls of ``turns``' last turn have no outcome yet."""
    if not turns:
        return 0
    return len(turns[-1].turn.tool_calls) - len(turns[-1].outcomes)


def _with_every_outcome(turns):
    missing = going_live(turns)
    if not missing:
        return turns
    last = turns[-1]
    outcomes = (*last.outcomes, *[_SHORTEST_OUTCOME] * missing)
    return (*turns[:-1], RecordedTurn(last.sequence, last.turn, outcomes))
