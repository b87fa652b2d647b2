"""What a failure with an MCP server means: whether the call may have
reached the server, which is what the runtime needs to know of a write (G13).

- ``NotSent``: the call was not sent — the server cannot be reached, a
  session cannot be opened, or a probe of the open session failed.
- ``MaybeSent``: it was handed to the server and no answer came (the server
  went away, the connection broke, the call ran past its time limit).

What a server sends is read to a cap per message (``limits``): a listing
past it fails (``TooLarge``), a call's answer past it comes back as its
start (``TruncatedAnswer``). ``past_the_cap`` and ``described`` read the
SDK's errors for the sessions (``sessions``, ``server_session``).
"""

from dataclasses import dataclass


class NotSent(Exception):
    """The call never left this process: nothing reached the server."""


class MaybeSent(Exception):
    """The call was handed to the server; whether it acted is unknown."""


class TooLarge(NotSent):
    """The server's tool list is past the cap on one message."""


@dataclass(frozen=True)
class TruncatedAnswer:
    """A call's answer past the cap on one message: the server answered,
    and ``start`` is the first of what it sent (not parsed: cut, it is no
    JSON)."""

    start: str


def past_the_cap(error: BaseException) -> str | None:
    """The start of an answer the cap cut, when ``error`` says it was cut
    (the stand-in's code, or the SDK's refusal of an event past its cap),
    else None."""
    from mcp.shared.exceptions import MCPError

    from tools.mcp import limits

    if not isinstance(error, MCPError):
        return None
    if error.code == limits.PAST_THE_CAP:
        data = error.data if isinstance(error.data, dict) else {}
        return str(data.get("start", ""))
    if f"exceeded the {limits.MESSAGE_BYTES} byte limit" in error.message:
        return ""  # an event stream's event: the SDK kept none of it
    return None


def described(error: BaseException) -> str:
    """An error as an operator can read it: an exception group (the SDK's
    task groups raise them) by its first leaf."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
