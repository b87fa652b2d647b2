"""Runs in flight in threads of one process, and how they stop (G15).

``RunThreads`` is what the concurrent workers share — ``ConcurrentWorker``
(RQ) and the embedded default's worker: at most ``limit`` runs at once, each
in a thread, and a drain that waits for them and hands back those still in
flight when its grace is over (``heartbeat.hand_back_all``).

A thread stays once its run ends and serves the next one: starting a
thread makes its starter wait for the new thread to take the GIL, a few
milliseconds each when a hundred runs keep it busy, and the worker's one
dequeuing thread would wait that long for every run it starts. Threads are
made as runs need them (never more than ``limit``: a thread waits for work
before its run's slot is given back) and are daemons: a run still in
flight never holds its process's exit. Each run ends with its thread's
database connections closed (back to the pool), so no run sees another's.

A process that keeps its runs in threads lets a thread hold the GIL
``SWITCH_INTERVAL_SECONDS`` while others wait for it, not CPython's 5 ms
(``set_the_gil_switch_interval``, called as a concurrent worker's
process starts; a test process that makes ``RunThreads`` keeps its own). A
thread waiting for the GIL wakes every interval to ask for it again: with
the default, a thousand runs whose answers came together (a generation of
runs that started together, or a host short of CPU) each slept and woke
again every 5 ms, 250–594 times a run against 53–56 with 100 ms
(``tests/test_model_connections.py``). Two workers at 4,000 runs in flight
collapsed under it: 65–71% of their CPU in the kernel, 47–96 ms a run
against 15 ms at 200 in flight, and 0.16–0.31 of the ideal rate; with 100
ms, 16.6 ms a run (27% the kernel's) and 0.70, which is what the host's CPU
allows (``bench/results.md``). A run's thread gives the GIL up by itself at
each wait, every few milliseconds, so the interval matters only while runs
compute: each then holds the GIL up to 100 ms at a stretch, and a run
waiting for it may wait out several such stretches (C code that holds the
GIL is bound by none). The worker's start line says the interval.
"""

import contextvars
import itertools
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable

from django.db import connections

from runs.runtime.heartbeat import hand_back_all

logger = logging.getLogger(__name__)

#: The name of a thread waiting for its next run.
IDLE_NAME = "run-thread-idle"

#: How long a thread may hold the GIL while others wait for it (CPython's
#: default: 5 ms). At 4,000 runs in flight on 2 processes, 100 runs a second
#: asked of a host that had the CPU for about 70 (``bench/steady_state.py``):
#: 5 ms collapsed (0.31 of the ideal, 47 ms a run); 20 ms, 100 ms and
#: 500 ms gave 0.64, 0.70 and 0.60 at 18.1, 16.6 and 19.5 ms, one round
#: each (the host's drift between rounds is as large as their spread).
SWITCH_INTERVAL_SECONDS = 0.1


def set_the_gil_switch_interval() -> None:
    """For a process whose runs are threads: ``SWITCH_INTERVAL_SECONDS``
    (or a longer interval already set)."""
    sys.setswitchinterval(max(sys.getswitchinterval(), SWITCH_INTERVAL_SECONDS))


class RunThreads:
    def __init__(self, limit: int):
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit)
        self._lock = threading.Lock()
        #: Notified whenever a run ends (``drain`` waits on it).
        self._ended = threading.Condition(self._lock)
        #: Runs in flight: their key → their tag.
        self._in_flight: dict[int, object] = {}
        self._keys = itertools.count()
        #: Runs started and not yet taken by a thread.
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        #: Threads waiting for a run, less the runs already promised to them.
        self._idle_threads = 0
        self.threads_made = 0
        #: When a drain under way hands back what is still in flight (monotonic).
        self._drain_deadline: float | None = None

    def take_slot(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a free slot; True if taken.
        A slot taken is given back when its run ends, or by ``give_back``."""
        return self._slots.acquire(timeout=timeout)

    def take_free_slots(self) -> int:
        """Take every slot free now, without waiting; returns how many."""
        taken = 0
        while self._slots.acquire(blocking=False):
            taken += 1
        return taken

    def give_back(self, slots: int = 1) -> None:
        """Give back slots taken for work that did not start."""
        if slots:
            self._slots.release(slots)

    def start(self, work: Callable[[], None], *, name: str, tag: object = None) -> None:
        """Run ``work`` in a thread, in the slot taken for it, in a copy of
        the caller's context (context variables included), under the thread
        name ``name``. ``tag`` is kept with it while it runs (``tags``)."""
        context = contextvars.copy_context()
        with self._lock:
            key = next(self._keys)
            self._in_flight[key] = tag
            idle = self._idle_threads > 0
            if idle:
                self._idle_threads -= 1
            else:
                self.threads_made += 1
        self._work.put((key, name, context, work))
        if idle:
            return
        try:
            threading.Thread(target=self._serve, name=name, daemon=True).start()
        except RuntimeError:
            # No thread to be had (the process is out of them): the run
            # waits in the queue for the next thread that frees, which is
            # owed to it rather than to a run started later.
            with self._lock:
                self.threads_made -= 1
                self._idle_threads -= 1
            logger.error("no thread could be started: run %s waits for one to free", name)

    def _serve(self) -> None:
        """A thread's life: one run after another, as they come."""
        me = threading.current_thread()
        while True:
            key, me.name, context, work = self._work.get()
            try:
                context.run(work)
            except BaseException:
                # Even SystemExit from a tool: the thread serves on, or the
                # next run promised to it would wait for a thread gone.
                logger.exception("a run's thread failed outside its run")
            finally:
                # The run's connections go with it (back to the pool).
                connections.close_all()
                me.name = IDLE_NAME
                # Counted idle before its slot is free: the run started in
                # that slot is this thread's, never a new thread's.
                with self._lock:
                    del self._in_flight[key]
                    self._idle_threads += 1
                    self._ended.notify_all()
                self._slots.release()

    def count(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def tags(self) -> list:
        with self._lock:
            return list(self._in_flight.values())

    def shorten(self, grace: float) -> None:
        """A stop asked for during an unbounded drain: it hands back what is
        still in flight ``grace`` seconds from now (an earlier end stays)."""
        deadline = time.monotonic() + grace
        if self._drain_deadline is None or deadline < self._drain_deadline:
            self._drain_deadline = deadline

    def drain(
        self, grace: float | None, *, while_waiting: Callable[[], None] = lambda: None
    ) -> int:
        """Wait for the runs in flight — until they end (``grace`` None) or
        for ``grace`` seconds — calling ``while_waiting`` about every second;
        then hand back the runs still in flight (they settle nothing, the
        reaper decides them). Returns how many were handed back. A signal
        that interrupts the wait (a second SIGTERM or SIGINT) hands them
        back at once and is raised on."""
        self._drain_deadline = None if grace is None else time.monotonic() + grace
        in_flight = self.count()
        if in_flight:
            logger.info(
                "draining %d run(s) in flight%s",
                in_flight,
                "" if grace is None else f" for up to {grace:g}s",
            )
        try:
            while True:
                deadline = self._drain_deadline
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                with self._ended:
                    if not self._in_flight:
                        return 0
                    self._ended.wait(timeout=1 if left is None else min(1, left))
                try:
                    while_waiting()
                except Exception:
                    logger.warning("while draining", exc_info=True)
        except BaseException:
            logger.warning("stopped again while draining; handing the runs in flight back now")
            hand_back_all()
            raise
        handed = hand_back_all()
        logger.warning("the drain's grace is over: %d run(s) handed back to the reaper", handed)
        return handed
