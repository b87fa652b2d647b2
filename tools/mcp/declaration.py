"""What a deployment writes to offer an MCP server's tools: the server
(how to reach it) and the effect of each tool, declared in code.

A toolset is listed in ``NRLLM_TOOLS`` like a tool class. Its tools are
registered as ``<server>__<tool>`` (the characters every chat-completions
API accepts in a function name). A tool the server offers and the class does
not declare is registered as a ``non_idempotent_write`` — the riskiest
effect, which needs approval under the default policy — or not at all, if
the class says ``undeclared = Undeclared.HIDE``.

Credentials are named, never written: an HTTP header's value or a stdio
server's environment is read from this process's environment each time a
session opens, and nothing of it is stored on a run or a step.
"""

import enum
import math
import os
import re
from dataclasses import dataclass, field
from typing import ClassVar

from tools.effects import ToolEffect

#: How a registered name joins the server's name to the tool's.
SEPARATOR = "__"
_SERVER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,39}$")
#: What chat-completions APIs accept as a function name: a registered name
#: (``<server>__<tool>``) must be one.
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: An HTTP header value as the HTTP client sends one (RFC 9110 field-value,
#: ASCII): printable, inner spaces and tabs only.
_HEADER_VALUE = re.compile(r"\A(?:[\x21-\x7e](?:[\t\x20-\x7e]*[\x21-\x7e])?)?\Z")


class Undeclared(enum.StrEnum):
    """What becomes of a tool the server offers and the class does not list."""

    #: Offered, as a ``non_idempotent_write``.
    AS_NON_IDEMPOTENT_WRITE = "as_non_idempotent_write"
    #: Not offered at all.
    HIDE = "hide"


@dataclass(frozen=True)
class Declared:
    """A tool's declaration when it has more than an effect."""

    effect: ToolEffect
    #: The longest one call may take; None: the toolset's ``timeout_seconds``.
    timeout_seconds: float | None = None


@dataclass(frozen=True)
class Stdio:
    """A server this process starts and talks to over its stdin and stdout.

    ``env_from`` names variables of this process's environment handed on to
    the server (its credentials, say); the server gets those and the SDK's
    safe default (``PATH``, ``HOME``, ...) only."""

    command: str
    args: tuple[str, ...] = ()
    env_from: tuple[str, ...] = ()
    cwd: str | None = None

    def describe(self) -> str:
        return " ".join([self.command, *self.args])

    def environment(self) -> dict[str, str]:
        from mcp.client.stdio import get_default_environment

        return {
            **get_default_environment(),
            **{name: os.environ[name] for name in self.env_from if name in os.environ},
        }


@dataclass(frozen=True)
class StreamableHttp:
    """A server reached over streamable HTTP at ``url``.

    ``headers_from_env`` maps a header to the environment variable holding
    its value (``{"Authorization": "TRACKER_AUTHORIZATION"}``); a variable
    that is not set sends no header."""

    url: str
    headers_from_env: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return self.url

    def headers(self) -> dict[str, str]:
        """The headers to send. Raises ``ValueError``, naming the header and
        its variable but never the value, for a value HTTP cannot carry: the
        HTTP client's own refusal quotes the value, and it would end up in
        the reason a tool is unavailable (pages, API, a run's failure)."""
        headers = {}
        for header, variable in self.headers_from_env.items():
            if variable not in os.environ:
                continue
            value = os.environ[variable]
            if not _HEADER_VALUE.match(value):
                raise ValueError(
                    f"header {header!r} (from {variable}): its value is not one HTTP can "
                    "carry: a line break, a leading or trailing space, or a character "
                    "outside printable ASCII"
                )
            headers[header] = value
        return headers


class McpToolset:
    """Base class of a toolset: one MCP server and the effects of its tools.

    Subclasses set ``server`` (a short name: it prefixes the tools' names and
    labels the metrics), ``transport`` — or override ``get_transport()`` to
    build it when a session opens — and ``tools``, mapping each tool's name
    on the server to a ``ToolEffect`` or a ``Declared``."""

    server: ClassVar[str] = ""
    transport: ClassVar[Stdio | StreamableHttp | None] = None
    tools: ClassVar[dict[str, ToolEffect | Declared]] = {}
    undeclared: ClassVar[Undeclared] = Undeclared.AS_NON_IDEMPOTENT_WRITE
    #: A call's time limit when its declaration names none.
    timeout_seconds: ClassVar[float] = 60.0

    @classmethod
    def get_transport(cls) -> Stdio | StreamableHttp:
        return cls.transport

    @classmethod
    def registered_name(cls, remote_name: str) -> str:
        return f"{cls.server}{SEPARATOR}{remote_name}"

    @classmethod
    def remote_name(cls, registered_name: str) -> str | None:
        """The server's name of the tool registered as ``registered_name``,
        or None when that name is not one of this toolset's."""
        prefix = f"{cls.server}{SEPARATOR}"
        if registered_name.startswith(prefix) and len(registered_name) > len(prefix):
            return registered_name[len(prefix) :]
        return None

    @classmethod
    def declaration(cls, remote_name: str) -> Declared | None:
        declared = cls.tools.get(remote_name)
        if declared is None or isinstance(declared, Declared):
            return declared
        return Declared(declared)

    @classmethod
    def declared_names(cls) -> list[str]:
        return [cls.registered_name(name) for name in cls.tools]


def dotted(value: type) -> str:
    return f"{value.__module__}.{value.__qualname__}"


def toolset_problem(toolset: type[McpToolset]) -> str | None:
    """Why ``toolset`` cannot be loaded, naming it; None when it can."""
    where = dotted(toolset)
    if not isinstance(toolset.server, str) or not _SERVER_NAME.match(toolset.server):
        return (
            f"MCP toolset {where}: server {toolset.server!r} must be 1-40 letters, digits, "
            "'_' or '-', starting with a letter"
        )
    if SEPARATOR in toolset.server:
        return f"MCP toolset {where}: server {toolset.server!r} must not contain {SEPARATOR!r}"
    if toolset.server.endswith("_"):
        # "a_" + "__" + "x" and "a" + "__" + "_x" would be one registered
        # name for two servers' tools, effect_for taking one's declaration
        # and a call going to the other.
        return f"MCP toolset {where}: server {toolset.server!r} must not end with '_'"
    builds_its_own = toolset.get_transport.__func__ is not McpToolset.get_transport.__func__
    if not builds_its_own and not isinstance(toolset.transport, Stdio | StreamableHttp):
        return f"MCP toolset {where}: transport must be a Stdio or a StreamableHttp"
    problem = None if builds_its_own else transport_problem(toolset.transport)
    if problem:
        return f"MCP toolset {where}: transport: {problem}"
    if not isinstance(toolset.tools, dict):
        return f"MCP toolset {where}: tools must be a dict of tool name to ToolEffect"
    for name, declared in toolset.tools.items():
        effect = declared.effect if isinstance(declared, Declared) else declared
        # type() rather than isinstance(): a plain "read_only" string must
        # not pass for a declared effect (as for a tool class).
        if type(effect) is not ToolEffect:
            return (
                f"MCP toolset {where}: tool {name!r}: effect {effect!r} is not a ToolEffect "
                "member; use ToolEffect.READ_ONLY, IDEMPOTENT_WRITE or NON_IDEMPOTENT_WRITE"
            )
        if not isinstance(name, str) or not FUNCTION_NAME.match(toolset.registered_name(name)):
            return (
                f"MCP toolset {where}: tool {name!r}: its registered name must be 1-64 "
                "letters, digits, '_' or '-' (which chat-completions APIs require)"
            )
        limit = declared.timeout_seconds if isinstance(declared, Declared) else None
        if limit is not None and not _is_time_limit(limit):
            return (
                f"MCP toolset {where}: tool {name!r}: timeout_seconds must be a finite number "
                "of seconds above 0"
            )
    if type(toolset.undeclared) is not Undeclared:
        return f"MCP toolset {where}: undeclared must be an Undeclared member"
    if not _is_time_limit(toolset.timeout_seconds):
        return f"MCP toolset {where}: timeout_seconds must be a finite number of seconds above 0"
    return None


def transport_problem(transport: Stdio | StreamableHttp) -> str | None:
    """Why ``transport`` cannot be used; None when it can. A str where a
    tuple belongs is the likely slip (``env_from=("TOKEN")``): iterated, its
    letters would be the variables handed on, and the server would start
    without its credential."""
    if isinstance(transport, Stdio):
        if not isinstance(transport.command, str) or not transport.command:
            return "command must be a non-empty string"
        for name in ("args", "env_from"):
            value = getattr(transport, name)
            if isinstance(value, str):
                return f"{name} must be a tuple of strings, not the str {value!r}"
            if not isinstance(value, tuple | list) or not all(isinstance(v, str) for v in value):
                return f"{name} must be a tuple of strings"
        return None
    headers = transport.headers_from_env
    if not isinstance(transport.url, str) or not transport.url:
        return "url must be a non-empty string"
    if not isinstance(headers, dict) or not all(
        isinstance(header, str) and isinstance(variable, str)
        for header, variable in headers.items()
    ):
        return "headers_from_env must map header names to variable names"
    return None


def _is_time_limit(seconds) -> bool:
    """A limit the lease can be extended by and an alarm set for: not
    True (an int to Python), not infinite."""
    return (
        isinstance(seconds, int | float)
        and not isinstance(seconds, bool)
        and math.isfinite(seconds)
        and seconds > 0
    )
