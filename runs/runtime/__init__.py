"""The runtime: a run from its claim to its settle.

claim (``attempt``) → journal replayed, if any (``journal``) → the agent
loop, provider ↔ tools (``loop``), watched by the lease, fence and audit
(``execution``) whose steps the ledger records (``step_ledger``) → settled,
parked for approval, or ended as a failed attempt (``failed_attempts``,
``retry``). A run's request is parsed and checked by ``run_request``;
``errors`` holds what the runtime raises to itself. While an attempt is in
flight its lease is kept in the background (``heartbeat``); a process that
keeps many runs in flight keeps them in ``run_threads``.

Start here (``starting``): ``enqueue`` stores a queued run and dispatches its job,
``run_queued`` is what the job does, ``run`` executes an interactive run
inline. The runtime writes no status itself: every change goes through
``runs.transitions``.
"""

from runs.runtime.attempt import claim_queued, execute_claimed, run_queued
from runs.runtime.starting import CallerInterrupted, enqueue, run

__all__ = ["CallerInterrupted", "claim_queued", "enqueue", "execute_claimed", "run", "run_queued"]
