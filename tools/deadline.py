"""Stopping a tool at its declared time limit.

A tool may declare ``timeout_seconds``. The runtime extends the lease to cover
that limit plus a margin right before the call (so a long write is not reaped
mid-call), and the agent loop stops the tool at the limit with ``time_limit``.
The stop uses SIGALRM, which only the main thread can receive — the case in
an RQ work horse and a management command; elsewhere (a web server thread)
only the tool's own I/O timeouts apply.
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

    def stop(signum, frame):
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
