"""Approving and denying a call that waits (G14), for the admin and the API.

The permission ``runs.approve_write`` is checked here too, whatever the
caller checked: a crafted request without it changes nothing. With
``NRLLM_APPROVAL_SECOND_PERSON`` the user who submitted the run may deny its
calls but not approve them. The decision, its step on the run, the admin
log entry and (for the last call of the turn) the run's release commit
together or not at all; the run's job is dispatched after that commit.
"""

from django.conf import settings
from django.contrib.admin.models import CHANGE, LogEntry
from django.db import transaction

from runs import transitions
from runs.models import AgentRun, ApprovalRequest
from runs.models.metrics import APPROVAL_DECISION_SECONDS, APPROVAL_DECISIONS
from runs.models.vocabulary import ActionResult, ApprovalStatus, RunStatus
from runs.queue.dispatch import dispatch_or_fail
from runs.transitions import DecisionOutcome

APPROVE_PERMISSION = "runs.approve_write"
#: A decision's note, at most: the API and the inbox refuse a longer one (a
#: denial's note is the model's tool result, and is in the step and the log).
MAX_NOTE_CHARS = 10_000


def approve(approval: ApprovalRequest, operator, *, digest: str, note: str = "") -> ActionResult:
    """Approve the call ``approval`` names, as the operator saw it (``digest``)."""
    return _decide(approval, operator, approved=True, digest=digest, note=note)


def deny(approval: ApprovalRequest, operator, *, digest: str, note: str = "") -> ActionResult:
    """Deny it: it never executes, and the model is told (with ``note``)."""
    return _decide(approval, operator, approved=False, digest=digest, note=note)


def _may_decide(operator) -> ActionResult | None:
    """Why ``operator`` may decide no call at all (or None)."""
    if not operator.has_perm(APPROVE_PERMISSION):
        return ActionResult(
            False, "permission_denied", f"you need the permission {APPROVE_PERMISSION!r}"
        )
    return None


def may_approve(approval: ApprovalRequest, operator) -> ActionResult | None:
    """Why ``operator`` may not approve ``approval`` (or None): the
    permission, and four-eyes."""
    refused = _may_decide(operator)
    if refused is not None:
        return refused
    if settings.NRLLM_APPROVAL_SECOND_PERSON and _is_submitter(approval, operator):
        return ActionResult(
            False,
            "second_person_required",
            "you submitted this run: another operator must approve its calls "
            "(NRLLM_APPROVAL_SECOND_PERSON); you may deny them",
        )
    return None


def _is_submitter(approval: ApprovalRequest, operator) -> bool:
    if ApprovalRequest.run.is_cached(approval):
        # Joined by the caller (the inbox lists its calls so): who submitted
        # a run is set once, when it is created, so the row read is as good.
        submitted_by = approval.run.submitted_by_id
        return submitted_by is not None and submitted_by == operator.pk
    submitted_by = (
        AgentRun.objects.filter(pk=approval.run_id).values_list("submitted_by", flat=True).first()
    )
    return submitted_by is not None and submitted_by == operator.pk


def _decide(
    approval: ApprovalRequest, operator, *, approved: bool, digest: str, note: str
) -> ActionResult:
    refused = may_approve(approval, operator) if approved else _may_decide(operator)
    if refused is not None:
        return refused
    by_submitter = _is_submitter(approval, operator)
    word = "approved" if approved else "denied"
    with transaction.atomic():
        decided = transitions.decide_approval(
            approval.pk,
            digest=digest,
            approved=approved,
            operator=operator,
            note=note,
            by_submitter=by_submitter,
        )
        if decided.outcome is DecisionOutcome.STALE:
            return _why_stale(approval.pk, digest)
        LogEntry.objects.log_actions(
            operator.pk,
            AgentRun.objects.filter(pk=approval.run_id),
            CHANGE,
            change_message=(
                f"{word.title()} {approval.tool_name} at {approval.position}. {note}".strip()
            ),
            single_object=True,
        )
        transaction.on_commit(lambda: _count(word, decided.waited_seconds))
        if decided.dispatch_count is not None:
            run_id, dispatch_count = approval.run_id, decided.dispatch_count
            transaction.on_commit(lambda: dispatch_or_fail(run_id, dispatch_count=dispatch_count))
    if decided.outcome is DecisionOutcome.RELEASED:
        return ActionResult(True, word, f"{word}; the run goes back to the queue")
    return ActionResult(True, word, f"{word}; the run still waits for its other calls")


def _count(outcome: str, waited_seconds: float) -> None:
    APPROVAL_DECISIONS.labels(outcome).inc()
    APPROVAL_DECISION_SECONDS.labels(outcome).observe(waited_seconds)


def _why_stale(approval_id, digest: str) -> ActionResult:
    """Why a decision matched nothing, as the API's 409 says it."""
    approval = ApprovalRequest.objects.select_related("decided_by", "run").filter(pk=approval_id)
    approval = approval.first()
    if approval is None:
        return ActionResult(False, "not_found", "no such approval request")
    if approval.status != ApprovalStatus.PENDING:
        who = f" by {approval.decided_by.get_username()}" if approval.decided_by else ""
        return ActionResult(
            False, "already_decided", f"this call was {approval.status}{who} already"
        )
    if approval.digest != digest:
        return ActionResult(
            False,
            "stale_digest",
            "the digest is not this call's as it stands: the page was old or the run "
            "moved on; look at the call again",
        )
    if approval.run.status != RunStatus.WAITING_FOR_APPROVAL:
        return ActionResult(False, "not_waiting", f"the run is {approval.run.status}")
    return ActionResult(False, "expired", "this request has expired")
