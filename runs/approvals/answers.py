"""Answering the agent's question, and another system completing a deferred
call (G24), for the console, the API and the completion URL.

- **Answer** (``ask_person``): a runner of the run's team — someone who
  could have started the run, and so sent the agent on themselves — answers
  in the inbox or through the API, carrying the digest they saw. The answer
  is checked against the question's ``answer_schema`` (a plain string
  without one); a bad answer stores nothing. Four-eyes does not apply: an
  answer releases no write by itself, and any write it leads to waits for
  its own approval.
- **Complete** (a deferred tool): the other system POSTs ``{"result": …}``
  or ``{"error": "…"}`` to the call's signed URL. The same completion again
  is a 200 that changes nothing; a different one is a 409.

Either is recorded once, as the call's tool step (what the model is told),
with the request ``answered`` and the run's release, in one transaction;
the run's job is dispatched after that commit.
"""

import json

from django.db import transaction

from runs import transitions
from runs.approvals.actions import RUN_PERMISSION, RunFacts, log_on_run
from runs.approvals.completions import is_signed
from runs.models import AgentRun, ApprovalRequest
from runs.models.metrics import APPROVAL_DECISIONS
from runs.models.vocabulary import ActionResult, ApprovalStatus, RunStatus, WaitKind
from runs.queue.dispatch import dispatch_or_fail
from runs.transitions import AnswerOutcome
from teams import access
from tools.canonical import MAX_JSON_DEPTH, as_journaled, nested_deeper_than, storable_text
from tools.validation import argument_errors

#: The longest answer or completion, as JSON: it is the model's next input.
MAX_ANSWER_CHARS = 32_000
#: The longest error a completion may report.
MAX_ERROR_CHARS = 10_000

_GONE = ActionResult(False, "not_found", "no such question")
_NOT_WAITING = ActionResult(
    False,
    "not_waiting",
    "no call with this key waits for a completion yet: if it was just handed on, or is "
    "being handed on again, try again in a moment",
)


def may_answer(request: ApprovalRequest, user) -> ActionResult | None:
    """Why ``user`` may not answer ``request``'s question (or None): they
    must be a runner in the run's team."""
    facts = RunFacts.of(request)
    if facts is None:
        return _GONE
    if not access.may(user, RUN_PERMISSION, facts.team.pk):
        return ActionResult(
            False,
            "not_runner",
            f"you are not a runner in team {facts.team.slug!r}: answering its agents' "
            f"questions takes the runner role there ({RUN_PERMISSION})",
        )
    return None


def answer_errors(request: ApprovalRequest, answer) -> list[str]:
    """Why ``answer`` does not answer ``request``'s question, each naming
    its place (``answer.when``), or none."""
    schema = (request.arguments or {}).get("answer_schema")
    if schema is None:
        if not isinstance(answer, str) or not answer.strip():
            return ["answer: must be a non-empty string (the question gives no answer_schema)"]
        problems = []
    else:
        problems = [f"answer{_at(problem)}" for problem in argument_errors(schema, answer)]
    if not problems and len(json.dumps(answer)) > MAX_ANSWER_CHARS:
        problems = [f"answer: longer than {MAX_ANSWER_CHARS} characters as JSON"]
    return problems


def _at(problem: str) -> str:
    """``argument_errors`` names a path as ``when: …`` or ``(arguments): …``."""
    if problem.startswith("(arguments)"):
        return problem.removeprefix("(arguments)")
    return "." + problem


def answer(request: ApprovalRequest, user, *, digest: str, answer, note: str = "") -> ActionResult:
    """Answer the question ``request`` holds, as ``user`` saw it (``digest``)."""
    if request.kind != WaitKind.QUESTION:
        return ActionResult(False, "not_a_question", "this call does not wait for an answer")
    refused = may_answer(request, user)
    if refused is not None:
        return refused
    if nested_deeper_than(answer):
        return ActionResult(
            False, "invalid_answer", f"answer: nested more than {MAX_JSON_DEPTH} levels"
        )
    answer = as_journaled(answer)
    problems = answer_errors(request, answer)
    if problems:
        return ActionResult(False, "invalid_answer", "; ".join(problems))
    with transaction.atomic():
        answered = transitions.answer_call(
            request.pk,
            kind=WaitKind.QUESTION,
            answer=answer,
            result={"answer": answer, "answered_by": user.get_username()},
            operator=user,
            digest=digest,
            note=note,
        )
        if answered.outcome is AnswerOutcome.STALE:
            return _why_not_waiting(request.pk, digest)
        log_on_run(
            user,
            request.run_id,
            f"Answered the agent's question at {request.position}. {note}".strip(),
        )
        _dispatch_after_commit(request.run_id, answered, "answered")
    return ActionResult(True, "answered", "answered; the run goes back to the queue")


def complete(idempotency_key: str, signature: str, body) -> ActionResult:
    """A deferred call's completion, from the other system: ``body`` is
    ``{"result": <JSON>}`` or ``{"error": "<text>"}``. ``not_found`` for a
    URL not signed by this deployment (said the same way as an unknown
    call)."""
    if not is_signed(idempotency_key, signature):
        return ActionResult(False, "not_found", "no such deferred call")
    completion, problem = _completion_of(body)
    if problem:
        return ActionResult(False, "invalid_completion", problem)
    request = _newest_request(idempotency_key)
    if request is None:
        return _NOT_WAITING
    if request.status == ApprovalStatus.PENDING:
        with transaction.atomic():
            answered = transitions.answer_call(
                request.pk,
                kind=WaitKind.DEFERRED,
                answer=completion,
                result=completion.get("result"),
                error=_told_error(completion),
            )
            if answered.outcome is not AnswerOutcome.STALE:
                _dispatch_after_commit(request.run_id, answered, "completed")
                return ActionResult(True, "completed", "completed; the run goes on")
        request = _newest_request(idempotency_key)
    if request.status == ApprovalStatus.ANSWERED:
        if _same_json(request.answer, completion):
            return ActionResult(True, "unchanged", "this completion was recorded already")
        return ActionResult(
            False,
            "conflict",
            "this call was completed already with another result; it is kept",
        )
    if request.status == ApprovalStatus.EXPIRED and not _run_ended(request.run_id):
        # A deferred read or idempotent write past its deadline runs again
        # under the same key: its next hand-off takes this completion.
        return _NOT_WAITING
    if request.status == ApprovalStatus.PENDING:
        # Pending, yet the record matched nothing: past its expiry, before
        # the reaper ends the wait (or its run no longer waits).
        return ActionResult(
            False, "expired", "this call's wait has expired: it takes no completion"
        )
    return ActionResult(
        False, request.status, f"this call's wait has {request.status}: it takes no completion"
    )


def _run_ended(run_id) -> bool:
    status = AgentRun.objects.filter(pk=run_id).values_list("status", flat=True).first()
    return status is None or status in RunStatus.terminal()


def _same_json(recorded, completion) -> bool:
    """Equal as JSON, types included: ``true`` is not ``1``."""
    return json.dumps(recorded, sort_keys=True) == json.dumps(completion, sort_keys=True)


def _completion_of(body) -> tuple[dict, str]:
    if not isinstance(body, dict) or set(body) not in ({"result"}, {"error"}):
        return {}, 'the body must be {"result": <any JSON>} or {"error": "<text>"}, one of them'
    if "error" in body:
        error = body["error"]
        if not isinstance(error, str) or not error.strip():
            return {}, "error: must be a non-empty string"
        if len(error) > MAX_ERROR_CHARS:
            return {}, f"error: longer than {MAX_ERROR_CHARS} characters"
        return {"error": storable_text(error)}, ""
    if nested_deeper_than(body["result"]):
        return {}, f"result: nested more than {MAX_JSON_DEPTH} levels"
    result = as_journaled(body["result"])
    if len(json.dumps(result)) > MAX_ANSWER_CHARS:
        return {}, f"result: longer than {MAX_ANSWER_CHARS} characters as JSON"
    return {"result": result}, ""


def _told_error(completion: dict) -> str:
    if "error" not in completion:
        return ""
    return f"the system this call was handed to reported an error: {completion['error']}"


def _newest_request(idempotency_key: str) -> ApprovalRequest | None:
    """The call's newest deferred request: a deferred read or idempotent
    write run again after its deadline waits under the same key."""
    return (
        ApprovalRequest.objects.filter(kind=WaitKind.DEFERRED, idempotency_key=idempotency_key)
        .order_by("-requested_at", "-pk")
        .first()
    )


def _dispatch_after_commit(run_id, answered, outcome: str) -> None:
    transaction.on_commit(lambda: APPROVAL_DECISIONS.labels(outcome).inc())
    if answered.outcome is AnswerOutcome.RELEASED:
        dispatch_count, team_id = answered.dispatch_count, answered.team_id
        transaction.on_commit(
            lambda: dispatch_or_fail(run_id, dispatch_count=dispatch_count, team_id=team_id)
        )


def _why_not_waiting(request_id, digest: str) -> ActionResult:
    request = ApprovalRequest.objects.select_related("decided_by", "run").filter(pk=request_id)
    request = request.first()
    if request is None:
        return _GONE
    if request.status != ApprovalStatus.PENDING:
        who = f" by {request.decided_by.get_username()}" if request.decided_by else ""
        return ActionResult(
            False, "already_answered", f"this question was {request.status}{who} already"
        )
    if request.digest != digest:
        return ActionResult(
            False,
            "stale_digest",
            "the digest is not this question's as it stands: look at it again",
        )
    if request.run.status != RunStatus.WAITING_FOR_INPUT:
        return ActionResult(False, "not_waiting", f"the run is {request.run.status}")
    return ActionResult(False, "expired", "this question has expired")
