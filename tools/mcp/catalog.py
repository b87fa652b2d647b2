"""What each MCP server offers, as this process last listed it.

A listing is asked for when first needed (never at start-up: a server that
cannot be reached must not stop the app, and ``migrate`` need not start
one), kept for ``LISTING_SECONDS``, and asked again sooner after a failure
(``RETRY_SECONDS``), so a server that comes back is seen without a restart.

A declared tool is unavailable when the server cannot be reached (or
listed: its list is past the cap on one message), does not offer it, or
offers it with a schema or a name this runtime cannot use; each has its
reason, for operators and for the refusal at enqueue. One tool's schema
never fails the listing of the others.
"""

import functools
import json
import threading
import time
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tools.effects import ToolEffect
from tools.mcp import metrics
from tools.mcp.declaration import FUNCTION_NAME, McpToolset, Undeclared
from tools.mcp.failures import NotSent, TooLarge
from tools.mcp.hints import contradictions, hints_of
from tools.mcp.sessions import sessions
from tools.mcp.tool import McpTool
from tools.validation import check_schema

LISTING_SECONDS = 60.0
RETRY_SECONDS = 5.0


@dataclass(frozen=True)
class Listing:
    """One toolset's tools as listed once: those that can be offered, and
    why each other one cannot (by registered name)."""

    tools: dict[str, McpTool] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    #: Why the server could not be listed; "" when it was.
    unreachable: str = ""
    listed_at: float = 0.0

    def is_fresh(self) -> bool:
        age = time.monotonic() - self.listed_at
        return age < (RETRY_SECONDS if self.unreachable else LISTING_SECONDS)


_listings: dict[type[McpToolset], Listing] = {}
_locks: dict[type[McpToolset], threading.Lock] = {}
_locks_lock = threading.Lock()


def listing(toolset: type[McpToolset], *, refresh: bool = False) -> Listing:
    """The toolset's listing, asked of its server when there is none fresh
    (with ``refresh``: none made since this call asked)."""
    asked_at = time.monotonic()
    cached = _listings.get(toolset)
    if cached is not None and cached.is_fresh() and not refresh:
        return cached
    with _locks_lock:
        lock = _locks.setdefault(toolset, threading.Lock())
    with lock:
        cached = _listings.get(toolset)
        since = not refresh or (cached is not None and cached.listed_at >= asked_at)
        if cached is not None and cached.is_fresh() and since:
            # Another thread listed it meanwhile. Runs starting together in
            # one process (G15) share one listing, reachable or not, instead
            # of each waiting out the server's connect timeout in turn.
            return cached
        _listings[toolset] = fresh = _listed(toolset)
        return fresh


def listings(
    toolsets: Iterable[type[McpToolset]], *, refresh: bool = False
) -> dict[type[McpToolset], Listing]:
    """Each toolset's listing, the servers without a fresh one (every
    server, with ``refresh``) asked side by side: a page or an enqueue
    naming several servers that hang waits for the connect timeout once,
    not once per server."""
    toolsets = list(dict.fromkeys(toolsets))
    stale = [toolset for toolset in toolsets if refresh or not _is_fresh(toolset)]
    ask = functools.partial(listing, refresh=refresh)
    if len(stale) > 1:
        with ThreadPoolExecutor(max_workers=len(stale), thread_name_prefix="mcp-list") as pool:
            listed = dict(zip(stale, pool.map(ask, stale), strict=True))
    else:
        listed = {toolset: ask(toolset) for toolset in stale}
    return {
        toolset: listed[toolset] if toolset in listed else listing(toolset) for toolset in toolsets
    }


def _is_fresh(toolset: type[McpToolset]) -> bool:
    cached = _listings.get(toolset)
    return cached is not None and cached.is_fresh()


def cached_listing(toolset: type[McpToolset]) -> Listing | None:
    """The last listing, however old; None if none was asked for."""
    return _listings.get(toolset)


def forget() -> None:
    """Drop every listing: the next use lists again."""
    _listings.clear()


def _listed(toolset: type[McpToolset]) -> Listing:
    try:
        offered = sessions().list_tools(toolset)
    except NotSent as error:
        metrics.LISTINGS.labels(toolset.server, "unreachable").inc()
        failed = "cannot be listed" if isinstance(error, TooLarge) else "cannot be reached"
        reason = f"MCP server {toolset.server!r} {failed}: {error}"
        return Listing(
            unavailable=dict.fromkeys(toolset.declared_names(), reason),
            unreachable=reason,
            listed_at=time.monotonic(),
        )
    metrics.LISTINGS.labels(toolset.server, "ok").inc()
    tools, unavailable = {}, {}
    times_listed = Counter(remote.name for remote in offered)
    for remote in offered:
        declared = toolset.declaration(remote.name)
        if declared is None and toolset.undeclared is Undeclared.HIDE:
            continue
        name = toolset.registered_name(remote.name)
        try:
            problem = _problem(name, remote.input_schema)
        except Exception as error:  # one tool's schema never fails the others' listing
            problem = f"the server's input schema cannot be checked: {type(error).__name__}"
        if times_listed[remote.name] > 1:
            # Which of them the server runs is unknown: a call checked
            # against one schema would be sent to the other.
            problem = f"the server lists {remote.name!r} more than once"
        if problem:
            unavailable[name] = problem
            continue
        effect = declared.effect if declared else ToolEffect.NON_IDEMPOTENT_WRITE
        hints = hints_of(remote.annotations)
        tools[name] = McpTool(
            toolset,
            remote.name,
            effect=effect,
            declared=declared is not None,
            description=remote.description or "",
            parameters=remote.input_schema,
            hints=hints,
            contradictions=contradictions(effect, hints, declared=declared is not None),
            timeout_seconds=(declared and declared.timeout_seconds) or toolset.timeout_seconds,
        )
    for name in toolset.declared_names():
        if name not in tools and name not in unavailable:
            unavailable[name] = f"MCP server {toolset.server!r} does not offer it"
    return Listing(tools=tools, unavailable=unavailable, listed_at=time.monotonic())


def _problem(name: str, schema) -> str:
    if not FUNCTION_NAME.match(name):
        return (
            f"its name {name!r} is not 1-64 letters, digits, '_' or '-', "
            "which chat-completions APIs require"
        )
    try:
        # Strict JSON, as the API returns it and a chat-completions request
        # carries it to the model: the SDK reads NaN and the infinities.
        json.dumps(schema, allow_nan=False)
    except ValueError:
        return "the server's input schema holds NaN or an infinity, which JSON has no number for"
    problem = check_schema(schema)
    return f"the server's input schema: {problem}" if problem else ""
