"""How a process splits the connections it holds for long calls into pools
of about a hundred, and which pool takes the next call.

A run's thread holds one HTTP connection for its whole model call (or MCP
call): a worker with N slots must hold N at once, or the runs past its
client's limit wait for a connection with their slot taken (the ``openai``
SDK's own pool stops at 1,000). One pool of N would hold them, but httpcore
hands out a connection by walking every connection of its pool under the
pool's lock: measured, 0.75 ms of CPU a request with 100 in flight, 2.1 ms
with 2,000. So the N connections are split into ``ceil(N / 100)`` pools
(``pool_sizes``) and each call goes to the pool with the fewest calls in
flight (``LeastBusy``): while fewer than N calls are in flight, that pool
has a connection free (were every pool full, N calls would be in flight).
"""

import contextlib
import math
import threading
from collections.abc import Iterator

#: About this many connections a pool: the cost of finding a free one stays
#: that of a hundred, however many slots the process has.
CONNECTIONS_PER_POOL = 100


def pool_sizes(connections: int) -> list[int]:
    """The sizes of the pools that hold ``connections`` (at least one pool,
    none larger than ``CONNECTIONS_PER_POOL``, their sum at least
    ``connections``)."""
    pools = max(1, math.ceil(connections / CONNECTIONS_PER_POOL))
    return [math.ceil(connections / pools)] * pools


class LeastBusy:
    """Which of ``pools`` pools takes the next call: the one with the fewest
    calls in flight, counted from ``taken`` until its call ends. Thread-safe;
    a call is O(pools), a few microseconds at twenty."""

    def __init__(self, pools: int):
        self._in_flight = [0] * pools
        self._lock = threading.Lock()

    def take(self) -> int:
        """The least busy pool's index, counted busy from now on; the caller
        gives it back (``give_back``) once its call has ended."""
        with self._lock:
            index = min(range(len(self._in_flight)), key=self._in_flight.__getitem__)
            self._in_flight[index] += 1
        return index

    def give_back(self, index: int) -> None:
        with self._lock:
            self._in_flight[index] -= 1

    @contextlib.contextmanager
    def taken(self) -> Iterator[int]:
        """The least busy pool's index for the length of the ``with`` block."""
        index = self.take()
        try:
            yield index
        finally:
            self.give_back(index)

    def in_flight(self) -> list[int]:
        """Calls in flight, per pool (for tests and logs)."""
        with self._lock:
            return list(self._in_flight)
