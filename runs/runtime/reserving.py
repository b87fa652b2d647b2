"""An attempt's reservations before its model calls (G21): the call's
largest possible cost held against its submitter's budget in one guarded
statement (``spend.reservations``), settled by the statement that records
its turn, released when the call fails or the attempt ends.

A call that does not fit beside what is spent stops its run
(``budget_exhausted``, as G17's checks do). One that does not fit only
because other calls in flight hold the room waits for them to settle —
a reservation is the most they can cost, and what they leave over may let
it in — up to ``NRLLM_RESERVATION_WAIT_SECONDS``, then stops its run too.
"""

import logging
import random
import time

from django.conf import settings
from django.db import DatabaseError, connection

from ground.database import release_connection
from runs.models.metrics import BUDGET_REFUSALS, RESERVATION_WAITS
from runs.runtime.errors import BudgetExhausted
from spend import reservations
from spend.budgets import no_room
from spend.call_size import CallSize
from spend.starting import StartingSpend

logger = logging.getLogger(__name__)
_PERIOD = {"day": "daily", "month": "monthly"}


class CallReservations:
    def __init__(self, lease, starting: StartingSpend):
        self.lease = lease
        self.budget = starting.budget
        self.submitter = starting.submitter
        #: The submitter's ``SpendHold`` id, found at the first reservation.
        self.hold = None
        #: Whether a reservation may be outstanding (the attempt's end
        #: releases it then: one statement an attempt).
        self.made = False

    @classmethod
    def of(cls, lease, starting: StartingSpend, tally) -> "CallReservations | None":
        """The attempt's reservations, or None: no budget to keep, or not on
        PostgreSQL. ``tally``'s records then settle what is reserved."""
        if connection.vendor != "postgresql" or starting.budget is None or starting.today is None:
            return None
        tally.reserving = True
        return cls(lease, starting)

    def before_call(self, size: CallSize, still_waiting) -> None:
        """Reserve the call's largest cost (``size``), waiting while calls in
        flight hold the room (``still_waiting()`` before each pause keeps the
        lease, and raises when the attempt lost it); raise
        ``BudgetExhausted`` when it cannot fit."""
        tokens, cost = size.tokens, size.cost
        if self.hold is None:
            self.hold = reservations.hold_for(self.submitter, self.budget)
        began = time.monotonic()
        deadline = began + settings.NRLLM_RESERVATION_WAIT_SECONDS
        run_id, token = self.lease.run_id, self.lease.token
        waited = False
        while not reservations.reserve(self.hold, self.budget, run_id, token, tokens, cost):
            seen = reservations.held(self.hold, run_id, token)
            if not seen.current:
                # Its period ended: the call is the new period's.
                self.hold = reservations.hold_for(self.submitter, self.budget)
                continue
            waited = True
            # Its own reservations wait for no other call: as good as spent.
            why = no_room(self.budget, seen.spent.plus(seen.own), size.tokens, size.cost)
            if not why and time.monotonic() >= deadline:
                why = (
                    f"calls in flight held {seen.reserved.tokens} tokens and left no room "
                    f"for this call's {tokens} within {settings.NRLLM_RESERVATION_WAIT_SECONDS}s"
                )
            if why:
                BUDGET_REFUSALS.labels("model_call").inc()
                raise BudgetExhausted(
                    f"stopped before a model call: the submitter's {_PERIOD[self.budget.period]} "
                    f"budget: {why}",
                    where="submitter",
                )
            still_waiting()
            # The calls in flight need connections to settle: none is held.
            release_connection()
            time.sleep(random.uniform(0.05, 0.2))
        if waited:
            RESERVATION_WAITS.observe(time.monotonic() - began)
        self.made = True

    def release(self) -> None:
        """Release what the attempt still holds: its call failed or was
        abandoned, or the attempt ends (a settled reservation is gone)."""
        if not self.made:
            return
        try:
            reservations.release(self.lease.run_id, self.lease.token)
        except DatabaseError:
            # Its run is settled or requeued by now: the reaper releases it.
            logger.warning("run=%s reservation not released; the reaper will", self.lease.run_id)
            return
        self.made = False
