"""Stopping a tool at its time limit (``call_within``).

A tool may declare ``timeout_seconds`` (the runtime gives one that declares
none a default). The runtime's heartbeat keeps the lease through the call up
to that limit plus a margin, and the agent loop stops counting on the tool
at the limit:

- In a process's main thread (an RQ work horse, a management command) the
  tool is interrupted with SIGALRM (``time_limit``). A tool stopped at its
  limit may have been inside a database statement: the connection is then
  dropped, so what the runtime writes next goes over a new one.
- In any other thread (``runs.worker.ConcurrentWorker``'s runs, a web
  server's request) no signal can reach it, so the tool runs in a thread of
  its own and the run waits for it up to the limit. Past it, the run goes on
  without it (``ToolTimeout``) and the tool's thread is abandoned: it cannot
  hold the run, the worker's other runs or its exit (a daemon thread), and
  what it returns late goes to ``on_late`` — the runtime records a write's.
  Such threads are kept between calls (``_ToolThreads``); one abandoned
  serves again once its call ends.
"""

import contextlib
import contextvars
import logging
import os
import queue
import signal
import threading
from collections.abc import Callable
from typing import Any

from tools.contract import ToolError

logger = logging.getLogger(__name__)


def time_limit_of(tool) -> float:
    """The tool's own time limit, or ``NRLLM_TOOL_TIME_LIMIT_SECONDS`` for
    one that declares none: no call runs unbounded."""
    from django.conf import settings

    return tool.time_limit() or settings.NRLLM_TOOL_TIME_LIMIT_SECONDS


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


def call_within(
    seconds: float | None,
    tool_name: str,
    call: Callable[[], Any],
    *,
    on_late: Callable[[Any, BaseException | None], None] | None = None,
) -> Any:
    """``call()``, stopped counting on at ``seconds``: raises ``ToolTimeout``
    then. Off the main thread, a call still running at its limit is left to
    finish in its own thread, and ``on_late(result, error)`` hears how."""
    if not seconds or threading.current_thread() is threading.main_thread():
        with time_limit(seconds, tool_name):
            return call()
    return _AbandonableCall(tool_name, call, on_late).wait(seconds)


class _AbandonableCall:
    def __init__(self, tool_name: str, call: Callable[[], Any], on_late):
        self.tool_name, self.call, self.on_late = tool_name, call, on_late
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.abandoned = False
        self.result: Any = None
        self.error: BaseException | None = None

    def wait(self, seconds: float) -> Any:
        _tool_threads.start(self._run, name=f"tool-{self.tool_name}")
        if not self.done.wait(seconds):
            with self.lock:
                # Decided under the lock: the call either finished just now
                # (its result counts) or its finish will go to on_late.
                self.abandoned = not self.done.is_set()
            if self.abandoned:
                raise ToolTimeout(
                    f"tool {self.tool_name!r} exceeded its time limit of {seconds:g}s"
                )
        if self.error is not None:
            raise self.error
        return self.result

    def _run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as error:  # handed to the waiting run, as raised
            self.error = error
        finally:
            _close_thread_connections()
            with self.lock:
                self.done.set()
                late = self.abandoned
        if late and self.on_late is not None:
            try:
                self.on_late(self.result, self.error)
            except Exception:
                logger.exception("tool %s: its late outcome could not be kept", self.tool_name)
            finally:
                # Keeping it took a connection of this thread's: back to the pool.
                _close_thread_connections()


def _close_thread_connections() -> None:
    """A tool that used the database did so over this thread's own
    connection: it goes with the thread (back to the pool, if one)."""
    from django.db import connections

    connections.close_all()


class _ToolThreads:
    """Threads that run tool calls off a run's thread, kept between calls.

    Starting a thread makes its starter wait for the new thread to take the
    GIL, milliseconds when many runs keep it busy: with a thread started
    per call, that was a tenth of a concurrent worker's CPU at 2,000 runs in
    flight. A thread serves one call at a time, each in a context of its
    own (empty, as a new thread's), and waits for the next; made only when
    none waits, so there are never more than the calls in flight at once
    (those abandoned past their limit included). Daemons: a call still
    running never holds its process's exit.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        #: Threads waiting for a call, less the calls already promised to them.
        self._idle = 0

    def start(self, call: Callable[[], None], *, name: str) -> None:
        """Run ``call`` in a waiting thread, or in a new one. Raises as
        ``Thread.start`` does when no thread can be had; the call is then
        never run (a new thread is handed its call, nothing is queued)."""
        with self._lock:
            idle = self._idle > 0
            if idle:
                self._idle -= 1
        if idle:
            # Counted idle only once it waits on the queue: it takes this.
            self._work.put((name, call))
            return
        # Handed its call in a list it empties: the thread object keeps its
        # arguments for as long as it serves.
        handed = [(name, call)]
        threading.Thread(target=self._serve, args=(handed,), name=name, daemon=True).start()

    def _serve(self, handed: list) -> None:
        me = threading.current_thread()
        name, call = handed.pop()
        while True:
            me.name = name
            try:
                # A fresh context: nothing of the last call's is left in it.
                contextvars.Context().run(call)
            except BaseException:
                # ``_AbandonableCall._run`` keeps a call's own error for its
                # run; this thread serves on whatever else went wrong.
                logger.exception("a tool's thread failed outside its call")
            # Nothing of the call outlives it here: its result, arguments
            # and error (with the run's frames) go with the run.
            call = None
            me.name = IDLE_NAME
            with self._lock:
                self._idle += 1
            name, call = self._work.get()


#: The name of a tool thread waiting for its next call.
IDLE_NAME = "tool-idle"

_tool_threads = _ToolThreads()


def _after_fork_in_child() -> None:
    # The parent's threads are not the child's: a child counting them idle
    # would hand its calls to nobody.
    global _tool_threads
    _tool_threads = _ToolThreads()


os.register_at_fork(after_in_child=_after_fork_in_child)
