"""A call that waits for a person's answer or another system's completion,
and the end of that wait (G24).

- ``wait_for_input`` (``approvals.park``): the loop reached a call that
  waits — ``ask_person``'s question, a deferred tool's hand-off — and the
  run parks ``waiting_for_input``: no lease, no worker.
- ``answer_call``: the answer (or the completion) becomes the call's tool
  step — its outcome in the journal, replayed by every later attempt and
  never asked for again — with the request ``answered`` and, when nothing
  else waits, the run's release to the queue, in one transaction.
- ``expire_input_wait``: a wait past its expiry ends as its kind says: a
  question's result says nobody answered; a deferred read or idempotent
  write runs again with its key (a retry); a deferred
  ``non_idempotent_write`` was handed on, so it is in doubt (G13): the run
  fails with the call on its fence, for an operator to reconcile.

Lock order, as everywhere: the run's row, then its requests.
"""

import enum
from dataclasses import dataclass

from django.db.models import F
from django.db.models.functions import Now

from ground.commits import reaching_disk
from runs.models import AgentRun, ApprovalRequest, DeadLetter
from runs.models.edit_notice import told_of_edit
from runs.models.vocabulary import (
    ApprovalStatus,
    DeadLetterReason,
    FailureClass,
    RunStatus,
    StepKind,
    TerminationReason,
    WaitKind,
)
from runs.transitions.approvals import _released
from runs.transitions.common import append_steps, ending_changes, log_change, update_returning
from tools.effects import ToolEffect


class AnswerOutcome(enum.Enum):
    #: Recorded, and the run is back in the queue.
    RELEASED = "released"
    #: Recorded; another call of the run still waits, and so does the run.
    RECORDED = "recorded"
    #: Nothing changed: the request is not pending (answered, expired,
    #: withdrawn), the digest is not its own, or its run does not wait.
    STALE = "stale"


@dataclass(frozen=True)
class Answered:
    outcome: AnswerOutcome
    dispatch_count: int | None = None
    team_id: int | None = None


def answer_call(
    request_id: int,
    *,
    kind: str,
    answer,
    result=None,
    error: str = "",
    operator=None,
    digest: str | None = None,
    note: str = "",
) -> Answered:
    """Record ``answer`` for the waiting call ``request_id`` (a ``kind``
    request): the request ``answered`` (guarded by ``digest`` when given,
    and by its expiry), an ``input`` step saying who answered, and the
    call's ``tool`` step with ``result`` or ``error`` — what the model is
    told — then the run's release. All or nothing; raises DatabaseError
    when the database refused any of it (nothing changed, the run waits)."""
    with reaching_disk():
        run_id = _locked_waiting_run(request_id)
        if run_id is None:
            return Answered(AnswerOutcome.STALE)
        pending = ApprovalRequest.objects.filter(
            pk=request_id, kind=kind, status=ApprovalStatus.PENDING, expires_at__gt=Now()
        )
        if digest is not None:
            pending = pending.filter(digest=digest)
        if not pending.update(
            status=ApprovalStatus.ANSWERED,
            decided_by=operator,
            decided_at=Now(),
            answer=answer,
            note=note,
        ):
            return Answered(AnswerOutcome.STALE)
        request = ApprovalRequest.objects.get(pk=request_id)
        action = "answered" if kind == WaitKind.QUESTION else "completed"
        released = _release(
            request,
            [
                _input_step(request, action, operator=operator, note=note),
                _outcome_step(request, result=result, error=error),
            ],
        )
    log_change("answer_call", run_id, request=request_id, answer=action)
    return released


def expire_input_wait(request_id: int, *, as_of=None, max_requeues: int) -> tuple[str, Answered]:
    """End the wait of ``request_id`` if it is still pending past its expiry
    (``as_of`` replaces the database's now); returns what it did —
    ``question``, ``retry``, ``retries_exhausted``, ``in_doubt`` or ``""``
    (nothing: answered, or not yet expired) — and the release, if any."""
    now = as_of if as_of is not None else Now()
    with reaching_disk():
        run_id = _locked_waiting_run(request_id)
        if run_id is None:
            return "", Answered(AnswerOutcome.STALE)
        if not ApprovalRequest.objects.filter(
            pk=request_id, status=ApprovalStatus.PENDING, expires_at__lte=now
        ).update(status=ApprovalStatus.EXPIRED, decided_at=Now()):
            return "", Answered(AnswerOutcome.STALE)
        request = ApprovalRequest.objects.get(pk=request_id)
        if request.kind == WaitKind.QUESTION:
            error = (
                "no answer: nobody answered this question before it expired at "
                f"{request.expires_at.isoformat()}; go on without it, or ask again"
            )
            steps = [
                _input_step(request, "expired"),
                _outcome_step(request, result=None, error=error),
            ]
            return "question", _release(request, steps)
        if request.effect == ToolEffect.NON_IDEMPOTENT_WRITE:
            _end_in_doubt(request)
            return "in_doubt", Answered(AnswerOutcome.STALE)
        requeue_count = AgentRun.objects.filter(pk=run_id).values_list("requeue_count", flat=True)
        if requeue_count.get() >= max_requeues:
            _end(
                request,
                TerminationReason.RETRIES_EXHAUSTED,
                DeadLetterReason.RETRIES_EXHAUSTED,
                f"the deferred {request.effect} {request.tool_name!r} was not completed by "
                f"its deadline, {max_requeues} times: not handed on again",
            )
            return "retries_exhausted", Answered(AnswerOutcome.STALE)
        # A read or an idempotent write: running it again with its key (and
        # its completion URL) is safe, and a completion of the first hand-off
        # that comes late completes the second.
        released = _release(
            request, [_input_step(request, "expired", retry=True)], requeue_count=+1
        )
        return "retry", released


def _locked_waiting_run(request_id):
    """The request's run, locked, if it waits for input; else None."""
    run_id = ApprovalRequest.objects.filter(pk=request_id).values_list("run_id", flat=True).first()
    if run_id is None:
        return None
    waiting = (
        AgentRun.objects.select_for_update()
        .filter(pk=run_id, status=RunStatus.WAITING_FOR_INPUT)
        .values_list("pk", flat=True)
    )
    return run_id if waiting else None


def _release(request: ApprovalRequest, steps: list[dict], *, requeue_count: int = 0) -> Answered:
    """Append ``steps`` and let the run go back to the queue when no other
    call of it waits."""
    still_waiting = ApprovalRequest.objects.filter(
        run_id=request.run_id, status=ApprovalStatus.PENDING
    ).exists()
    changes = {} if still_waiting else _released()
    if requeue_count:
        changes["requeue_count"] = F("requeue_count") + requeue_count
    rows = update_returning(
        AgentRun.objects.filter(pk=request.run_id, status=RunStatus.WAITING_FOR_INPUT),
        ("dispatch_count", "team_id"),
        step_count=F("step_count") + len(steps),
        **changes,
    )
    append_steps(request.run_id, None, steps)
    if still_waiting:
        return Answered(AnswerOutcome.RECORDED)
    dispatch_count, team_id = rows[0]
    log_change("release", request.run_id, status=RunStatus.QUEUED)
    return Answered(AnswerOutcome.RELEASED, dispatch_count, team_id)


def _end_in_doubt(request: ApprovalRequest) -> None:
    _end(
        request,
        TerminationReason.COMPLETION_EXPIRED,
        DeadLetterReason.COMPLETION_EXPIRED,
        f"the deferred non_idempotent_write {request.tool_name!r} was handed on and not "
        f"completed by {request.expires_at.isoformat()}: whether it took effect is unknown "
        "(idempotency key {key}); it is not run again",
        fence=True,
    )


def _end(request: ApprovalRequest, reason: str, letter: str, message: str, *, fence=False):
    """End the run ``failed`` with ``reason`` and a dead letter; with
    ``fence``, the call stands on it as a write in doubt (G13)."""
    message = message.replace("{key}", request.idempotency_key)
    call = {
        "effect": request.effect,
        "tool": request.tool_name,
        "arguments": request.arguments,
        "idempotency_key": request.idempotency_key,
    }
    fenced = {"pending_effect": request.effect, "pending_call": call} if fence else {}
    AgentRun.objects.filter(pk=request.run_id, status=RunStatus.WAITING_FOR_INPUT).update(
        step_count=F("step_count") + 1,
        **ending_changes(
            RunStatus.FAILED,
            reason,
            failure_class=FailureClass.UNKNOWN,
            error_type="CompletionExpired",
            error_message=message,
            **fenced,
        ),
    )
    append_steps(request.run_id, None, [_input_step(request, "expired")])
    DeadLetter.objects.create(
        run_id=request.run_id,
        reason=letter,
        failure_class=FailureClass.UNKNOWN,
        error_type="CompletionExpired",
        error_message=message,
    )
    log_change("expire_input_wait", request.run_id, status=RunStatus.FAILED, reason=reason)


def _editor_of(request: ApprovalRequest) -> str | None:
    """Who edited the call ``request`` waits on, if an approved edit made it."""
    if request.kind != WaitKind.DEFERRED:
        return None
    edits = ApprovalRequest.objects.filter(
        run_id=request.run_id,
        turn_sequence=request.turn_sequence,
        position=request.position,
        kind=WaitKind.APPROVAL,
        idempotency_key=request.idempotency_key,
        replaces__isnull=False,
        status=ApprovalStatus.APPROVED,
    )
    edit = edits.values_list("edited_by__username", flat=True).first()
    return None if edit is None else edit or "?"


def _input_step(request: ApprovalRequest, action: str, *, operator=None, note="", retry=False):
    result = {
        "action": action,
        "kind": request.kind,
        "request": request.pk,
        "position": request.position,
        "turn_sequence": request.turn_sequence,
        "idempotency_key": request.idempotency_key,
    }
    if operator is not None:
        result["operator"] = operator.get_username()
    if note:
        result["note"] = note
    if retry:
        result["retry"] = "run again with the same idempotency key"
    return {"kind": StepKind.INPUT, "tool_name": request.tool_name, "result": result}


def _outcome_step(request: ApprovalRequest, *, result, error: str) -> dict:
    """The call's outcome, as the journal holds every call's: a tool step
    with its key (the answer's or completion's, not the tool code's). A
    deferred call a person edited before it was handed on tells the model
    so, as a live call's result does (G24)."""
    editor = _editor_of(request)
    if editor is not None:
        result, error = told_of_edit(editor, request.arguments, result, error)
    return {
        "kind": StepKind.TOOL,
        "tool_name": request.tool_name,
        "effect": request.effect,
        "arguments": request.arguments,
        "result": None if error else result,
        "error": error,
        "idempotency_key": request.idempotency_key,
    }
