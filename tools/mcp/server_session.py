"""One session with one MCP server: the transport it connects over, and
the task that opens it, holds it open and closes it, on the loop's thread
of ``sessions``, which keeps one such session per toolset.

A session that cannot be opened (or not within its time) is ``NotSent``:
nothing reached the server.
"""

import asyncio
import contextlib
import logging

from tools.mcp.declaration import McpToolset, Stdio, StreamableHttp, transport_problem
from tools.mcp.failures import NotSent, described

#: The sessions' logger, as it was before a session had a module of its own.
logger = logging.getLogger("tools.mcp.sessions")


class ServerSession:
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
                opened.set_exception(NotSent(described(error)))
            elif not isinstance(error, asyncio.CancelledError):
                server = self.toolset.server
                logger.info("MCP server %r: session ended: %s", server, described(error))
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
    from mcp import StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client

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
    http_client = await stack.enter_async_context(http_client_of(transport))
    return streamable_http_client(
        transport.url, http_client=http_client, max_sse_event_size=limits.MESSAGE_BYTES
    )


def http_client_of(transport: StreamableHttp):
    """The HTTP client of a session over streamable HTTP: the SDK's
    ``create_mcp_http_client``, with a transport that caps JSON bodies, over
    a connection for every run in flight (``pooled_http``)."""
    import httpx2
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

    from tools.mcp import limits
    from tools.mcp.pooled_http import PooledTransport, session_connections

    return httpx2.AsyncClient(
        headers=transport.headers(),
        timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
        transport=limits.CappedJsonBodies(PooledTransport(session_connections())),
    )
