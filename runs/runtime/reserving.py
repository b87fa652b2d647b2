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

from nrllm_ops.database import release_connection
from runs.metrics import BUDGET_REFUSALS, RESERVATION_WAITS
from runs.runtime.errors import BudgetExhausted
from spend import reservations
from spend.budgets import Budget, Spent
from spend.starting import StartingSpend

logger = logging.getLogger(__name__)
_PERIOD = {"day": "daily", "month": "monthly"}


class CallReservations:
    def __init__(self, lease, starting: StartingSpend):
        self.lease = lease
        self.budget = starting.budget
        self.price = starting.price
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

    def before_call(self, messages, tool_specs, max_tokens: int | None, still_waiting) -> None:
        """Reserve the call's largest cost, waiting while calls in flight hold
        the room (``still_waiting()`` before each pause keeps the lease, and
        raises when the attempt lost it); raise ``BudgetExhausted`` when it
        cannot fit."""
        completion = max_tokens or settings.NRLLM_RESERVE_MAX_TOKENS
        tokens = reservations.largest_tokens(messages, tool_specs, completion)
        cost = reservations.largest_cost(tokens - completion, completion, self.price)
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
            why = _no_room(self.budget, seen.spent.plus(seen.own), tokens, cost)
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


def _no_room(budget: Budget, spent: Spent, tokens: int, cost) -> str:
    """Why a call that may cost ``tokens`` and ``cost`` cannot fit beside
    what is ``spent`` whatever the calls in flight leave, or ""."""
    if budget.max_tokens is not None and spent.tokens + tokens > budget.max_tokens:
        return (
            f"{spent.tokens} of {budget.max_tokens} tokens spent, "
            f"and the call may cost up to {tokens}"
        )
    if budget.max_cost is not None and spent.cost + cost > budget.max_cost:
        return f"{spent.cost} of {budget.max_cost} spent, and the call may cost up to {cost}"
    return ""
