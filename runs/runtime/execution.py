"""The runtime's watch over one attempt: lease, fence and audit (G2, G5, G6, G12).

``LeasedExecution`` is the agent loop's observer. Every tool call is preceded
by a guarded renewal of the lease that, for a write, stamps the fence (G5,
G6). That renewal normally *is* the record of the step before the call: the
loop names the next call, and one statement records the step, renews the
lease for the call and stamps its fence. When that record did not happen
(it failed, or the call could not be named in advance) ``before_tool``
renews on its own. After every step the observer decides what a failed
record means (G2).

What the attempt has recorded is its ``StepLedger`` (``step_ledger``). A
step the database refused is kept and written, in order, ahead of the next
one that is recorded, and a write does not start while one is left (G12):
the durable journal is always a prefix of what the attempt did, and what a
crash can lose is a tail of read and model steps that no write depends on.
"""

import logging

from django.conf import settings
from django.db import DatabaseError

from runs import transitions
from runs.approvals.gate import ApprovalGate
from runs.models import metrics
from runs.models.vocabulary import RunStatus, StepKind, WaitKind
from runs.runtime.budget_watch import BudgetWatch
from runs.runtime.call_lease import CallLease
from runs.runtime.errors import (
    AuditPersistenceFailed,
    AwaitingApproval,
    AwaitingInput,
    LeaseLost,
    RunCancelled,
    StepsNotDurable,
    WriteNotDurable,
)
from runs.runtime.heartbeat import Heartbeat
from runs.runtime.loop import PlannedCall, StepEvent
from runs.runtime.step_ledger import (
    StepLedger,
    record_late_result,
    withdraw_unstarted_fence,
)
from runs.transitions import FinishOutcome, Lease, RecordOutcome, WaitingCall
from spend.call_size import CallSize
from tools.canonical import storable_text
from tools.contract import Question, ToolContext, idempotency_key_for

logger = logging.getLogger(__name__)


class LeasedExecution(CallLease):
    def __init__(
        self,
        lease: Lease,
        lease_seconds: float,
        operation_margin: float,
        *,
        recorded_steps: int = 0,
        approvals: ApprovalGate | None = None,
        heartbeat: Heartbeat | None = None,
        budget: BudgetWatch | None = None,
    ):
        self.lease = lease
        #: The lease kept in the background between steps (G16); None: the
        #: records alone renew it, each far enough for the call that follows.
        self.heartbeat = heartbeat
        self.approvals = approvals or ApprovalGate(lease.run_id)
        self.lease_seconds = lease_seconds
        self.operation_margin = operation_margin
        #: The call the last record renewed the lease for, and its idempotency key.
        self._renewed_for: tuple[PlannedCall, str] | None = None
        #: What the attempt recorded, and what it still owes the journal.
        self.ledger = StepLedger(lease, recorded_steps)
        if heartbeat is not None:
            self.ledger.renewed = heartbeat.renewed
        #: The final answer's record settled the run (``finish``).
        self.settled = False
        #: The budget checks before each model call (G17); None: none.
        self.budget = None
        #: The reservations before each model call (G21); None: none.
        self.reservations = None
        if budget is not None:
            self.budget_from(budget)

    def budget_from(self, budget: BudgetWatch) -> None:
        """Check ``budget`` before each model call, and refresh it from every record."""
        self.budget = budget
        self.ledger.tally = budget.tally
        self.ledger.model = budget.model

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
            self._stop_if_handed_back(call, renewed[1])
            return self._context(call, renewed[1])
        key = idempotency_key_for(self.lease.run_id, call.position, call.tool.name, call.arguments)
        # Handed back: no renewal holds the lease again, and a fence a record
        # in doubt may have stamped for this call is withdrawn.
        self._stop_if_handed_back(call, key)
        renewal = self._renewal_for(call, key)
        lease_seconds = self._lease_seconds_for(call)
        try:
            # Twice at most: again after the database had lost steps that go
            # again first, with this renewal.
            for _ in range(2):
                # The steps still unwritten go first, with this call's renewal;
                # None: nothing was left to write (a doubt resolved as landed).
                outcome = (
                    self.ledger.record([], lease_seconds, renewal)
                    if self.ledger.unwritten
                    else None
                )
                if outcome is RecordOutcome.PERSISTED:
                    self._stop_if_handed_back(call, key)
                    return self._context(call, key)
                if outcome is RecordOutcome.LEASE_LOST:
                    self._stop_for_lost_renewal(before=call.tool.name)
                if outcome is RecordOutcome.FAILED and call.tool.effect.is_write:
                    raise StepsNotDurable(
                        f"the {call.tool.effect} tool {call.tool.name!r} did not start: "
                        f"{len(self.ledger.unwritten)} earlier step(s) of the run could not "
                        "be recorded"
                    )
                # A read may run over the gap; the steps wait for the next
                # record. The renewal is guarded as every record is: a fence
                # is never stamped over steps a server crash lost (G12).
                if transitions.renew_lease(
                    self.lease,
                    lease_seconds,
                    fence=renewal.fence,
                    call=renewal.call,
                    recorded=self.ledger.recorded,
                ):
                    break
                if not transitions.steps_lost(self.lease, self.ledger.recorded):
                    self._stop_for_lost_renewal(before=call.tool.name)
                self.ledger.restore_lost_steps()
            else:
                raise StepsNotDurable("the run's steps were lost again before a call")
        except (StepsNotDurable, RunCancelled, DatabaseError) as error:
            # The tool has not started: a fence a statement may have stamped
            # for it must not leave a write in doubt that never ran. If the
            # database is away now, the runtime tries again when it settles.
            if renewal.fence and not withdraw_unstarted_fence(self.lease, key):
                error.unstarted_call = key
            raise
        # Handed back while the renewal stamped the call's fence: it never starts.
        self._stop_if_handed_back(call, key)
        return self._context(call, key)

    def after_step(self, event: StepEvent, next_call: PlannedCall | None = None) -> None:
        """Record the step, renewing the lease for ``next_call`` when it can.
        Fail closed for an executed write, soft otherwise. An attempt its
        worker handed back records the step, lets its lease lapse with it and
        stops (``LeaseLost``: it settles nothing)."""
        self._renewed_for = None
        self.between_operations()
        handed_back = self.heartbeat is not None and self.heartbeat.handed_back
        next_key, renewal, lease_seconds = None, None, self.lease_seconds
        if next_call is not None:
            next_key = idempotency_key_for(
                self.lease.run_id, next_call.position, next_call.tool.name, next_call.arguments
            )
            renewal = self._renewal_for(next_call, next_key)
            lease_seconds = self._lease_seconds_for(next_call)
        if handed_back:
            next_key, renewal, lease_seconds = None, None, 0
        write = _write_of(event) if event.is_executed_write else None
        try:
            outcome = self.ledger.record(
                [self._fields(event)], lease_seconds, renewal, clear_fence=write is not None
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
            self.ledger.recorded_write(write)
        if handed_back:
            raise LeaseLost()
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
        final = self._fields(event)
        outcome, steps = FinishOutcome.FAILED, [*self.ledger.unwritten, final]
        # Twice at most: again after the database had lost steps that go
        # again first, or after a settle in doubt that had not landed.
        for _ in range(2):
            if self.ledger.in_doubt and not self.ledger.resolve_doubt():
                # Whether earlier steps landed is still unknown: nothing is
                # written after them (the journal stays a prefix, G12).
                outcome, steps = FinishOutcome.FAILED, [*self.ledger.unwritten, final]
                break
            steps = [*self.ledger.unwritten, final]
            with metrics.STEP_RECORD_SECONDS.time():
                outcome = transitions.finish(
                    self.lease,
                    steps,
                    output=output,
                    recorded=self.ledger.recorded,
                    settle_reservations=self.reservations is not None,
                )
            if outcome is FinishOutcome.STEPS_LOST:
                self.ledger.leave_unwritten(steps[:-1])
                self.ledger.restore_lost_steps()
                continue
            if outcome is not FinishOutcome.UNKNOWN:
                break
            self.ledger.hold_in_doubt(steps)
            if self.ledger.resolve_doubt() and not self.ledger.unwritten:
                self.settled = True  # it had committed after all
                return
            self.ledger.leave_unwritten(
                [step for step in self.ledger.unwritten if step is not final]
            )
            outcome = FinishOutcome.FAILED
        if outcome is FinishOutcome.LEASE_LOST:
            raise LeaseLost()
        if outcome in (FinishOutcome.FAILED, FinishOutcome.STEPS_LOST, FinishOutcome.UNKNOWN):
            self.ledger.leave_unwritten(steps)
            self._heartbeat_after_unrecorded_step()
            return
        self.ledger.landed(steps)
        self.settled = True

    def finish_without_steps(self, output: str) -> None:
        """Settle ``completed`` (``cancelled`` when a cancel won, G9) without a
        step: a replayed final answer, or one whose record the database
        refused. Only while the run holds every step the attempt recorded:
        otherwise ``StepsNotDurable`` (the retry resumes after the last step
        that is there), and ``LeaseLost`` when the run is not this lease's."""
        if self.ledger.in_doubt and not self.ledger.resolve_doubt():
            raise StepsNotDurable(
                "the run cannot settle while it cannot tell whether its steps were recorded"
            )
        # Against the most the attempt ever had recorded, not the count as it
        # stands: a restore lowers that count to what the database holds, and
        # the steps it restored may still be unwritten (a final record in doubt
        # twice, say).
        if self.ledger.recorded < self.ledger.most_recorded:
            raise StepsNotDurable(
                "the database lost steps of the run: it is not settled without them"
            )
        outcome = transitions.finish(self.lease, [], output=output, recorded=self.ledger.recorded)
        if outcome is FinishOutcome.LEASE_LOST:
            raise LeaseLost()
        if outcome not in (FinishOutcome.COMPLETED, FinishOutcome.CANCELLED):
            raise StepsNotDurable(
                f"the final answer could not be settled ({outcome.value}): the run may "
                "not hold every step it recorded"
            )
        self.settled = True

    def write_returned_late(self, event: StepEvent, result, error: str) -> None:
        """Record what a write returned after the run stopped counting on it:
        the write is in doubt, and this is what an operator reconciling it
        needs to see (G13, G15)."""
        record_late_result(self.lease, _step_fields(event), result, error)

    def gate(self, calls, *, turn_sequence: int | None, turn_event: StepEvent | None) -> dict:
        """The calls of this turn an operator denied (position → what the
        model is told). If any call waits for approval, park the run instead
        — the turn (``turn_event``, asked live) recorded with it — and raise
        ``AwaitingApproval``: no call of the turn runs (G14)."""
        denied, waiting = self.approvals.review(calls, turn_sequence)
        if waiting:
            turn = [self._fields(turn_event)] if turn_event else []
            requests = self.ledger.park(waiting, turn_sequence, turn)
            raise AwaitingApproval(requests)
        return denied

    def wait_for_input(self, call: PlannedCall, event: StepEvent, waiting) -> None:
        """Park the run for ``call``'s answer (``Question``) or completion
        (``Deferred``), the steps before it recorded with the park (G24),
        and raise ``AwaitingInput``. A deferred write's hand-off ran under
        its fence: the park is its record, and if the park cannot be
        recorded the write's audit failed (G2) — the fence stays."""
        question = isinstance(waiting, Question)
        tool = call.tool
        if question:
            timeout = settings.NRLLM_QUESTION_TIMEOUT_SECONDS
        else:
            timeout = tool.completion_timeout_seconds or settings.NRLLM_COMPLETION_TIMEOUT_SECONDS
        waiting_call = WaitingCall(
            position=call.position,
            tool_name=tool.name,
            effect=tool.effect.value,
            arguments=call.arguments,
            idempotency_key=event.idempotency_key,
            required_by="",
            kind=WaitKind.QUESTION if question else WaitKind.DEFERRED,
            reference="" if question else storable_text(str(waiting.reference))[:200],
        )
        self._renewed_for = None
        self.between_operations()
        try:
            (request,) = self.ledger.park(
                [waiting_call],
                None,
                [],
                status=RunStatus.WAITING_FOR_INPUT,
                timeout_seconds=timeout,
            )
        except (StepsNotDurable, DatabaseError) as error:
            if not tool.effect.is_write:
                raise
            metrics.AUDIT_FAILURES.labels(tool.effect.value).inc()
            raise AuditPersistenceFailed(
                f"the deferred {tool.effect} tool {tool.name!r} handed its call on but the "
                f"wait for its completion could not be recorded: {error}",
                call={
                    "tool": tool.name,
                    "arguments": call.arguments,
                    "idempotency_key": event.idempotency_key,
                },
            ) from error
        raise AwaitingInput(request)

    def record_request(self, request: dict) -> None:
        """The first step of an interactive run: what it was asked to do."""
        self.after_step(StepEvent(kind=StepKind.REQUEST, arguments=request))

    # --- helpers -----------------------------------------------------------

    def _fields(self, event: StepEvent) -> dict:
        """The step to record: a model turn with its cost (G17)."""
        fields = _step_fields(event)
        if self.budget is not None and event.kind == StepKind.LLM:
            fields["result"] = self.budget.priced(fields["result"])
        return fields

    @property
    def sizes_calls(self) -> bool:
        """Whether a limit or a budget must have room for each model call."""
        return self.budget is not None and self.budget.limits_anything

    def call_size(self, messages, tool_specs, max_tokens: int | None) -> CallSize | None:
        """The most the call can cost, when a limit or a budget must have
        room for it (None: none applies, and nothing is measured)."""
        return None if self.budget is None else self.budget.size(messages, tool_specs, max_tokens)

    def reserve_call(self, size: CallSize | None) -> None:
        """Reserve the call's largest cost against the submitter's budget
        (G21), once G17's checks let it go (``BudgetExhausted`` if not)."""
        if self.reservations is None or size is None:
            return
        self.budget.check_before_call(self.ledger.unwritten, size)
        self.reservations.before_call(size, self._still_waiting)

    def release_reservation(self) -> None:
        if self.reservations is not None:
            self.reservations.release()

    def _still_waiting(self) -> None:
        """The lease is kept while the attempt waits (``LeaseLost`` if not)."""
        self.between_operations()
        if self.heartbeat is not None and self.heartbeat.handed_back:
            raise LeaseLost()

    def model_call_begins(self, call_seconds: float | None, size: CallSize | None) -> None:
        """A model call that may take ``call_seconds`` (its client's own
        timeouts; None: unbounded) and cost up to ``size`` is about to be
        sent: unless it could go over a limit (``BudgetExhausted``, G17). No tool is running now,
        and every call of the last turn has its outcome recorded or
        unwritten (a write's is always recorded before the next call)."""
        if self.budget is not None:
            self.budget.check_before_call(self.ledger.unwritten, size)
        if self.heartbeat is not None:
            self.heartbeat.model_call(call_seconds)
            if self.heartbeat.handed_back:
                raise LeaseLost()


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
