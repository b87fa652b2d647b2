"""Approvals that end unused (G14): a wait nobody decided in time, a wait
a cancel ended, and the decisions of a run that stopped before it used them.

- ``expire_approvals``: the reaper ends runs whose calls waited too long.
- ``withdraw_approvals``: a cancel withdraws the pending requests of the
  run it ends.
- ``void_unused_decisions``: the approved and denied calls that never ran
  are withdrawn when their run stops or is brought back, so an approval is
  never spent by an attempt nobody approved.

Parking and deciding are ``approvals``'. Lock order, as there: the run's
row, then its approval rows.
"""

from django.db.models import Count, Exists, F, OuterRef, Subquery
from django.db.models.functions import Coalesce, Now

from ground.commits import reaching_disk
from runs.models import AgentRun, ApprovalRequest, RunStep
from runs.models.vocabulary import (
    ApprovalStatus,
    RunStatus,
    StepKind,
    TerminationReason,
    WaitKind,
)
from runs.transitions.common import ending_changes, log_change, update_returning
from tools.effects import ToolEffect


def expire_approvals(as_of=None) -> tuple[list[str], int]:
    """End ``failed``/``approval_expired`` every waiting run with a call
    that waited past its expiry (``as_of`` replaces the database's now):
    its pending requests expire with it, and a reaper step says why.
    Returns the ids of the runs it ended and how many requests expired."""
    now = as_of if as_of is not None else Now()
    overdue = ApprovalRequest.objects.filter(
        run=OuterRef("pk"), status=ApprovalStatus.PENDING, expires_at__lt=now
    )
    with reaching_disk():
        rows = update_returning(
            AgentRun.objects.filter(Exists(overdue), status=RunStatus.WAITING_FOR_APPROVAL),
            ("id", "step_count", "lease_token"),
            step_count=F("step_count") + 1,
            **ending_changes(
                RunStatus.FAILED,
                TerminationReason.APPROVAL_EXPIRED,
                error_type="ApprovalExpired",
                error_message="a call waited for approval longer than "
                "NRLLM_APPROVAL_TIMEOUT_SECONDS; nobody decided it",
            ),
        )
        if not rows:
            return [], 0
        ended = [str(run_id) for run_id, _, _ in rows]
        void_unused_decisions(ended)
        expired = ApprovalRequest.objects.filter(
            run_id__in=ended, status=ApprovalStatus.PENDING
        ).update(status=ApprovalStatus.EXPIRED, decided_at=Now())
        RunStep.objects.bulk_create(
            RunStep(
                run_id=run_id,
                sequence=sequence,
                lease_token=token,
                kind=StepKind.REAPER,
                result={"decision": "approval_expired", "reason": "nobody decided in time"},
            )
            for run_id, sequence, token in rows
        )
    for run_id in ended:
        log_change("expire_approvals", run_id, status=RunStatus.FAILED)
    return ended, expired


def withdraw_approvals(run_id) -> int:
    """The pending requests of a run that was cancelled while it waited
    (the caller holds the run's row: ``cancel``); returns how many. The
    decisions already made for the turn go with them
    (``void_unused_decisions``)."""
    void_unused_decisions([run_id])
    _fence_handed_on_writes(run_id)
    return ApprovalRequest.objects.filter(run_id=run_id, status=ApprovalStatus.PENDING).update(
        status=ApprovalStatus.WITHDRAWN, decided_at=Now()
    )


def _fence_handed_on_writes(run_id) -> None:
    """A deferred ``non_idempotent_write`` handed on and not completed when
    its run is cancelled may still take effect: it stands on the run's
    fence, a write in doubt an operator reconciles before any requeue runs
    it again (G10, G24). A deferred read or idempotent write runs again
    with its key, which is safe."""
    handed_on = (
        ApprovalRequest.objects.filter(
            run_id=run_id,
            status=ApprovalStatus.PENDING,
            kind=WaitKind.DEFERRED,
            effect=ToolEffect.NON_IDEMPOTENT_WRITE,
        )
        .values("tool_name", "arguments", "idempotency_key")
        .first()
    )
    if handed_on is not None:
        call = {
            "effect": ToolEffect.NON_IDEMPOTENT_WRITE.value,
            "tool": handed_on["tool_name"],
            "arguments": handed_on["arguments"],
            "idempotency_key": handed_on["idempotency_key"],
        }
        AgentRun.objects.filter(pk=run_id).update(
            pending_effect=ToolEffect.NON_IDEMPOTENT_WRITE, pending_call=call
        )


def void_unused_decisions(run_ids) -> int:
    """Withdraw the approved and denied calls of ``run_ids`` that have not
    run yet: the calls of each run's last turn past the outcomes its journal
    holds (a decision of an earlier turn was used, or can never match again
    after a restart). Who decided and the note are kept, and the approval
    steps on the run keep the history. Returns how many.

    Called where a wait or a run ends without the run going on — a cancel,
    an expiry — and where an operator brings an ended run back (the only
    way an ended run runs again): a run requeued after any end asks for
    those calls again, with new digests, so an approval given for a run
    that then stopped is never spent silently by an attempt nobody
    approved (G14). The caller holds the runs' rows; call it before their
    pending requests change."""
    last_turn = (
        RunStep.objects.filter(run=OuterRef("run"), kind=StepKind.LLM)
        .order_by("-sequence")
        .values("sequence")[:1]
    )
    outcomes = (
        RunStep.objects.filter(
            run=OuterRef("run"), kind=StepKind.TOOL, sequence__gt=OuterRef("turn_sequence")
        )
        .order_by()
        .values("run")
        .annotate(count=Count("pk"))
        .values("count")
    )
    decided = (
        ApprovalRequest.objects.filter(
            run_id__in=run_ids,
            status__in=[ApprovalStatus.APPROVED, ApprovalStatus.DENIED],
            turn_sequence=Subquery(last_turn),
        )
        .annotate(outcomes=Coalesce(Subquery(outcomes), 0))
        .values_list("pk", "position", "outcomes")
    )
    # A call's place is ``iteration.index``; the turn's outcomes are
    # recorded in call order, so the first ``outcomes`` calls have run.
    unused = [pk for pk, position, ran in decided if _call_index(position) >= ran]
    if not unused:
        return 0
    return ApprovalRequest.objects.filter(pk__in=unused).update(status=ApprovalStatus.WITHDRAWN)


def _call_index(position: str) -> int:
    return int(position.rpartition(".")[2])
