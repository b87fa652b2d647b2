"""Stopping a tool at its declared time limit.

A tool may declare ``timeout_seconds``. The runtime extends the lease to cover
that limit plus a margin right before the call (so a long write is not reaped
mid-call), and the agent loop stops the tool at the limit with ``time_limit``.
The stop uses SIGALRM, which only the main thread can receive — the case in
an RQ work horse and a management command; elsewhere (a web server thread)
only the tool's own I/O timeouts apply. A tool stopped at its limit may
have been inside a database statement: the connection is then dropped, so
what the runtime writes next goes over a new one.
"""

import contextlib
import signal
import threading

from tools.contract import ToolError


class ToolTimeout(ToolError):
    """The tool ran past its declared time limit and was stopped."""


@contextlib.contextmanager
def time_limit(seconds: float | None, tool_name: str):
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    fired = False

    def stop(signum, frame):
        nonlocal fired
        fired = True
        raise ToolTimeout(f"tool {tool_name!r} exceeded its time limit of {seconds:g}s")

    previous_handler = signal.signal(signal.SIGALRM, stop)
    previous_timer = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_timer[0]:
            # Someone else's alarm (an RQ job timeout) was pending: put it back.
            signal.setitimer(signal.ITIMER_REAL, *previous_timer)
        if fired:
            _drop_database_connection()


def _drop_database_connection() -> None:
    """The alarm may have stopped the tool inside a database statement.
    psycopg then leaves the connection mid-query (only a KeyboardInterrupt
    makes it cancel one), and every later statement on it — the step, the
    settle — would fail; closed, the next statement reconnects."""
    from django.db import DatabaseError, connection

    if connection.in_atomic_block:
        return
    try:
        connection.close()
    except DatabaseError:
        pass  # closed all the same
