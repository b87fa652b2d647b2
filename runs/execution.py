"""The runtime's watch over one attempt: lease, fence and audit (G2, G5, G6, G12).

``LeasedExecution`` is the agent loop's observer. Every tool call is preceded
by a guarded renewal of the lease that, for a write, stamps the fence (G5,
G6). That renewal normally *is* the record of the step before the call: the
loop names the next call, and one statement records the step, renews the
lease for the call and stamps its fence. When that record did not happen
(it failed, or the call could not be named in advance) ``before_tool``
renews on its own. After every step the observer decides what a failed
record means (G2).

A step the database refused is kept and written, in order, ahead of the
next one that is recorded, and a write does not start while one is left
(G12): the durable journal is always a prefix of what the attempt did, and
what a crash can lose is a tail of read and model steps that no write
depends on.
"""

import logging

from django.conf import settings
from django.db import DatabaseError

from runs import metrics, transitions
from runs.approvals import ApprovalGate
from runs.errors import (
    AuditPersistenceFailed,
    AwaitingApproval,
    LeaseLost,
    RunCancelled,
    StepsNotDurable,
    WriteNotDurable,
)
from runs.loop import PlannedCall, StepEvent
from runs.transitions import FinishOutcome, Lease, NextCall, ParkOutcome, RecordOutcome
from runs.vocabulary import StepKind
from tools.contract import ToolContext, idempotency_key_for

logger = logging.getLogger(__name__)

#: At most this many steps recorded without the flush are kept to write again
#: after a server crash; the record after them waits for the flush.
UNFLUSHED_STEPS_KEPT = 32


class LeasedExecution:
    def __init__(
        self,
        lease: Lease,
        lease_seconds: float,
        operation_margin: float,
        *,
        recorded_steps: int = 0,
        approvals: ApprovalGate | None = None,
    ):
        self.lease = lease
        self.approvals = approvals or ApprovalGate(lease.run_id)
        self.lease_seconds = lease_seconds
        self.operation_margin = operation_margin
        #: Steps this attempt has recorded (the claim's request step included).
        self._recorded = recorded_steps
        #: The most it ever had: a server crash that lost steps lowers
        #: ``_recorded`` until they are written again.
        self._most_recorded = recorded_steps
        #: A record's connection broke before the database answered, and the
        #: database could not yet be asked whether the first ``_doubtful``
        #: unwritten steps — the ones that record carried — landed.
        self._in_doubt = False
        self._doubtful = 0
        #: Steps recorded by commits that did not wait for the WAL flush
        #: since the last one that did, in order: what a server crash may
        #: lose (G12). Each record is guarded on how many steps the attempt
        #: has recorded; when the database holds fewer, these are written
        #: again (``_restore_lost_steps``).
        self._unflushed: list[dict] = []
        #: The call the last record renewed the lease for, and its idempotency key.
        self._renewed_for: tuple[PlannedCall, str] | None = None
        #: Steps the database refused (fail-soft: reads, model turns), in
        #: order: written ahead of the next step that is recorded, so the
        #: journal never has a gap a later attempt would fill differently,
        #: and no write starts while one is left (G12).
        self._unwritten: list[dict] = []
        #: The writes this attempt ran whose records landed, each with the
        #: count of the attempt's steps once it had: a database that later
        #: holds fewer lost a write's record (G12's premise broken: a
        #: failover, a server not honouring the flush) — ``WriteNotDurable``.
        self._recorded_writes: list[tuple[int, dict]] = []
        #: The final answer's record settled the run (``finish``).
        self.settled = False

    # --- hooks the agent loop calls ----------------------------------------

    def before_tool(self, call: PlannedCall) -> ToolContext:
        """The call's context once the lease is renewed for it (and a write's
        fence stamped).

        Raises instead of returning when the run is lost or being cancelled,
        and before a write while earlier steps are still unwritten: then the
        tool does not run.
        """
        renewed, self._renewed_for = self._renewed_for, None
        if renewed is not None and renewed[0] is call:
            # The step recorded just before this call renewed the lease for
            # it and stamped its fence, in the same guarded UPDATE.
            return self._context(call, renewed[1])
        key = idempotency_key_for(self.lease.run_id, call.position, call.tool.name, call.arguments)
        renewal = self._renewal_for(call, key)
        lease_seconds = self._lease_seconds_for(call)
        try:
            # Twice at most: again after the database had lost steps that go
            # again first, with this renewal.
            for _ in range(2):
                # The steps still unwritten go first, with this call's renewal;
                # None: nothing was left to write (a doubt resolved as landed).
                outcome = self._record([], lease_seconds, renewal) if self._unwritten else None
                if outcome is RecordOutcome.PERSISTED:
                    return self._context(call, key)
                if outcome is RecordOutcome.LEASE_LOST:
                    self._stop_for_lost_renewal(before=call.tool.name)
                if outcome is RecordOutcome.FAILED and call.tool.effect.is_write:
                    raise StepsNotDurable(
                        f"the {call.tool.effect} tool {call.tool.name!r} did not start: "
                        f"{len(self._unwritten)} earlier step(s) of the run could not be recorded"
                    )
                # A read may run over the gap; the steps wait for the next
                # record. The renewal is guarded as every record is: a fence
                # is never stamped over steps a server crash lost (G12).
                if transitions.renew_lease(
                    self.lease,
                    lease_seconds,
                    fence=renewal.fence,
                    call=renewal.call,
                    recorded=self._recorded,
                ):
                    break
                if not transitions.steps_lost(self.lease, self._recorded):
                    self._stop_for_lost_renewal(before=call.tool.name)
                self._restore_lost_steps()
            else:
                raise StepsNotDurable("the run's steps were lost again before a call")
        except (StepsNotDurable, RunCancelled, DatabaseError) as error:
            # The tool has not started: a fence a statement may have stamped
            # for it must not leave a write in doubt that never ran. If the
            # database is away now, the runtime tries again when it settles.
            if renewal.fence and not self._withdraw_fence(key):
                error.unstarted_call = key
            raise
        return self._context(call, key)

    def after_step(self, event: StepEvent, next_call: PlannedCall | None = None) -> None:
        """Record the step, renewing the lease for ``next_call`` when it can.
        Fail closed for an executed write, soft otherwise."""
        self._renewed_for = None
        next_key, renewal, lease_seconds = None, None, self.lease_seconds
        if next_call is not None:
            next_key = idempotency_key_for(
                self.lease.run_id, next_call.position, next_call.tool.name, next_call.arguments
            )
            renewal = self._renewal_for(next_call, next_key)
            lease_seconds = self._lease_seconds_for(next_call)
        write = _write_of(event) if event.is_executed_write else None
        try:
            outcome = self._record(
                [_step_fields(event)], lease_seconds, renewal, clear_fence=write is not None
            )
        except StepsNotDurable as error:
            if write is None:
                raise
            # The write ran, and the database lost what the attempt counted
            # on before it — its fence, the turn that asked for it: a retry
            # would resume before the write and could send it again.
            raise WriteNotDurable(
                f"the {event.effect} tool {event.tool_name!r} executed but its record "
                f"cannot be made durable: {error}",
                write=write,
            ) from error
        if write is not None and outcome.persisted:
            self._recorded_writes.append((self._recorded, write))
        if outcome is RecordOutcome.PERSISTED:
            if next_key is not None:
                self._renewed_for = (next_call, next_key)
            return
        if outcome is RecordOutcome.LEASE_LOST:
            if event.executed:
                logger.error(
                    "run=%s lease_token=%s lost its lease while %s executed; step not recorded",
                    self.lease.run_id,
                    self.lease.token,
                    event.tool_name,
                )
            raise LeaseLost()
        # FAILED: the database refused the step (and any still unwritten).
        if event.is_executed_write:
            metrics.AUDIT_FAILURES.labels(event.effect).inc()
            raise AuditPersistenceFailed(
                f"the {event.effect} tool {event.tool_name!r} executed but its step "
                f"could not be persisted (idempotency key {event.idempotency_key})",
                call={
                    "tool": event.tool_name,
                    "arguments": event.arguments,
                    "idempotency_key": event.idempotency_key,
                },
            )
        self._heartbeat_after_unrecorded_step()

    def finish(self, event: StepEvent, output: str) -> None:
        """Record the final answer and settle the run with it, in one write.

        ``settled`` tells the runtime whether that happened (``completed``, or
        ``cancelled`` when a cancel won). If the database refused the step,
        nothing is settled: the run goes on to an ordinary settle without it.
        """
        final = _step_fields(event)
        outcome, steps = FinishOutcome.FAILED, [*self._unwritten, final]
        # Twice at most: again after the database had lost steps that go
        # again first, or after a settle in doubt that had not landed.
        for _ in range(2):
            if self._in_doubt and not self._resolve_doubt():
                # Whether earlier steps landed is still unknown: nothing is
                # written after them (the journal stays a prefix, G12).
                outcome, steps = FinishOutcome.FAILED, [*self._unwritten, final]
                break
            steps = [*self._unwritten, final]
            with metrics.STEP_RECORD_SECONDS.time():
                outcome = transitions.finish(
                    self.lease, steps, output=output, recorded=self._recorded
                )
            if outcome is FinishOutcome.STEPS_LOST:
                self._unwritten = steps[:-1]
                self._restore_lost_steps()
                continue
            if outcome is not FinishOutcome.UNKNOWN:
                break
            self._unwritten, self._in_doubt, self._doubtful = steps, True, len(steps)
            if self._resolve_doubt() and not self._unwritten:
                self.settled = True  # it had committed after all
                return
            self._unwritten = [step for step in self._unwritten if step is not final]
            outcome = FinishOutcome.FAILED
        if outcome is FinishOutcome.LEASE_LOST:
            raise LeaseLost()
        if outcome in (FinishOutcome.FAILED, FinishOutcome.STEPS_LOST, FinishOutcome.UNKNOWN):
            self._unwritten = steps
            self._heartbeat_after_unrecorded_step()
            return
        self._landed(steps)
        self.settled = True

    def finish_without_steps(self, output: str) -> None:
        """Settle ``completed`` (``cancelled`` when a cancel won, G9) without a
        step: a replayed final answer, or one whose record the database
        refused. Only while the run holds every step the attempt recorded:
        otherwise ``StepsNotDurable`` (the retry resumes after the last step
        that is there), and ``LeaseLost`` when the run is not this lease's."""
        if self._in_doubt and not self._resolve_doubt():
            raise StepsNotDurable(
                "the run cannot settle while it cannot tell whether its steps were recorded"
            )
        # Against the most the attempt ever had recorded, not the count as it
        # stands: a restore lowers that count to what the database holds, and
        # the steps it restored may still be unwritten (a final record in doubt
        # twice, say).
        if self._recorded < self._most_recorded:
            raise StepsNotDurable(
                "the database lost steps of the run: it is not settled without them"
            )
        outcome = transitions.finish(self.lease, [], output=output, recorded=self._recorded)
        if outcome is FinishOutcome.LEASE_LOST:
            raise LeaseLost()
        if outcome not in (FinishOutcome.COMPLETED, FinishOutcome.CANCELLED):
            raise StepsNotDurable(
                f"the final answer could not be settled ({outcome.value}): the run may "
                "not hold every step it recorded"
            )
        self.settled = True

    def gate(self, calls, *, turn_sequence: int | None, turn_event: StepEvent | None) -> dict:
        """The calls of this turn an operator denied (position → what the
        model is told). If any call waits for approval, park the run instead
        — the turn (``turn_event``, asked live) recorded with it — and raise
        ``AwaitingApproval``: no call of the turn runs (G14)."""
        denied, waiting = self.approvals.review(calls, turn_sequence)
        if waiting:
            self._park(waiting, turn_sequence, turn_event)
        return denied

    def _park(self, waiting: list, turn_sequence: int | None, turn_event) -> None:
        if self._in_doubt and not self._resolve_doubt():
            raise StepsNotDurable(
                "the run cannot wait for approval while it cannot tell whether its "
                "earlier steps were recorded"
            )
        turn = [_step_fields(turn_event)] if turn_event else []
        for _ in range(2):  # again after the database had lost steps that go again first
            steps = [*self._unwritten, *turn]
            outcome, requests = transitions.wait_for_approval(
                self.lease,
                steps,
                waiting,
                turn_sequence=turn_sequence,
                timeout_seconds=settings.NRLLM_APPROVAL_TIMEOUT_SECONDS,
                recorded=self._recorded,
            )
            if outcome is not ParkOutcome.STEPS_LOST:
                break
            self._restore_lost_steps()
        if outcome is ParkOutcome.STEPS_LOST:
            raise StepsNotDurable("the run's steps were lost again before it could wait")
        if outcome is ParkOutcome.LEASE_LOST:
            raise LeaseLost()
        if outcome is ParkOutcome.CANCEL_REQUESTED:
            raise RunCancelled()
        self._landed(steps)
        raise AwaitingApproval(requests)

    def record_request(self, request: dict) -> None:
        """The first step of an interactive run: what it was asked to do."""
        self.after_step(StepEvent(kind=StepKind.REQUEST, arguments=request))

    def _record(
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
        if self._in_doubt and not self._resolve_doubt():
            self._unwritten.extend(steps)  # the database is still away
            return RecordOutcome.FAILED
        new, steps = steps, [*self._unwritten, *steps]
        if not steps:
            return None
        outcome, waited = self._record_now(steps, lease_seconds, next_call, clear_fence)
        if outcome is RecordOutcome.STEPS_LOST:
            self._unwritten = steps[: len(steps) - len(new)]
            self._restore_lost_steps()
            steps = [*self._unwritten, *new]
            outcome, waited = self._record_now(steps, lease_seconds, next_call, clear_fence)
            if outcome is RecordOutcome.STEPS_LOST:
                raise StepsNotDurable("the run's steps were lost again while they were rewritten")
        if outcome is RecordOutcome.LEASE_LOST:
            return outcome
        if outcome in (RecordOutcome.FAILED, RecordOutcome.UNKNOWN):
            self._unwritten = steps
            if outcome is RecordOutcome.FAILED:
                return outcome
            self._in_doubt, self._doubtful = True, len(steps)
            if not self._resolve_doubt() or self._unwritten:
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
                    if not self._withdraw_fence(key):
                        cancelled.unstarted_call = key
                raise cancelled
            return RecordOutcome.PERSISTED
        # A commit that waits for the flush carries every earlier one to
        # disk; until then, what a server crash could lose is kept.
        self._unflushed = [] if waited else [*self._unflushed, *steps]
        self._landed(steps)
        if outcome is RecordOutcome.PERSISTED_CANCEL_REQUESTED:
            raise RunCancelled()
        return outcome

    def _record_now(
        self, steps, lease_seconds, next_call, clear_fence
    ) -> tuple[RecordOutcome, bool]:
        """``transitions.record_steps`` under this attempt's count, and whether
        its commit waited for the flush. What the attempt keeps to write again
        is bounded: past that, a record waits, and it is all on disk."""
        waits = len(self._unflushed) >= UNFLUSHED_STEPS_KEPT or not transitions.skips_the_flush(
            steps, clear_fence=clear_fence, next_call=next_call
        )
        with metrics.STEP_RECORD_SECONDS.time():
            outcome = transitions.record_steps(
                self.lease,
                lease_seconds,
                steps,
                clear_fence=clear_fence,
                next_call=next_call,
                recorded=self._recorded,
                wait_for_flush=waits,
            )
        return outcome, waits

    def _restore_lost_steps(self, count: int | None = None) -> None:
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
        lost = self._recorded - count
        for recorded_with, write in self._recorded_writes:
            if recorded_with > count:
                raise WriteNotDurable(
                    f"the database lost the record of the {write['effect']} tool "
                    f"{write['tool']!r} that this attempt executed, a commit that had "
                    "waited for the flush",
                    write=write,
                )
        if not 0 < lost <= len(self._unflushed):
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
        kept = len(self._unflushed) - lost
        self._unwritten = [*self._unflushed[kept:], *self._unwritten]
        del self._unflushed[kept:]
        self._recorded = count

    def _resolve_doubt(self) -> bool:
        """Ask the database whether the steps the record in doubt carried
        landed after all; False if it cannot answer yet. When it holds fewer
        steps than the attempt had recorded (a server crash lost records that
        had not reached disk) those go again (``_restore_lost_steps``).
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
        self._in_doubt = False
        if count == self._recorded + self._doubtful:
            logger.warning(
                "run=%s lease_token=%s: %d step(s) landed although the database did not say so",
                self.lease.run_id,
                self.lease.token,
                self._doubtful,
            )
            landed, self._unwritten = (
                self._unwritten[: self._doubtful],
                self._unwritten[self._doubtful :],
            )
            self._count(landed)
            self._recorded += len(landed)
            self._most_recorded = max(self._most_recorded, self._recorded)
            # Whether their commit waited for the flush is not known here:
            # they count as what a crash may still lose (an entry too many
            # at the head is harmless: a restore takes the tail).
            self._unflushed.extend(landed)
        elif count < self._recorded:
            self._restore_lost_steps(count)
        elif count != self._recorded:
            raise LeaseLost()
        return True

    def _withdraw_fence(self, key: str) -> bool:
        """Withdraw the fence stamped for the call with ``key``, which did not
        start; False if the database is away (the fence stays: a write in
        doubt an operator reconciles, the safe side)."""
        return withdraw_unstarted_fence(self.lease, key)

    def _landed(self, steps: list[dict]) -> None:
        self._count(steps)
        self._recorded += len(steps)
        self._most_recorded = max(self._most_recorded, self._recorded)
        self._unwritten = []

    @staticmethod
    def _count(steps: list[dict]) -> None:
        for step in steps:
            metrics.STEPS.labels(step["kind"], step["effect"] or "none").inc()

    # --- helpers -----------------------------------------------------------

    def _lease_seconds_for(self, call: PlannedCall) -> float:
        # Operation deadline: the lease must outlive the call, or a long write
        # would be reaped mid-call.
        return max(self.lease_seconds, (call.tool.time_limit() or 0) + self.operation_margin)

    @staticmethod
    def _renewal_for(call: PlannedCall, key: str) -> NextCall:
        if not call.tool.effect.is_write:
            return NextCall(fence="", call=None)
        stamp = {"tool": call.tool.name, "arguments": call.arguments, "idempotency_key": key}
        return NextCall(fence=call.tool.effect.value, call=stamp)

    def _context(self, call: PlannedCall, key: str) -> ToolContext:
        return ToolContext(
            run_id=self.lease.run_id,
            idempotency_key=key,
            attempt=self.lease.token,
            timeout_seconds=call.tool.time_limit(),
        )

    def _heartbeat_after_unrecorded_step(self) -> None:
        # The failed record rolled back its renewal too; renew on its own.
        # If the database is still away, carry on: the lease has time left and
        # a read-only run must not fail over a blip.
        try:
            renewed = transitions.heartbeat(self.lease, self.lease_seconds)
        except DatabaseError:
            logger.warning("run=%s heartbeat failed; continuing", self.lease.run_id)
            return
        if not renewed:
            raise LeaseLost()
        if transitions.cancel_requested(self.lease):
            raise RunCancelled()

    def _stop_for_lost_renewal(self, *, before: str) -> None:
        if transitions.cancel_requested(self.lease):
            logger.info("run=%s cancel noticed before %s", self.lease.run_id, before)
            raise RunCancelled()
        logger.warning(
            "run=%s lease_token=%s lost its lease before %s; stopping",
            self.lease.run_id,
            self.lease.token,
            before,
        )
        raise LeaseLost()


def withdraw_unstarted_fence(lease: Lease, key: str) -> bool:
    """``transitions.withdraw_fence``, never raising; False if the database
    could not be asked."""
    try:
        transitions.withdraw_fence(lease, key)
    except DatabaseError:
        logger.warning("run=%s fence of a call that did not start left up", lease.run_id)
        return False
    return True


def _write_of(event: StepEvent) -> dict:
    """The executed write as a fence names it (``transitions.settle``'s ``fence``)."""
    return {
        "effect": event.effect,
        "tool": event.tool_name,
        "arguments": event.arguments,
        "idempotency_key": event.idempotency_key,
    }


def _step_fields(event: StepEvent) -> dict:
    return {
        "kind": event.kind,
        "tool_name": event.tool_name,
        "effect": event.effect,
        "arguments": event.arguments,
        "result": event.result,
        "error": event.error,
        "idempotency_key": event.idempotency_key,
    }
