"""Sessions with MCP servers, kept open for the life of the process.

The ``mcp`` SDK is asynchronous and the runtime is not: one daemon thread per
process runs an asyncio loop, which holds one session per toolset and
serves the runtime's calls (``asyncio.run_coroutine_threadsafe``). A session
is opened on first use and reused by every later call and run in the
process: a stdio server is started once, not per call (G4's worker, a
``SimpleWorker``, keeps it for all its jobs; RQ's forking worker starts one
work horse per job, and so one session per run attempt).

What a failure means depends on whether the call may have reached the
server, which is what the runtime needs to know of a write (G13):

- ``NotSent``: the call was not sent — the server cannot be reached, a
  session cannot be opened, or a probe of the open session failed.
- ``MaybeSent``: it was handed to the server and no answer came (the server
  went away, the connection broke, the call ran past its time limit).

What a server sends is read to a cap per message (``limits``): a listing
past it fails (``TooLarge``), a call's answer past it comes back as its
start (``TruncatedAnswer``).

A forked child (RQ's work horse) starts with no sessions: the loop thread
did not survive the fork, and the parent's sessions stay the parent's.
"""

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from tools.mcp.declaration import McpToolset, Stdio, StreamableHttp, transport_problem

logger = logging.getLogger(__name__)


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


def _past_the_cap(error: BaseException) -> str | None:
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


async def _probe(client) -> None:
    """One round trip that changes nothing at the server: ``server/discover``
    on a connection of the 2026 protocol (which has no ping), a ping on an
    older one."""
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    version = client.protocol_version
    if version in MODERN_PROTOCOL_VERSIONS:
        await client.session.send_discover(version)
    else:
        await client.session.send_ping()


def _described(error: BaseException) -> str:
    """An error as an operator can read it: an exception group (the SDK's
    task groups raise them) by its first leaf."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class _Session:
    """One open session with one server, owned by the loop's thread.

    ``_holder`` is the task that entered the SDK's ``Client`` (its cancel
    scopes must be left by the task that entered them) and keeps it open
    until ``close``."""

    def __init__(self, toolset: type[McpToolset]):
        self.toolset = toolset
        self.client = None
        self._holder: asyncio.Task | None = None
        self._release: asyncio.Event | None = None
        #: Calls sent on it and not yet answered (the loop's thread alone counts).
        self.calls_in_flight = 0

    @property
    def is_open(self) -> bool:
        return self.client is not None and self._holder is not None and not self._holder.done()

    async def open(self, timeout: float) -> None:
        opened: asyncio.Future = asyncio.get_running_loop().create_future()
        # Its exception is the holder's word to a waiter that may have gone
        # (timed out): retrieved here, asyncio does not log it as lost.
        opened.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._release = asyncio.Event()
        self._holder = asyncio.create_task(self._hold(opened, self._release))
        try:
            self.client = await asyncio.wait_for(asyncio.shield(opened), timeout)
        except TimeoutError:
            await self._abandon()
            raise NotSent(f"no session within {timeout:g}s") from None
        except BaseException:
            await self._abandon()
            raise

    async def _abandon(self) -> None:
        """Stop a holder whose session never opened: it is stuck in the
        handshake, where the release ``close`` waits for never comes, so
        waiting would add ``close``'s 10 s to the connect timeout. The
        SDK's shutdown of a stdio server is bounded."""
        holder, self._holder, self.client = self._holder, None, None
        if holder is not None:
            holder.cancel()
            await asyncio.wait({holder}, timeout=10)

    async def _hold(self, opened: asyncio.Future, release: asyncio.Event) -> None:
        from mcp import Client

        try:
            async with contextlib.AsyncExitStack() as stack:
                transport = await _transport(self.toolset.get_transport(), stack)
                client = await stack.enter_async_context(Client(transport, cache=None))
                opened.set_result(client)
                await release.wait()
        except BaseException as error:
            if not opened.done():
                opened.set_exception(NotSent(_described(error)))
            elif not isinstance(error, asyncio.CancelledError):
                server = self.toolset.server
                logger.info("MCP server %r: session ended: %s", server, _described(error))
        finally:
            self.client = None

    async def close(self) -> None:
        holder, self._holder, self.client = self._holder, None, None
        if holder is None:
            return
        self._release.set()
        try:
            await asyncio.wait_for(holder, 10)
        except TimeoutError:
            pass  # wait_for cancelled the holder


async def _transport(transport: Stdio | StreamableHttp, stack: contextlib.AsyncExitStack):
    """What the SDK's ``Client`` connects to, its resources on ``stack``."""
    import httpx2
    from mcp import StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

    from tools.mcp import limits

    if not isinstance(transport, Stdio | StreamableHttp):
        raise TypeError(f"get_transport() returned {transport!r}, not a Stdio or a StreamableHttp")
    problem = transport_problem(transport)  # checked at load unless built here
    if problem:
        raise TypeError(f"get_transport(): {problem}")
    if isinstance(transport, Stdio):
        return limits.capped_stdio_client(
            StdioServerParameters(
                command=transport.command,
                args=list(transport.args),
                env=transport.environment(),
                cwd=transport.cwd,
            )
        )
    # The SDK's create_mcp_http_client, with a transport that caps JSON bodies.
    http_client = await stack.enter_async_context(
        httpx2.AsyncClient(
            headers=transport.headers(),
            timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
            transport=limits.CappedJsonBodies(httpx2.AsyncHTTPTransport()),
        )
    )
    return streamable_http_client(
        transport.url, http_client=http_client, max_sse_event_size=limits.MESSAGE_BYTES
    )


class Sessions:
    """The process's sessions, by toolset, and the loop that serves them."""

    def __init__(self):
        self._pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._sessions: dict[type[McpToolset], _Session] = {}
        #: One lock per toolset, made on the loop's thread: a server slow
        #: to open a session holds up its own callers only, never another
        #: server's listing or call.
        self._locks: dict[type[McpToolset], asyncio.Lock] = {}
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, args=(ready,), name="mcp-sessions", daemon=True
        )
        self._thread.start()
        ready.wait()

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(ready.set)
        self._loop.run_forever()

    def _run(self, coroutine: Awaitable, timeout: float):
        """Run ``coroutine`` on the loop and wait up to ``timeout`` seconds;
        on a timeout (or a signal stopping the wait, a tool's time limit),
        the coroutine is cancelled."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout)
        finally:
            if not future.done():
                future.cancel()

    def _lock_of(self, toolset: type[McpToolset]) -> asyncio.Lock:
        return self._locks.setdefault(toolset, asyncio.Lock())

    async def _session(self, toolset: type[McpToolset]) -> _Session:
        """The toolset's open session, opening one if there is none."""
        async with self._lock_of(toolset):
            session = self._sessions.get(toolset)
            if session is None or not session.is_open:
                session = _Session(toolset)
                await session.open(settings.NRLLM_MCP_CONNECT_TIMEOUT_SECONDS)
                self._sessions[toolset] = session
            return session

    async def _forget(self, toolset: type[McpToolset], session: _Session) -> None:
        async with self._lock_of(toolset):
            if self._sessions.get(toolset) is session:
                del self._sessions[toolset]
        await session.close()

    def list_tools(self, toolset: type[McpToolset]) -> list:
        """The server's tools (every page), over a session opened if need be.
        Raises ``NotSent`` when the server cannot be reached."""
        timeout = settings.NRLLM_MCP_CONNECT_TIMEOUT_SECONDS
        try:
            return self._run(self._list_tools(toolset, timeout), 2 * timeout + 1)
        except TimeoutError:
            raise NotSent(f"no tool list within {timeout:g}s") from None

    async def _list_tools(self, toolset: type[McpToolset], timeout: float) -> list:
        session = await self._session(toolset)
        tools, cursor = [], None
        try:
            async with asyncio.timeout(timeout):
                for _ in range(100):  # a paginator that never ends cannot hang us
                    page = await session.client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
        except (Exception, TimeoutError) as error:
            await self._forget_unless_shared(toolset, session)
            if _past_the_cap(error) is not None:
                from tools.mcp.limits import MESSAGE_BYTES

                raise TooLarge(
                    f"its tool list is larger than {MESSAGE_BYTES} bytes, this client's cap"
                ) from error
            raise NotSent(_described(error)) from error
        return tools

    def call_tool(
        self,
        toolset: type[McpToolset],
        name: str,
        arguments: dict,
        *,
        meta: dict[str, Any],
        timeout: float,
    ):
        """Call ``name`` once and return the SDK's ``CallToolResult`` (or a
        ``TruncatedAnswer``).

        Before the call, the session is proved alive with a probe (a session
        whose server went away since it was last used is reopened), so a
        failure of the call itself means it may have reached the server."""
        sent = threading.Event()
        try:
            return self._run(self._call(toolset, name, arguments, meta, sent), timeout)
        except TimeoutError:
            if not sent.is_set():
                raise NotSent(f"no session within the call's {timeout:g}s") from None
            raise MaybeSent(f"no answer within {timeout:g}s") from None

    async def _call(self, toolset, name, arguments, meta, sent: threading.Event):
        session = await self._live_session(toolset)
        sent.set()
        session.calls_in_flight += 1
        try:
            return await session.client.call_tool(name, arguments, meta=meta)
        except (Exception, asyncio.CancelledError) as error:
            start = _past_the_cap(error)
            if start is not None:
                return TruncatedAnswer(start)  # answered: the session is sound
            if not isinstance(error, asyncio.CancelledError):
                # The session may be broken: the next call opens a fresh one.
                await self._forget_unless_shared(toolset, session, calls_of_its_own=1)
                raise MaybeSent(_described(error)) from error
            raise
        finally:
            session.calls_in_flight -= 1

    async def _forget_unless_shared(self, toolset, session: _Session, calls_of_its_own=0):
        """After a failure on ``session``: forget it (the next call opens a
        fresh one), unless other runs' calls are in flight on it and it is
        still open — one run's error (a refusal, a reply the SDK rejects, a
        listing stuck behind a long call) must not close the session under
        their calls, which would leave a write in doubt though it was
        answered (G15). If it is broken, their calls fail too, and the last
        forgets it."""
        if session.is_open and session.calls_in_flight > calls_of_its_own:
            return
        await self._forget(toolset, session)

    async def _live_session(self, toolset: type[McpToolset]) -> _Session:
        session = await self._session(toolset)
        if session.calls_in_flight:
            # Other runs' calls are in flight on it: it is open, and a probe
            # could wait behind them (a stdio server answers one at a time)
            # and close it under them. If it broke, this call finds out.
            return session
        try:
            async with asyncio.timeout(settings.NRLLM_MCP_CONNECT_TIMEOUT_SECONDS):
                await _probe(session.client)
        except (Exception, TimeoutError):
            await self._forget(toolset, session)
            session = await self._session(toolset)  # NotSent when it cannot be reopened
        return session

    def close_all(self) -> None:
        """Close every session (a stdio server is asked to exit)."""
        if os.getpid() != self._pid:
            return
        with contextlib.suppress(Exception):
            self._run(self._close_all(), 30)

    async def _close_all(self) -> None:
        # Every toolset's lock, not only those with a session: one opening
        # now is closed once it has opened, not left open behind this.
        for toolset in list(self._locks):
            async with self._lock_of(toolset):
                session = self._sessions.pop(toolset, None)
            if session is not None:
                await session.close()


_sessions: Sessions | None = None
_started = threading.Lock()
#: Sessions of a parent process, held (never closed) by its forked child.
_inherited: list[Sessions] = []


def sessions() -> Sessions:
    """This process's sessions, started on first use."""
    global _sessions
    with _started:
        if _sessions is None:
            _sessions = Sessions()
        return _sessions


def _after_fork_in_child() -> None:
    global _sessions, _started
    if _sessions is not None:
        # Keep the parent's objects referenced: collecting them here would
        # run finalizers on pipes and sockets that are the parent's.
        _inherited.append(_sessions)
    _sessions = None
    _started = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
