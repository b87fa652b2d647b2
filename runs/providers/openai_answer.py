"""A chat-completions answer read into a ``Turn``, from its JSON as sent.

The SDK hands the body over as parsed JSON (``cast_to=object``): building
its typed ``ChatCompletion`` cost more CPU than the turn's own statements,
and checked nothing (``construct``). What the provider uses is read here,
and a body that is not a chat completion — HTML from a proxy, ``{}``, a
message that is not an object — fails the call as ``server_error``, naming
what is wrong: the server broke the protocol, so the call is retried with
backoff and counts towards its circuit (G8), never mistaken for an answer.
"""

import json

from runs.models.vocabulary import FailureClass
from runs.providers.base import ProviderError, ToolCall, Turn


class MalformedAnswer(ProviderError):
    """A 200 whose body is not a chat completion."""

    def __init__(self, problem: str):
        super().__init__(
            f"the provider's answer is not a chat completion: {problem}",
            failure_class=FailureClass.SERVER_ERROR,
        )


def turn_of(data, *, latency_ms: int) -> Turn:
    """The turn that ``data`` (the answer's parsed JSON; a string when it was
    not sent as JSON) holds; raises ``MalformedAnswer`` when it holds none."""
    if isinstance(data, str):
        # A server that labels its JSON text/plain: the SDK's typed parse
        # read it as JSON too.
        try:
            data = json.loads(data)
        except (ValueError, RecursionError):
            raise MalformedAnswer(f"not JSON ({_excerpt(data)})") from None
    answer = _object(data, "the body")
    choices = answer.get("choices")
    if not isinstance(choices, list):
        raise MalformedAnswer(f"'choices' is {_kind(choices)}, not a list")
    if not choices:
        # No answer to read: a trial answered so must not leave its circuit
        # half-open (an ``unknown`` neither closes nor reopens it).
        raise MalformedAnswer("'choices' is empty")
    choice = _object(choices[0], "choices[0]")
    message = _object(choice.get("message"), "choices[0].message")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise MalformedAnswer(f"choices[0].message.content is {_kind(content)}, not a string")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise MalformedAnswer(f"choices[0].message.tool_calls is {_kind(calls)}, not a list")
    meta = {
        "model": answer.get("model"),
        "finish_reason": choice.get("finish_reason"),
        "usage": _usage(answer.get("usage")),
        "latency_ms": latency_ms,
    }
    return Turn(
        content=content or "",
        tool_calls=[
            _tool_call(call, f"choices[0].message.tool_calls[{number}]")
            for number, call in enumerate(calls)
        ],
        meta=meta,
    )


def _usage(usage) -> dict | None:
    """The turn's tokens as the provider counted them; ``cached_tokens`` (of
    the prompt's, served from the provider's cache and priced apart, G17)
    only when the provider says. None when it reports none (some servers
    and proxies omit it): the turn's tokens and cost are unknown, never 0.
    A count missing or not a whole number is passed on as it is, and
    recording the turn makes it unknown too (``transitions.steps``)."""
    if not isinstance(usage, dict):
        return None
    recorded = {
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
    }
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached:
        recorded["cached_tokens"] = cached
    return recorded


def _tool_call(call, where: str) -> ToolCall:
    call = _object(call, where)
    function = _object(call.get("function"), f"{where}.function")
    # A null id or name is taken as it comes: the loop gives the call an id
    # of its own, and refuses a nameless one as not offered (the model is told).
    name, call_id = function.get("name"), call.get("id")
    for field, value in ((f"{where}.function.name", name), (f"{where}.id", call_id)):
        if value is not None and not isinstance(value, str):
            raise MalformedAnswer(f"{field} is {_kind(value)}, not a string")
    arguments = function.get("arguments")
    if isinstance(arguments, dict):
        return ToolCall(name=name, arguments=arguments, id=call_id)  # sent as an object
    try:
        return ToolCall(name=name, arguments=json.loads(arguments or "{}"), id=call_id)
    except (TypeError, ValueError, RecursionError) as error:
        # The model's mistake, not the server's: told to the model.
        return ToolCall(
            name=name,
            arguments=None,
            id=call_id,
            problem=f"the arguments of this call are not valid JSON ({unparsed(error)}); "
            "send them again as a JSON object",
        )


def _object(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise MalformedAnswer(f"{where} is {_kind(value)}, not an object")
    return value


def _kind(value) -> str:
    if value is None:
        return "missing"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def unparsed(error: Exception) -> str:
    """Why a JSON parse failed, in a few words."""
    if isinstance(error, json.JSONDecodeError):
        return error.msg
    if isinstance(error, RecursionError):
        return "nested too deeply"
    if isinstance(error, UnicodeDecodeError):
        return "not UTF-8"
    return "not a string"


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return repr(flat[:60] + ("…" if len(flat) > 60 else ""))
