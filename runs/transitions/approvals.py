"""Waiting for approval, and an operator's decision ending the wait (G14).

- ``wait_for_approval``: an attempt parks its run — the turn that asked is
  recorded, the calls' requests are created, the lease is released — in
  one transaction.
- ``decide_approval``: an operator's decision of one call, its step, and
  (when no call of the turn waits any more) the run's release back to the
  queue, in one transaction: if the step is refused, nothing is decided
  and the run stays waiting (fail-closed, as write audits are, G2).

- ``edit_approval``: a person edits a waiting call's arguments: the call is
  ``replaced`` and the edited one is a new request, with its own key and
  digest, waiting for its own approval (G24).

A wait that ends without a decision (expired, cancelled), and decisions a
stopped run never used, are ``unused_approvals``'. Waits for a person's
answer or a deferred call's completion are ``input_waits``'.

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
from runs.models import AgentRun, ApprovalRequest, RunStep
from runs.models.vocabulary import ApprovalStatus, RunMode, RunStatus, StepKind, WaitKind
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
from tools.contract import idempotency_key_for


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
    required_by: str  # "policy" or "request"; "" for a question or a deferred call
    kind: str = WaitKind.APPROVAL
    #: A deferred call's reference (``Deferred.reference``).
    reference: str = ""


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


#: ``digest``, for where a parameter of that name hides it.
digest_of = digest


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
    return park(
        lease,
        steps,
        calls,
        status=RunStatus.WAITING_FOR_APPROVAL,
        turn_sequence=turn_sequence,
        timeout_seconds=timeout_seconds,
        recorded=recorded,
        settle_reservations=settle_reservations,
    )


def park(
    lease: Lease,
    steps: list[dict],
    calls: list[WaitingCall],
    *,
    status: str,
    turn_sequence: int | None,
    timeout_seconds: float,
    recorded: int | None = None,
    settle_reservations: bool = False,
) -> tuple[ParkOutcome, list[ApprovalRequest]]:
    """``wait_for_approval``, for a run parked in ``status`` (either of
    ``RunStatus.waiting()``). A call waiting for input is one the loop
    reached mid-turn: ``turn_sequence`` None then means the run's last
    model turn, wherever it is among the steps."""
    with reaching_disk():
        rows = update_returning(
            owned_run_holding(lease, recorded).filter(cancel_requested_at__isnull=True),
            ("step_count",),
            status=status,
            lease_owner="",
            lease_expires_at=None,
            # A deferred write's hand-off ran under its fence; the park's
            # step is its record, and its wait's end settles its outcome.
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
            turn_sequence = _turn_of(lease.run_id, steps, first=step_count - len(steps))
        requested_at = _database_now(lease.run_id)
        requests = [
            ApprovalRequest(
                run_id=lease.run_id,
                kind=call.kind,
                lease_token=lease.token,
                turn_sequence=turn_sequence,
                position=call.position,
                tool_name=call.tool_name,
                effect=call.effect,
                arguments=call.arguments,
                idempotency_key=call.idempotency_key,
                asked_key=call.idempotency_key,
                reference=call.reference,
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
            "kind": StepKind.APPROVAL
            if status == RunStatus.WAITING_FOR_APPROVAL
            else StepKind.INPUT,
            "result": {
                "action": "requested",
                "turn_sequence": turn_sequence,
                "calls": [
                    {
                        "kind": request.kind,
                        "position": request.position,
                        "tool": request.tool_name,
                        "effect": request.effect,
                        "idempotency_key": request.idempotency_key,
                        "digest": request.digest,
                        "required_by": request.required_by,
                        **({"reference": request.reference} if request.reference else {}),
                    }
                    for request in requests
                ],
                "expires_at": requests[0].expires_at.isoformat(),
            },
        }
        if status != RunStatus.WAITING_FOR_APPROVAL:
            # The call waiting for input is the step's: a deferred write's
            # hand-off is recorded here (G2), with its key.
            (call,) = calls
            waiting_step.update(
                tool_name=call.tool_name,
                effect=call.effect,
                arguments=call.arguments,
                idempotency_key=call.idempotency_key,
            )
        append_steps(lease.run_id, lease.token, [*steps, waiting_step])
        add_spend_through_the_orm(
            lease.run_id, steps, lease_token=lease.token if settle_reservations else None
        )
        ApprovalRequest.objects.bulk_create(requests)
    log_change(
        "wait_for_approval" if status == RunStatus.WAITING_FOR_APPROVAL else "wait_for_input",
        lease.run_id,
        lease_token=lease.token,
        turn=turn_sequence,
        calls=len(requests),
    )
    return ParkOutcome.PARKED, requests


def _turn_of(run_id, steps: list[dict], *, first: int) -> int:
    """The sequence of the run's last model turn, among ``steps`` (numbered
    from ``first``) or recorded before them: the loop runs only the calls
    of its newest turn, so a call that waits is one of that turn's."""
    for offset in range(len(steps) - 1, -1, -1):
        if steps[offset]["kind"] == StepKind.LLM:
            return first + offset
    return (
        RunStep.objects.filter(run_id=run_id, kind=StepKind.LLM, sequence__lt=first)
        .order_by("-sequence")
        .values_list("sequence", flat=True)
        .first()
    )


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
            kind=WaitKind.APPROVAL,
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


@dataclass(frozen=True)
class Edited:
    """What ``edit_approval`` did: the new request, or None when nothing
    matched (``DecisionOutcome.STALE``'s cases)."""

    request: ApprovalRequest | None


def edit_approval(
    approval_id: int, *, digest: str, arguments, operator, note: str, timeout_seconds: float
) -> Edited:
    """Replace a waiting call with the same tool and ``arguments`` (checked
    by the caller against the tool's schema), guarded by the digest the
    editor saw: the call is marked ``replaced`` and the edited call inserted
    as a new pending request — its own idempotency key (its arguments'),
    its own digest, its own expiry — with an ``approval`` step saying who
    changed what. The run keeps waiting: the edit approves nothing (G24).
    All or nothing; raises DatabaseError when the database refused any of it."""
    with reaching_disk():
        run_id = (
            ApprovalRequest.objects.filter(pk=approval_id).values_list("run_id", flat=True).first()
        )
        if run_id is None:
            return Edited(None)
        waiting = (
            AgentRun.objects.select_for_update()
            .filter(pk=run_id, status=RunStatus.WAITING_FOR_APPROVAL)
            .values_list("pk", flat=True)
        )
        if not waiting:
            return Edited(None)
        replaced = ApprovalRequest.objects.filter(
            pk=approval_id,
            kind=WaitKind.APPROVAL,
            status=ApprovalStatus.PENDING,
            digest=digest,
            expires_at__gt=Now(),
        ).update(status=ApprovalStatus.REPLACED, decided_by=operator, decided_at=Now(), note=note)
        if not replaced:
            return Edited(None)
        original = ApprovalRequest.objects.get(pk=approval_id)
        requested_at = _database_now(run_id)
        edited = ApprovalRequest(
            run_id=run_id,
            kind=WaitKind.APPROVAL,
            lease_token=original.lease_token,
            turn_sequence=original.turn_sequence,
            position=original.position,
            tool_name=original.tool_name,
            effect=original.effect,
            arguments=arguments,
            idempotency_key=idempotency_key_for(
                str(run_id), original.position, original.tool_name, arguments
            ),
            asked_key=original.asked_key or original.idempotency_key,
            replaces=original,
            edited_by=operator,
            required_by=original.required_by,
            status=ApprovalStatus.PENDING,
            requested_at=requested_at,
            expires_at=requested_at + timedelta(seconds=timeout_seconds),
            note=note,
        )
        edited.digest = digest_of(edited)
        edited.save(force_insert=True)
        AgentRun.objects.filter(pk=run_id).update(step_count=F("step_count") + 1)
        step = {
            "kind": StepKind.APPROVAL,
            "tool_name": original.tool_name,
            "arguments": arguments,
            "result": {
                "action": "edited",
                "operator": operator.get_username(),
                "note": note,
                "approval": original.pk,
                "replaced_by": edited.pk,
                "position": original.position,
                "turn_sequence": original.turn_sequence,
                "arguments_before": original.arguments,
                "idempotency_key_before": original.idempotency_key,
                "idempotency_key": edited.idempotency_key,
                "digest": edited.digest,
            },
        }
        append_steps(run_id, None, [step])
    log_change("edit_approval", run_id, approval=approval_id, replaced_by=edited.pk)
    return Edited(edited)
