"""An attempt's reservations before its model calls (G21): the call's
largest possible cost held against its submitter's budget and its team's
(each when it has one) in one guarded statement (``spend.reservations``):
both or neither. Settled by the statement that records its turn, released
when the call fails or the attempt ends — on both.

A call that does not fit beside what is spent of either budget stops its
run (``budget_exhausted``, as G17's checks do, naming that budget). One
that does not fit only because other calls in flight hold the room waits
for them to settle — a reservation is the most they can cost, and what
they leave over may let it in — up to ``NRLLM_RESERVATION_WAIT_SECONDS``,
then stops its run too.
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
from spend.budgets import no_room, period_name
from spend.call_size import CallSize
from spend.reservations import Owner
from spend.starting import StartingSpend

logger = logging.getLogger(__name__)


class CallReservations:
    def __init__(self, lease, starting: StartingSpend):
        self.lease = lease
        #: Whose budgets each call reserves against: the submitter's, the
        #: team's, or both (then one statement reserves on both).
        self.owners = []
        if starting.budget is not None:
            self.owners.append(Owner(starting.submitter, 0, starting.budget))
        if starting.team_budget is not None:
            self.owners.append(Owner(0, starting.team, starting.team_budget))
        self.team_name = starting.team_name
        #: The owners' ``SpendHold`` ids, found at the first reservation.
        self.holds = None
        #: Whether a reservation may be outstanding (the attempt's end
        #: releases it then: one statement an attempt).
        self.made = False

    @classmethod
    def of(cls, lease, starting: StartingSpend, tally) -> "CallReservations | None":
        """The attempt's reservations, or None: no budget to keep, or not on
        PostgreSQL. ``tally``'s records then settle what is reserved."""
        if connection.vendor != "postgresql" or not starting.budgeted or starting.today is None:
            return None
        tally.reserving = True
        return cls(lease, starting)

    def before_call(self, size: CallSize, still_waiting) -> None:
        """Reserve the call's largest cost (``size``) on every budget,
        waiting while calls in flight hold the room (``still_waiting()``
        before each pause keeps the lease, and raises when the attempt lost
        it); raise ``BudgetExhausted`` when it cannot fit."""
        tokens, cost = size.tokens, size.cost
        if self.holds is None:
            self.holds = reservations.hold_for(self.owners)
        began = time.monotonic()
        deadline = began + settings.NRLLM_RESERVATION_WAIT_SECONDS
        run_id, token = self.lease.run_id, self.lease.token
        waited = False
        while not reservations.reserve(self._asked(), run_id, token, tokens, cost):
            seen = reservations.held(self.holds, run_id, token)
            if not all(hold.current for hold in seen):
                # A period ended: the call is the new period's.
                self.holds = reservations.hold_for(self.owners)
                continue
            waited = True
            for owner, hold in zip(self.owners, seen, strict=True):
                # Its own reservations wait for no other call: as good as spent.
                why = no_room(owner.budget, hold.spent.plus(hold.own), size.tokens, size.cost)
                if why:
                    self._refuse(owner, why)
            if time.monotonic() >= deadline:
                owner, hold = self._fullest(seen, size)
                self._refuse(
                    owner,
                    f"calls in flight held {hold.reserved.tokens} tokens and left no room "
                    f"for this call's {tokens} within {settings.NRLLM_RESERVATION_WAIT_SECONDS}s",
                )
            still_waiting()
            # The calls in flight need connections to settle: none is held.
            release_connection()
            time.sleep(random.uniform(0.05, 0.2))
        if waited:
            RESERVATION_WAITS.observe(time.monotonic() - began)
        self.made = True

    def _asked(self) -> list:
        return [(hold, owner.budget) for hold, owner in zip(self.holds, self.owners, strict=True)]

    def _fullest(self, seen, size: CallSize):
        """The owner whose hold left the call no room (the first that has
        none; the last if each would fit alone: they moved meanwhile)."""
        for owner, hold in zip(self.owners, seen, strict=True):
            if no_room(owner.budget, hold.spent.plus(hold.reserved), size.tokens, size.cost):
                return owner, hold
        return self.owners[-1], seen[-1]

    def _refuse(self, owner: Owner, why: str) -> None:
        BUDGET_REFUSALS.labels("model_call").inc()
        period = period_name(owner.budget.period)
        whose = f"the team {self.team_name}'s" if owner.is_team else "the submitter's"
        raise BudgetExhausted(
            f"stopped before a model call: {whose} {period} budget: {why}",
            where="team" if owner.is_team else "submitter",
        )

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
