"""The lease kept alive in the background while an attempt is in flight (G16).

A lease is short (``NRLLM_LEASE_SECONDS``, 30 s as shipped), so that a worker
that dies is noticed in about a lease. An attempt that lives on renews it at
every step, and between steps — a model call, a tool — one keeper thread per
process wakes every third of a lease and renews, in one statement, each
attempt's lease that has less than two thirds left. A record whose commit
waited for the flush tells its heartbeat how long the lease runs at least
(``Heartbeat.renewed``), and the keeper leaves that lease out until it is
due; one that did not wait is not counted on (a server crash may lose it,
G12), so the statement's own guard decides.

The keeper never carries a lease past the deadline of what the attempt is
doing now (``Heartbeat.until``): a model call's own timeout, a tool's time
limit, each plus ``NRLLM_OPERATION_MARGIN_SECONDS``; a wait for a shared
rate limit (``rate_limit``), its bound plus a lease; between operations, a
lease. A call stuck past its deadline lets its lease lapse, and the reaper
takes the run, whatever the worker still does: its late records are refused
(the fence, G5). A renewal changes nothing the worker counts on, so a
failed one is only logged; a lease lost is found by the attempt's next record.

A worker that stops with attempts still in flight hands them back
(``hand_back_all``): each attempt stops at its next step boundary, settling
nothing, and its lease lapses at once for the reaper.
"""

import logging
import os
import threading
import time

from django.db import DatabaseError

from runs import transitions
from runs.transitions import Lease

logger = logging.getLogger(__name__)

#: The keeper wakes at most this often, however short a lease a test sets.
_SHORTEST_TICK_SECONDS = 0.2


class Heartbeat:
    """One attempt's: its lease, how far a renewal carries it, and the
    deadline of what the attempt is doing now."""

    def __init__(self, lease: Lease, lease_seconds: float, operation_margin: float = 0):
        self.lease = lease
        self.lease_seconds = lease_seconds
        self.operation_margin = operation_margin
        self._deadline = time.monotonic() + lease_seconds
        #: The lease runs at least until then (monotonic), as the attempt's
        #: own last record renewed it: the keeper sends nothing for it
        #: before it is due (``due``).
        self._lease_at_least_until = float("-inf")
        #: Set when the worker handed the attempt back: it stops at its next
        #: step boundary and settles nothing.
        self.handed_back = False

    def until(self, seconds: float) -> None:
        """What the attempt does now may take ``seconds`` more: the keeper
        renews the lease up to then, and no further."""
        self._deadline = time.monotonic() + seconds

    def starting(self) -> None:
        """The attempt's start: loading its tools may ask MCP servers for
        their listings (each bounded by its connect timeout): a lease and the
        margin."""
        self.until(self.lease_seconds + self.operation_margin)

    def between_operations(self) -> None:
        """Nothing is in flight but the runtime's own statements: a lease."""
        self.until(self.lease_seconds)

    def model_call(self, call_seconds: float | None) -> None:
        """A model call bounded by its client's timeouts (``call_seconds``;
        None: unbounded, so a lease), plus the margin."""
        self.until((call_seconds or self.lease_seconds) + self.operation_margin)

    def tool_call(self, time_limit: float) -> None:
        """A tool call stopped counting on at ``time_limit``, plus the margin."""
        self.until(time_limit + self.operation_margin)

    def renewed(self, seconds: float, sent_at: float) -> None:
        """A record of the attempt, sent at ``sent_at`` (monotonic), renewed
        its lease for ``seconds``: by the database's clock from a moment no
        earlier, so the lease runs at least until ``sent_at + seconds``."""
        self._lease_at_least_until = sent_at + seconds

    def due(self, when_left: float) -> bool:
        """Whether the lease may have less than ``when_left`` left: a lease
        the attempt's records renew often never is, and costs the keeper no
        statement (the statement's own guard decides the rest)."""
        return self._lease_at_least_until - time.monotonic() < when_left

    def renewal_seconds(self) -> float:
        """How long the next renewal carries the lease: a lease, or what is
        left before the deadline; 0 or less once it has passed."""
        return min(self.lease_seconds, self._deadline - time.monotonic())


class _Keeper:
    """The process's keeper thread and the heartbeats it keeps."""

    def __init__(self):
        self.lock = threading.Lock()
        #: Held while the keeper renews, and by a hand-back.
        self.renewing = threading.Lock()
        self.beats: set[Heartbeat] = set()
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        #: Seconds between the keeper's passes: a third of the shortest lease.
        self.tick = 10.0
        self.pid = os.getpid()

    def add(self, beat: Heartbeat) -> None:
        with self.lock:
            self._after_fork()
            self.beats.add(beat)
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._keep, name="nrllm-heartbeat", daemon=True
                )
                self.thread.start()
            elif beat.lease_seconds / 3 < self.tick:
                self.wake.set()  # a shorter lease than those kept so far: tick now

    def remove(self, beat: Heartbeat) -> None:
        with self.lock:
            self.beats.discard(beat)

    def in_flight(self) -> list[Heartbeat]:
        with self.lock:
            return list(self.beats)

    def _after_fork(self) -> None:
        # A work horse forked from a process that kept leases inherits the
        # set but not the thread: it keeps its own attempts only.
        if self.pid != os.getpid():
            self.pid, self.beats, self.thread = os.getpid(), set(), None

    def _keep(self) -> None:
        while True:
            beats = self.in_flight()
            self.tick = min((beat.lease_seconds for beat in beats), default=30) / 3
            self.wake.wait(max(self.tick, _SHORTEST_TICK_SECONDS))
            self.wake.clear()
            if self.in_flight():
                self.renew_due()
                # Not held between ticks: a worker's connections serve runs
                # (and a pool, DATABASE_POOL_MAX_SIZE, gets this one back).
                transitions.recover_connection(discard=True)

    def renew_due(self) -> int:
        """One pass: renew, in one statement, the lease of every attempt in
        flight that has less than two ticks left, each up to its own
        operation's deadline; one past it, or handed back, lapses. Returns
        how many were renewed; a failure is logged and counts none."""
        beats = self.in_flight()
        # Less than two ticks left: a lease a record renewed since is left
        # alone, one about to lapse is not.
        when_left = 2 * self.tick
        # Under the lock a hand-back takes: no renewal lands after it.
        with self.renewing:
            renewals = [
                (beat.lease, seconds)
                for beat in beats
                if not beat.handed_back
                and (seconds := beat.renewal_seconds()) > 0
                and beat.due(min(when_left, seconds))
            ]
            if not renewals:
                return 0
            try:
                return transitions.keep_leases(renewals, when_left=when_left)
            except Exception:
                # Whatever it was (the database away, a connection refused),
                # the keeper lives on: its thread keeps every lease of the
                # process. One line for the pass: the others failed with it.
                logger.warning(
                    "heartbeat of %d runs failed (run=%s first); trying again next tick",
                    len(renewals),
                    renewals[0][0].run_id,
                )
                transitions.recover_connection(discard=True)
                return 0


_keeper = _Keeper()


class kept:
    """``with kept(lease, lease_seconds) as beat``: the lease is renewed in
    the background while the block runs."""

    def __init__(self, lease: Lease, lease_seconds: float, operation_margin: float = 0):
        self.beat = Heartbeat(lease, lease_seconds, operation_margin)

    def __enter__(self) -> Heartbeat:
        _keeper.add(self.beat)
        return self.beat

    def __exit__(self, *exc_info) -> None:
        _keeper.remove(self.beat)


def hand_back_all() -> int:
    """Hand back every attempt in flight in this process (a worker stopping
    past its drain's grace): each stops at its next step boundary, and its
    lease lapses now for the reaper. Returns how many were handed back."""
    handed = 0
    with _keeper.renewing:
        beats = _keeper.in_flight()
        for beat in beats:
            beat.handed_back = True
    for beat in beats:
        try:
            if transitions.hand_back(beat.lease):
                handed += 1
                logger.warning("run=%s handed back for the reaper", beat.lease.run_id)
        except DatabaseError:
            # The database is away: the others' leases lapse too, unrenewed.
            logger.exception("run=%s could not be handed back; its lease lapses", beat.lease.run_id)
            break
    return handed


def in_flight() -> int:
    """How many attempts this process has in flight."""
    return len(_keeper.in_flight())
