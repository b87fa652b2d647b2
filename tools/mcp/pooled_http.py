"""The connections of one session with an MCP server over streamable HTTP:
one per slot of the worker, in pools of about a hundred sharing one TLS
context (``ground.connection_pools``), the least busy pool taking each
request.

Every run's call to a server goes over the process's one session with it,
and a call holds its connection until its answer ends (an event stream
while the tool runs). httpx's default transport holds 100 connections: a
worker with more slots than that would have its 101st call wait for one —
and one that waited out the pool's timeout would come back as a call that
may have been sent. Sized to the slots, every run in flight can be in a
call at once.
"""

import httpx2
from django.conf import settings

from ground.connection_pools import CONNECTIONS_PER_POOL, LeastBusy, pool_sizes

#: Connections a session holds beyond one per slot: its stream of the
#: server's own messages (a GET held open) and its closing DELETE.
SESSION_CONNECTIONS = 2


def session_connections() -> int:
    """Connections one session may hold at once: a call per slot of a
    concurrent worker (``NRLLM_WORKER_CONCURRENCY``), at least a pool's."""
    slots = max(settings.NRLLM_WORKER_CONCURRENCY, CONNECTIONS_PER_POOL)
    return slots + SESSION_CONNECTIONS


class PooledTransport(httpx2.AsyncBaseTransport):
    """httpx's transport over ``pool_sizes(connections)`` pools on one TLS
    context; a request is counted on its pool until its answer is closed."""

    def __init__(self, connections: int):
        tls = httpx2.create_ssl_context()  # httpx's default, once for every pool
        self._pools = [
            httpx2.AsyncHTTPTransport(
                verify=tls,
                limits=httpx2.Limits(max_connections=size, max_keepalive_connections=size),
            )
            for size in pool_sizes(connections)
        ]
        self._least_busy = LeastBusy(len(self._pools))

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        index = self._least_busy.take()
        try:
            response = await self._pools[index].handle_async_request(request)
        except BaseException:
            self._least_busy.give_back(index)
            raise
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_CountedUntilClosed(response.stream, lambda: self._least_busy.give_back(index)),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.aclose()


class _CountedUntilClosed(httpx2.AsyncByteStream):
    """An answer's body that gives its pool's count back once, when closed
    (read whole, or left: httpx closes every answer it hands out)."""

    def __init__(self, stream, closed):
        self._stream = stream
        self._closed = closed

    async def __aiter__(self):
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            closed, self._closed = self._closed, None
            if closed is not None:
                closed()
