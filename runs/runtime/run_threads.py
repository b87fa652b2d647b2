"""Runs in flight in threads of one process, and how they stop (G15).

``RunThreads`` is what the concurrent workers share — ``ConcurrentWorker``
(RQ) and the embedded default's worker: at most ``limit`` threads at once,
each executing one run, and a drain that waits for them and hands back
those still in flight when its grace is over (``heartbeat.hand_back_all``).
Threads are daemons: a run still in flight never holds its process's exit.
"""

import contextvars
import logging
import threading
import time
from collections.abc import Callable

from django.db import connections

from runs.runtime.heartbeat import hand_back_all

logger = logging.getLogger(__name__)


class RunThreads:
    def __init__(self, limit: int):
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit)
        self._lock = threading.Lock()
        self._threads: dict[threading.Thread, object] = {}
        #: When a drain under way hands back what is still in flight (monotonic).
        self._drain_deadline: float | None = None

    def take_slot(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a free slot; True if taken.
        A slot taken is given back by ``start``'s thread, or ``give_back``."""
        return self._slots.acquire(timeout=timeout)

    def give_back(self) -> None:
        """Give back a slot taken for work that did not start."""
        self._slots.release()

    def start(self, work: Callable[[], None], *, name: str, tag: object = None) -> None:
        """Run ``work`` in a thread of its own, in the slot taken for it, in a
        copy of the caller's context (context variables included). ``tag``
        is kept with it (``tags``)."""
        context = contextvars.copy_context()
        thread = threading.Thread(target=self._run, args=(context, work), name=name, daemon=True)
        with self._lock:
            self._threads[thread] = tag
        thread.start()

    def _run(self, context: contextvars.Context, work: Callable[[], None]) -> None:
        try:
            context.run(work)
        except Exception:
            logger.exception("a run's thread failed outside its run")
        finally:
            # The thread's own connection goes with it (back to the pool).
            connections.close_all()
            with self._lock:
                self._threads.pop(threading.current_thread(), None)
            self._slots.release()

    def count(self) -> int:
        with self._lock:
            return len(self._threads)

    def tags(self) -> list:
        with self._lock:
            return list(self._threads.values())

    def shorten(self, grace: float) -> None:
        """A stop asked for during an unbounded drain: it hands back what is
        still in flight ``grace`` seconds from now (an earlier end stays)."""
        deadline = time.monotonic() + grace
        if self._drain_deadline is None or deadline < self._drain_deadline:
            self._drain_deadline = deadline

    def drain(
        self, grace: float | None, *, while_waiting: Callable[[], None] = lambda: None
    ) -> int:
        """Wait for the threads in flight — until they end (``grace`` None)
        or for ``grace`` seconds — calling ``while_waiting`` about every
        second; then hand back the runs still in flight (they settle
        nothing, the reaper decides them). Returns how many were handed back.
        A signal that interrupts the wait (a second SIGTERM or SIGINT) hands
        them back at once and is raised on."""
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
                with self._lock:
                    threads = list(self._threads)
                if not threads:
                    return 0
                deadline = self._drain_deadline
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                wait = 1 if left is None else min(1, left)
                # A signal may have come between a thread's registration and
                # its start: an unstarted thread cannot be joined yet.
                started = [thread for thread in threads if thread.ident is not None]
                if started:
                    started[0].join(timeout=wait)
                else:
                    time.sleep(min(wait, 0.05))
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
