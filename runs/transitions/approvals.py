"""Waiting for approval, and an operator's decision ending the wait (G14).

- ``wait_for_approval``: an attempt parks its run — the turn that asked is
  recorded, the calls' requests are created, the lease is released — in
  one transaction.
- ``decide_approval``: an operator's decision of one call, its step, and
  (when no call of the turn waits any more) the run's release back to the
  queue, in one transaction: if the step is refused, nothing is decided
  and the run stays waiting (fail-closed, as write audits are, G2).

A wait that ends without a decision (expired, cancelled), and decisions a
stopped run never used, are ``unused_approvals``'.

Lock order, everywhere: the run's row, then its approval rows.
"""

import enum
import hashlib
import json
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import F
from django.db.models.functions import Now

from ground.commits import reaching_disk
from runs.models import AgentRun, ApprovalRequest
from runs.models.vocabulary import ApprovalStatus, RunMode, RunStatus, StepKind
from runs.transitions.common import (
    Lease,
    append_steps,
    db_time,
    log_change,
    owned_run,
    owned_run_holding,
    steps_lost,
    update_returning,
)
from runs.transitions.steps import add_spend_through_the_orm, usage_totals


class ParkOutcome(enum.Enum):
    PARKED = "parked"
    #: A cancel is pending: the run is not parked; the attempt ends it.
    CANCEL_REQUESTED = "cancel_requested"
    LEASE_LOST = "lease_lost"
    #: Not parked: the run holds fewer of the attempt's steps than it had
    #: recorded (``RecordOutcome.STEPS_LOST``).
    STEPS_LOST = "steps_lost"


@dataclass(frozen=True)
class WaitingCall:
    """A call of the turn that waits for a decision."""

    position: str
    tool_name: str
    effect: str
    arguments: object
    idempotency_key: str
    required_by: str  # "policy" or "request"


def digest(request: ApprovalRequest) -> str:
    """The digest a decision of ``request``'s call must carry: its run, the
    attempt that asked, the turn, and the call (place, tool, effect,
    arguments, idempotency key). A page shown before the run moved on
    (decided by someone else, expired, cancelled, asked again by a later
    attempt) carries a digest that matches nothing."""
    material = json.dumps(
        [
            str(request.run_id),
            request.lease_token,
            request.turn_sequence,
            request.position,
            request.tool_name,
            request.effect,
            request.arguments,
            request.idempotency_key,
        ],
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(material.encode()).hexdigest()


def wait_for_approval(
    lease: Lease,
    steps: list[dict],
    calls: list[WaitingCall],
    *,
    turn_sequence: int | None,
    timeout_seconds: float,
    recorded: int | None = None,
    settle_reservations: bool = False,
) -> tuple[ParkOutcome, list[ApprovalRequest]]:
    """Park the run: record ``steps`` (any still unwritten, then — for a
    turn asked live — the turn itself, which must be the last of them),
    create a pending request for each of ``calls`` and release the lease:
    ``running → waiting_for_approval``, all or nothing. ``turn_sequence``:
    the turn's step if it was recorded before (a resumed attempt), else
    None. Raises DatabaseError (nothing changed, or — a broken connection
    — perhaps everything: the attempt's settle then matches nothing).
    ``recorded``: as ``record_steps``'. ``settle_reservations``: the
    attempt reserved before its calls, and this settles them (G21).
    """
    with reaching_disk():
        rows = update_returning(
            owned_run_holding(lease, recorded).filter(cancel_requested_at__isnull=True),
            ("step_count",),
            status=RunStatus.WAITING_FOR_APPROVAL,
            lease_owner="",
            lease_expires_at=None,
            pending_effect="",
            pending_call=None,
            step_count=F("step_count") + len(steps) + 1,
            attempt_steps=F("attempt_steps") + len(steps),
            # The turn that asked (and any unwritten before it) spent tokens.
            **usage_totals(steps),
        )
        if not rows:
            if steps_lost(lease, recorded):
                return ParkOutcome.STEPS_LOST, []
            if owned_run(lease).filter(cancel_requested_at__isnull=False).exists():
                return ParkOutcome.CANCEL_REQUESTED, []
            return ParkOutcome.LEASE_LOST, []
        (step_count,) = rows[0]
        if turn_sequence is None:
            turn_sequence = step_count - 1  # the turn: the last of ``steps``
        requested_at = _database_now(lease.run_id)
        requests = [
            ApprovalRequest(
                run_id=lease.run_id,
                lease_token=lease.token,
                turn_sequence=turn_sequence,
                position=call.position,
                tool_name=call.tool_name,
                effect=call.effect,
                arguments=call.arguments,
                idempotency_key=call.idempotency_key,
                required_by=call.required_by,
                status=ApprovalStatus.PENDING,
                requested_at=requested_at,
                expires_at=requested_at + timedelta(seconds=timeout_seconds),
            )
            for call in calls
        ]
        for request in requests:
            request.digest = digest(request)
        waiting_step = {
            "kind": StepKind.APPROVAL,
            "result": {
                "action": "requested",
                "turn_sequence": turn_sequence,
                "calls": [
                    {
                        "position": request.position,
                        "tool": request.tool_name,
                        "effect": request.effect,
                        "idempotency_key": request.idempotency_key,
                        "digest": request.digest,
                        "required_by": request.required_by,
                    }
                    for request in requests
                ],
                "expires_at": requests[0].expires_at.isoformat(),
            },
        }
        append_steps(lease.run_id, lease.token, [*steps, waiting_step])
        add_spend_through_the_orm(
            lease.run_id, steps, lease_token=lease.token if settle_reservations else None
        )
        ApprovalRequest.objects.bulk_create(requests)
    log_change(
        "wait_for_approval",
        lease.run_id,
        lease_token=lease.token,
        turn=turn_sequence,
        calls=len(requests),
    )
    return ParkOutcome.PARKED, requests


def _database_now(run_id):
    """The database's clock now: every expiry is the database's time, as
    every lease is."""
    now = AgentRun.objects.filter(pk=run_id).annotate(now=Now()).values_list("now", flat=True)
    return now.get()


@dataclass(frozen=True)
class Decided:
    """What ``decide_approval`` did."""

    outcome: "DecisionOutcome"
    #: The new job's dispatch number when the run was released.
    dispatch_count: int | None = None
    #: How long the call waited for its decision.
    waited_seconds: float = 0.0


class DecisionOutcome(enum.Enum):
    #: Decided; another call of the turn still waits, so the run does too.
    DECIDED = "decided"
    #: Decided, and it was the last: the run is back in the queue.
    RELEASED = "released"
    #: Nothing changed: the digest is not the request's as it stands, or it
    #: was decided, expired or withdrawn already, or its run does not wait.
    STALE = "stale"


def decide_approval(
    approval_id: int,
    *,
    digest: str,
    approved: bool,
    operator,
    note: str,
    by_submitter: bool,
) -> Decided:
    """Decide one waiting call, guarded by the digest the operator saw; the
    decision's step and, for the last one, the release (``waiting →
    queued``, a worker's from now on) commit with it or not at all.
    Raises DatabaseError when the database refused any of it: then nothing
    changed, and the run still waits."""
    status = ApprovalStatus.APPROVED if approved else ApprovalStatus.DENIED
    with reaching_disk():
        run_id = (
            ApprovalRequest.objects.filter(pk=approval_id).values_list("run_id", flat=True).first()
        )
        if run_id is None:
            return Decided(DecisionOutcome.STALE)
        # The run's row first (every transition here locks in that order):
        # two decisions of one run's calls take turns, so exactly one of
        # them sees no call left waiting and releases the run.
        waiting = (
            AgentRun.objects.select_for_update()
            .filter(pk=run_id, status=RunStatus.WAITING_FOR_APPROVAL)
            .values_list("pk", flat=True)
        )
        if not waiting:
            return Decided(DecisionOutcome.STALE)
        decided = ApprovalRequest.objects.filter(
            pk=approval_id,
            status=ApprovalStatus.PENDING,
            digest=digest,
            expires_at__gt=Now(),
        ).update(
            status=status,
            decided_by=operator,
            decided_at=Now(),
            note=note,
            by_submitter=by_submitter,
        )
        if not decided:
            return Decided(DecisionOutcome.STALE)
        request = ApprovalRequest.objects.get(pk=approval_id)
        waited = (request.decided_at - request.requested_at).total_seconds()
        still_waiting = ApprovalRequest.objects.filter(
            run_id=run_id, status=ApprovalStatus.PENDING
        ).exists()
        release = {} if still_waiting else _released()
        rows = update_returning(
            AgentRun.objects.filter(pk=run_id, status=RunStatus.WAITING_FOR_APPROVAL),
            ("dispatch_count",),
            step_count=F("step_count") + 1,
            **release,
        )
        step = {
            "kind": StepKind.APPROVAL,
            "tool_name": request.tool_name,
            "arguments": request.arguments,
            "result": {
                "action": status.value,
                "operator": operator.get_username(),
                "note": note,
                "approval": request.pk,
                "position": request.position,
                "turn_sequence": request.turn_sequence,
                "idempotency_key": request.idempotency_key,
                "digest": request.digest,
                "by_submitter": by_submitter,
                "waited_seconds": round(waited, 3),
            },
        }
        append_steps(run_id, None, [step])
    log_change("decide_approval", run_id, approval=approval_id, decision=status.value)
    if still_waiting:
        return Decided(DecisionOutcome.DECIDED, waited_seconds=waited)
    log_change("release", run_id, status=RunStatus.QUEUED)
    return Decided(DecisionOutcome.RELEASED, rows[0][0], waited)


def _released() -> dict:
    return {
        "status": RunStatus.QUEUED,
        # A worker executes it from now on, whoever started it (an
        # interactive caller is long gone): the reaper treats it as a
        # worker's (G7).
        "mode": RunMode.QUEUED,
        "dispatch_count": F("dispatch_count") + 1,
        "available_at": db_time(),
    }
