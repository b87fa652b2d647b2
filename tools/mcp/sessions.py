"""Sessions with MCP servers, kept open for the life of the process.

The ``mcp`` SDK is asynchronous and the runtime is not: one daemon thread per
process runs an asyncio loop, which holds one session per toolset
(``server_session``) and serves the runtime's calls
(``asyncio.run_coroutine_threadsafe``). A session is opened on first use and
reused by every later call and run in the process: a stdio server is started
once, not per call (G4's worker, a ``SimpleWorker``, keeps it for all its
jobs; RQ's forking worker starts one work horse per job, and so one session
per run attempt).

A call that fails is ``NotSent`` or ``MaybeSent``, as it may have reached
the server or not (``failures``, G13): a probe proves a session alive
before each call, so a failure of the call itself means it may have.

A forked child (RQ's work horse) starts with no sessions: the loop thread
did not survive the fork, and the parent's sessions stay the parent's.
"""

import asyncio
import contextlib
import os
import threading
from collections.abc import Awaitable
from typing import Any

from django.conf import settings

from tools.mcp.declaration import McpToolset
from tools.mcp.failures import (
    MaybeSent,
    NotSent,
    TooLarge,
    TruncatedAnswer,
    described,
    past_the_cap,
)
from tools.mcp.server_session import ServerSession


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


class Sessions:
    """The process's sessions, by toolset, and the loop that serves them."""

    def __init__(self):
        self._pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._sessions: dict[type[McpToolset], ServerSession] = {}
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

    async def _session(self, toolset: type[McpToolset]) -> ServerSession:
        """The toolset's open session, opening one if there is none."""
        async with self._lock_of(toolset):
            session = self._sessions.get(toolset)
            if session is None or not session.is_open:
                session = ServerSession(toolset)
                await session.open(settings.NRLLM_MCP_CONNECT_TIMEOUT_SECONDS)
                self._sessions[toolset] = session
            return session

    async def _forget(self, toolset: type[McpToolset], session: ServerSession) -> None:
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
            if past_the_cap(error) is not None:
                from tools.mcp.limits import MESSAGE_BYTES

                raise TooLarge(
                    f"its tool list is larger than {MESSAGE_BYTES} bytes, this client's cap"
                ) from error
            raise NotSent(described(error)) from error
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
            start = past_the_cap(error)
            if start is not None:
                return TruncatedAnswer(start)  # answered: the session is sound
            if not isinstance(error, asyncio.CancelledError):
                # The session may be broken: the next call opens a fresh one.
                await self._forget_unless_shared(toolset, session, calls_of_its_own=1)
                raise MaybeSent(described(error)) from error
            raise
        finally:
            session.calls_in_flight -= 1

    async def _forget_unless_shared(self, toolset, session: ServerSession, calls_of_its_own=0):
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

    async def _live_session(self, toolset: type[McpToolset]) -> ServerSession:
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
