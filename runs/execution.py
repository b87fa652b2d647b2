"""The runtime's watch over one attempt: lease, fence and audit (G2, G5, G6).

``LeasedExecution`` is the agent loop's observer. Before a tool it renews the
lease and, for a write, stamps the fence in the same guarded UPDATE; after
every step it records the step (renewing the lease and clearing the fence in
one transaction) and decides what a failed record means.
"""

import logging

from django.db import DatabaseError

from runs import metrics, transitions
from runs.errors import AuditPersistenceFailed, LeaseLost, RunCancelled
from runs.loop import PlannedCall, RecordedOutcome, StepEvent
from runs.models import RunStep
from runs.transitions import Lease, RecordOutcome
from runs.vocabulary import StepKind
from tools.contract import ToolContext, idempotency_key_for

logger = logging.getLogger(__name__)


class LeasedExecution:
    def __init__(self, lease: Lease, lease_seconds: float, operation_margin: float):
        self.lease = lease
        self.lease_seconds = lease_seconds
        self.operation_margin = operation_margin

    # --- hooks the agent loop calls ----------------------------------------

    def before_tool(self, call: PlannedCall) -> ToolContext:
        """Renew the lease right before the call, stamping a write's fence.

        Raises instead of returning when the run is lost or being cancelled:
        then the tool does not run.
        """
        effect = call.tool.effect
        key = idempotency_key_for(self.lease.run_id, call.position, call.tool.name, call.arguments)
        if effect.is_write:
            recorded = _recorded_outcome(self.lease.run_id, key)
            if recorded is not None:
                # An earlier attempt executed this very call and recorded it:
                # re-executing from the start must not repeat the write.
                return recorded
        fence = effect.value if effect.is_write else ""
        limit = call.tool.time_limit()
        # Operation deadline: the lease must outlive the call, or a long write
        # would be reaped mid-call.
        lease_seconds = max(self.lease_seconds, (limit or 0) + self.operation_margin)
        call_stamp = {"tool": call.tool.name, "arguments": call.arguments, "idempotency_key": key}
        if not transitions.renew_lease(self.lease, lease_seconds, fence=fence, call=call_stamp):
            self._stop_for_lost_renewal(before=call.tool.name)
        return ToolContext(
            run_id=self.lease.run_id,
            idempotency_key=key,
            attempt=self.lease.token,
            timeout_seconds=limit,
        )

    def after_step(self, event: StepEvent) -> None:
        """Record the step. Fail closed for an executed write, soft otherwise."""
        with metrics.STEP_RECORD_SECONDS.time():
            outcome = transitions.record_step(
                self.lease,
                self.lease_seconds,
                _step_fields(event),
                clear_fence=event.is_executed_write,
            )
        if outcome.persisted:
            metrics.STEPS.labels(event.kind, event.effect or "none").inc()
        if outcome is RecordOutcome.PERSISTED:
            return
        if outcome is RecordOutcome.PERSISTED_CANCEL_REQUESTED:
            raise RunCancelled()
        if outcome is RecordOutcome.LEASE_LOST:
            if event.executed:
                logger.error(
                    "run=%s lease_token=%s lost its lease while %s executed; step not recorded",
                    self.lease.run_id,
                    self.lease.token,
                    event.tool_name,
                )
            raise LeaseLost()
        # FAILED: the database refused the step.
        if event.is_executed_write:
            metrics.AUDIT_FAILURES.labels(event.effect).inc()
            raise AuditPersistenceFailed(
                f"the {event.effect} tool {event.tool_name!r} executed but its step "
                f"could not be persisted (idempotency key {event.idempotency_key})"
            )
        self._heartbeat_after_unrecorded_step()

    # --- helpers -----------------------------------------------------------

    def record_request(self, request: dict) -> None:
        """The first step of every attempt: what it was asked to do."""
        self.after_step(StepEvent(kind="request", arguments=request))

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


def _recorded_outcome(run_id: str, idempotency_key: str) -> RecordedOutcome | None:
    step = (
        RunStep.objects.filter(
            run_id=run_id, kind=StepKind.TOOL, idempotency_key=idempotency_key, replay_of=None
        )
        .order_by("sequence")
        .values("sequence", "result", "error")
        .first()
    )
    if step is None:
        return None
    return RecordedOutcome(step["sequence"], idempotency_key, step["result"], step["error"])


def _step_fields(event: StepEvent) -> dict:
    return {
        "kind": event.kind,
        "tool_name": event.tool_name,
        "effect": event.effect,
        "arguments": event.arguments,
        "result": event.result,
        "error": event.error,
        "idempotency_key": event.idempotency_key,
        "replay_of": event.replay_of,
    }
