"""How the lease covers each call of an attempt (G5, G16): for how long a
record renews it before a tool runs, what a write's fence is stamped with,
what the heartbeat is told while a tool or the model is working, and what
stops the attempt when a renewal finds the run gone or being cancelled.

``CallLease`` is half of ``LeasedExecution`` (``execution``): that class
decides what is recorded and what a failed record means; this one keeps
the lease true around each call."""

import logging

from django.db import DatabaseError

from ground.database import release_connection
from runs import transitions
from runs.approvals.completions import completion_url
from runs.runtime.errors import LeaseLost, RunCancelled
from runs.runtime.heartbeat import Heartbeat
from runs.runtime.loop import PlannedCall
from runs.runtime.step_ledger import withdraw_unstarted_fence
from runs.transitions import Lease, NextCall
from tools.contract import ToolContext
from tools.deadline import time_limit_of

logger = logging.getLogger(__name__)


class CallLease:
    """The lease's side of ``LeasedExecution``: set by its constructor."""

    lease: Lease
    lease_seconds: float
    operation_margin: float
    heartbeat: Heartbeat | None

    def between_operations(self) -> None:
        """Nothing is in flight but the runtime's own statements."""
        if self.heartbeat is not None:
            self.heartbeat.between_operations()

    def _lease_seconds_for(self, call: PlannedCall) -> float:
        if self.heartbeat is not None:
            # The heartbeat carries the lease through the call, up to its
            # limit plus the margin: a worker that dies mid-call is noticed
            # in a lease, not after the call's limit (G16).
            return self.lease_seconds
        # Without one, the lease must outlive the call, or a long write would
        # be reaped mid-call.
        return max(self.lease_seconds, time_limit_of(call.tool) + self.operation_margin)

    def _stop_if_handed_back(self, call: PlannedCall, key: str) -> None:
        if self.heartbeat is None or not self.heartbeat.handed_back:
            return
        # The record before the call may have stamped its fence: the call
        # never starts, so no write is left in doubt that never ran. (If the
        # database is away, the fence stands and the reaper decides on it.)
        if call.tool.effect.is_write:
            withdraw_unstarted_fence(self.lease, key)
        raise LeaseLost()

    @staticmethod
    def _renewal_for(call: PlannedCall, key: str) -> NextCall:
        if not call.tool.effect.is_write:
            return NextCall(fence="", call=None)
        stamp = {"tool": call.tool.name, "arguments": call.arguments, "idempotency_key": key}
        return NextCall(fence=call.tool.effect.value, call=stamp)

    def _context(self, call: PlannedCall, key: str) -> ToolContext:
        limit = time_limit_of(call.tool)
        if self.heartbeat is not None:
            self.heartbeat.tool_call(limit)
        # The call may take long, and a tool that reads the database does so
        # over its own thread's connection: the run's goes back to a pool.
        release_connection()
        return ToolContext(
            run_id=self.lease.run_id,
            idempotency_key=key,
            attempt=self.lease.token,
            timeout_seconds=limit,
            completion_url=completion_url(key) if call.tool.deferred else "",
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
