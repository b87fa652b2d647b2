"""What one attempt has recorded, and what it still owes the journal (G2, G12).

``StepLedger`` writes an attempt's steps, in order, through the guarded
record transitions, and keeps what a failure leaves behind:

- steps the database refused (fail-soft reads and model turns), written
  ahead of the next record, so the journal never has a gap;
- a record whose connection broke before the database answered: in doubt
  until the database says how many steps the attempt holds, so no step is
  recorded twice;
- steps recorded by commits that did not wait for the WAL flush, which a
  server crash may lose: written again when the database holds fewer;
- the writes whose records landed: a database that later holds fewer lost
  a write's record (``WriteNotDurable``).

Each record carries the lease renewal and fence of the call after it
(``NextCall``); a record in doubt that turns out to have landed while a
cancel is pending withdraws the fence it stamped for a call that never
started (``withdraw_unstarted_fence``). The run's park for approval writes
the unwritten steps too (``park``, G14). A write that returned after its
run stopped counting on it is recorded apart (``record_late_result``, G15).
The agent loop's observer (``runs.runtime.execution``) decides what a failed
record means for the run.
"""

import json
import logging
import time

from django.conf import settings
from django.db import DatabaseError

from runs import transitions
from runs.models import metrics
from runs.models.vocabulary import RunStatus, StepKind
from runs.runtime.errors import LeaseLost, RunCancelled, StepsNotDurable, WriteNotDurable
from runs.transitions import Lease, NextCall, ParkOutcome, RecordOutcome
from spend.recording import turns_spend
from tools.canonical import as_journaled, storable_text

logger = logging.getLogger(__name__)

#: At most this many steps recorded without the flush are kept to write again
#: after a server crash; the record after them waits for the flush.
UNFLUSHED_STEPS_KEPT = 32


class StepLedger:
    def __init__(self, lease: Lease, recorded: int = 0):
        self.lease = lease
        #: Told ``(seconds, sent_at)`` when a record renewed the lease
        #: (``Heartbeat.renewed``); None: nobody keeps count.
        self.renewed = None
        #: Steps this attempt has recorded (the claim's request step included).
        self.recorded = recorded
        #: The most it ever had: a server crash that lost steps lowers
        #: ``recorded`` until they are written again.
        self.most_recorded = recorded
        #: A record's connection broke before the database answered, and the
        #: database could not yet be asked whether the first ``doubtful``
        #: unwritten steps — the ones that record carried — landed.
        self.in_doubt = False
        self.doubtful = 0
        #: Steps recorded by commits that did not wait for the WAL flush
        #: since the last one that did, in order: what a server crash may
        #: lose (G12). Each record is guarded on how many steps the attempt
        #: has recorded; when the database holds fewer, these are written
        #: again (``restore_lost_steps``).
        self.unflushed: list[dict] = []
        #: Steps the database refused (fail-soft: reads, model turns), in
        #: order: written ahead of the next step that is recorded, so the
        #: journal never has a gap a later attempt would fill differently,
        #: and no write starts while one is left (G12).
        self.unwritten: list[dict] = []
        #: The writes this attempt ran whose records landed, each with the
        #: count of the attempt's steps once it had: a database that later
        #: holds fewer lost a write's record (G12's premise broken: a
        #: failover, a server not honouring the flush) — ``WriteNotDurable``.
        self.recorded_writes: list[tuple[int, dict]] = []
        #: How many steps at the head of ``unwritten`` the metrics counted
        #: already: recorded once, lost by the database, written again.
        self.counted_ahead = 0
        #: The attempt's spend as the database last said it (G17), refreshed
        #: by every record; None: nobody checks a budget (``budget_watch``).
        self.tally = None
        #: The model the run's turns are priced as (``provider/model``), for
        #: the token and cost metrics.
        self.model = ""

    def hold_in_doubt(self, steps: list[dict]) -> None:
        """A record carrying ``steps`` (the unwritten ones first) may have
        committed unheard: they stay unwritten until ``resolve_doubt``."""
        self.unwritten, self.in_doubt, self.doubtful = steps, True, len(steps)

    def leave_unwritten(self, steps: list[dict]) -> None:
        """``steps`` were not recorded: they go, in order, ahead of the next
        record."""
        self.unwritten = steps

    def recorded_write(self, write: dict) -> None:
        """The executed ``write``'s record has just landed."""
        self.recorded_writes.append((self.recorded, write))

    def record(
        self,
        steps: list[dict],
        lease_seconds: float,
        next_call: NextCall | None,
        *,
        clear_fence: bool = False,
    ) -> RecordOutcome | None:
        """Record the unwritten steps and then ``steps``, all or none; raise
        ``RunCancelled`` when they were recorded and a cancel is pending. On
        ``FAILED`` every one of them is left unwritten, in order; None when
        nothing was left to record (then nothing was renewed either: a
        statement carrying no step could not be told apart, in doubt, from
        one that never arrived).

        A record whose connection broke may have committed: before anything
        is written again the database is asked how many steps this attempt
        has, so a step is never recorded twice (G12). A record finding that
        the database lost some (a server crash, G12) writes them again first."""
        if self.in_doubt and not self.resolve_doubt():
            self.unwritten.extend(steps)  # the database is still away
            return RecordOutcome.FAILED
        new, steps = steps, [*self.unwritten, *steps]
        if not steps:
            return None
        outcome, waited = self._record_now(steps, lease_seconds, next_call, clear_fence)
        if outcome is RecordOutcome.STEPS_LOST:
            self.unwritten = steps[: len(steps) - len(new)]
            self.restore_lost_steps()
            steps = [*self.unwritten, *new]
            outcome, waited = self._record_now(steps, lease_seconds, next_call, clear_fence)
            if outcome is RecordOutcome.STEPS_LOST:
                raise StepsNotDurable("the run's steps were lost again while they were rewritten")
        if outcome is RecordOutcome.LEASE_LOST:
            return outcome
        if outcome in (RecordOutcome.FAILED, RecordOutcome.UNKNOWN):
            if outcome is RecordOutcome.FAILED:
                self.unwritten = steps
                return outcome
            self.hold_in_doubt(steps)
            if not self.resolve_doubt() or self.unwritten:
                return RecordOutcome.FAILED
            # It had committed, its renewal and fence with it — under this
            # lease, unless the count was another attempt's under a token
            # handed out again (a claim a server crash lost); whether a
            # cancel is pending is the database's to say.
            owned, cancel_pending = transitions.standing(self.lease)
            if not owned:
                raise LeaseLost()
            if cancel_pending:
                cancelled = RunCancelled()
                if next_call is not None and next_call.fence:
                    key = next_call.call["idempotency_key"]
                    if not withdraw_unstarted_fence(self.lease, key):
                        cancelled.unstarted_call = key
                raise cancelled
            return RecordOutcome.PERSISTED
        # A commit that waits for the flush carries every earlier one to
        # disk; until then, what a server crash could lose is kept.
        self.unflushed = [] if waited else [*self.unflushed, *steps]
        self.landed(steps)
        if outcome is RecordOutcome.PERSISTED_CANCEL_REQUESTED:
            raise RunCancelled()
        return outcome

    def _record_now(
        self, steps, lease_seconds, next_call, clear_fence
    ) -> tuple[RecordOutcome, bool]:
        """``transitions.record_steps`` under this attempt's count, and whether
        its commit waited for the flush. What the attempt keeps to write again
        is bounded: past that, a record waits, and it is all on disk."""
        waits = len(self.unflushed) >= UNFLUSHED_STEPS_KEPT or not transitions.skips_the_flush(
            steps, clear_fence=clear_fence, next_call=next_call
        )
        sent_at = time.monotonic()
        with metrics.STEP_RECORD_SECONDS.time():
            outcome = transitions.record_steps(
                self.lease,
                lease_seconds,
                steps,
                clear_fence=clear_fence,
                next_call=next_call,
                recorded=self.recorded,
                wait_for_flush=waits,
                tally=self.tally,
            )
        # Only a commit that waited for the flush: a server crash may lose
        # one that did not (G12), and with it the renewal the keeper would
        # count on, leaving the lease where an earlier statement put it.
        if outcome.persisted and waits and self.renewed is not None:
            self.renewed(lease_seconds, sent_at)
        return outcome, waits

    def restore_lost_steps(self, count: int | None = None) -> None:
        """The database holds ``count`` of this attempt's steps, fewer than it
        recorded: a server crash lost its latest records, which had not
        waited for the flush (G12). They go again, in order, ahead of the
        unwritten ones, so the journal has no gap. Raises ``StepsNotDurable``
        when that cannot be done: the retry resumes after the last step
        that is there."""
        if count is None:
            try:
                count = transitions.attempt_step_count(self.lease)
            except DatabaseError:
                raise StepsNotDurable(
                    "the database lost steps of the run and cannot say how many yet"
                ) from None
        lost = self.recorded - count
        for recorded_with, write in self.recorded_writes:
            if recorded_with > count:
                raise WriteNotDurable(
                    f"the database lost the record of the {write['effect']} tool "
                    f"{write['tool']!r} that this attempt executed, a commit that had "
                    "waited for the flush",
                    write=write,
                )
        if not 0 < lost <= len(self.unflushed):
            raise StepsNotDurable(
                f"{lost} recorded step(s) of the attempt were lost by the database "
                "and cannot be written again"
            )
        logger.warning(
            "run=%s lease_token=%s: %d recorded step(s) lost by the database; writing them again",
            self.lease.run_id,
            self.lease.token,
            lost,
        )
        kept = len(self.unflushed) - lost
        self.unwritten = [*self.unflushed[kept:], *self.unwritten]
        self.counted_ahead += lost
        del self.unflushed[kept:]
        self.recorded = count

    def resolve_doubt(self) -> bool:
        """Ask the database whether the steps the record in doubt carried
        landed after all; False if it cannot answer yet. When it holds fewer
        steps than the attempt had recorded (a server crash lost records that
        had not reached disk) those go again (``restore_lost_steps``).
        Raises ``LeaseLost`` when it holds more than either answer: another
        attempt holds this token.

        (Should the statement in doubt still be running in a backend that
        outlived its client and commit after this count, its steps would be
        in the journal twice; ``read_journal`` refuses such a journal rather
        than replay it.)"""
        try:
            count = transitions.attempt_step_count(self.lease)
        except DatabaseError:
            logger.warning("run=%s cannot tell yet whether its steps landed", self.lease.run_id)
            return False
        self.in_doubt = False
        if count == self.recorded + self.doubtful:
            logger.warning(
                "run=%s lease_token=%s: %d step(s) landed although the database did not say so",
                self.lease.run_id,
                self.lease.token,
                self.doubtful,
            )
            landed, self.unwritten = (
                self.unwritten[: self.doubtful],
                self.unwritten[self.doubtful :],
            )
            self._count(landed)
            if self.tally is not None:
                # Their statement's answer, the run's totals with them, was lost.
                self.tally.landed_unheard(turns_spend(landed))
            self.recorded += len(landed)
            self.most_recorded = max(self.most_recorded, self.recorded)
            # Whether their commit waited for the flush is not known here:
            # they count as what a crash may still lose (an entry too many
            # at the head is harmless: a restore takes the tail).
            self.unflushed.extend(landed)
        elif count < self.recorded:
            self.restore_lost_steps(count)
        elif count != self.recorded:
            raise LeaseLost()
        return True

    def landed(self, steps: list[dict]) -> None:
        """``steps``, the unwritten ones first, have been recorded."""
        self._count(steps)
        self.recorded += len(steps)
        self.most_recorded = max(self.most_recorded, self.recorded)
        self.unwritten = []

    def _count(self, steps: list[dict]) -> None:
        """Count ``steps`` (the unwritten ones first) in the metrics, except
        those at their head that were counted when first recorded."""
        again = min(self.counted_ahead, len(steps))
        self.counted_ahead -= again
        steps = steps[again:]
        for step in steps:
            metrics.STEPS.labels(step["kind"], step["effect"] or "none").inc()
        spend = turns_spend(steps)
        if spend:
            metrics.count_spend(self.model, spend)

    def park(
        self,
        waiting: list,
        turn_sequence: int | None,
        turn: list[dict],
        *,
        status: str = RunStatus.WAITING_FOR_APPROVAL,
        timeout_seconds: float | None = None,
    ) -> list:
        """Write the unwritten steps and ``turn`` (a live turn's step, or
        none) with the run's park for approval of ``waiting`` (G14) — or,
        with ``status`` ``waiting_for_input``, for a person's answer or a
        completion (G24) — in one transaction; returns the requests. Raises
        as a record would when it cannot: ``StepsNotDurable``,
        ``LeaseLost``, ``RunCancelled``."""
        if self.in_doubt and not self.resolve_doubt():
            raise StepsNotDurable(
                "the run cannot wait for approval while it cannot tell whether its "
                "earlier steps were recorded"
            )
        for _ in range(2):  # again after the database had lost steps that go again first
            steps = [*self.unwritten, *turn]
            outcome, requests = transitions.park(
                self.lease,
                steps,
                waiting,
                status=status,
                turn_sequence=turn_sequence,
                timeout_seconds=timeout_seconds or settings.NRLLM_APPROVAL_TIMEOUT_SECONDS,
                recorded=self.recorded,
                settle_reservations=self.tally is not None and self.tally.reserving,
            )
            if outcome is not ParkOutcome.STEPS_LOST:
                break
            self.restore_lost_steps()
        if outcome is ParkOutcome.STEPS_LOST:
            raise StepsNotDurable("the run's steps were lost again before it could wait")
        if outcome is ParkOutcome.LEASE_LOST:
            raise LeaseLost()
        if outcome is ParkOutcome.CANCEL_REQUESTED:
            raise RunCancelled()
        self.landed(steps)
        return requests


def withdraw_unstarted_fence(lease: Lease, key: str) -> bool:
    """``transitions.withdraw_fence`` for a call that did not start, never
    raising; False if the database could not be asked (the fence stays: a
    write in doubt an operator reconciles, the safe side). Used wherever an
    attempt stops before a call whose fence a record stamped."""
    try:
        transitions.withdraw_fence(lease, key)
    except DatabaseError:
        logger.warning("run=%s fence of a call that did not start left up", lease.run_id)
        return False
    return True


def record_late_result(lease: Lease, step: dict, result, error: str) -> None:
    """Record what a write returned after its run stopped counting on it
    (a ``late_result`` step, G15), never raising: the run has moved on, and
    the step is an operator's evidence, not the journal's."""
    logger.warning(
        "run=%s %s (idempotency key %s) returned after its time limit",
        lease.run_id,
        step["tool_name"],
        step["idempotency_key"],
    )
    try:
        result = as_journaled(result)
        json.dumps(result)
    except (TypeError, ValueError):
        result = storable_text(repr(result))
    late = {
        **step,
        "kind": StepKind.LATE_RESULT,
        "result": None if error else result,
        "error": error,
    }
    try:
        transitions.record_late_write(lease, late)
    except DatabaseError:
        logger.exception("run=%s late result of %s not recorded", lease.run_id, step["tool_name"])
