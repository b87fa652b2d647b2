"""G24 end to end, with real rqworker processes, PostgreSQL, Redis and both
the scripted and the drifting model: an edited write is a new call that a
second person approves and that executes once, as edited, with the model
told; an answered question is recorded once and replayed after a SIGKILL;
a deferred call's completion is recorded once; a deferred
non-idempotent write past its deadline is in doubt, never handed on again,
and a deferred read past its deadline runs again with its key."""

import pytest
from rest_framework.test import APIClient

from runs.approvals import actions as approval_actions
from runs.models import ApprovalRequest, DeadLetter, RunEvent
from runs.models.selectors import is_write_in_doubt
from runs.models.vocabulary import (
    ApprovalStatus,
    RunStatus,
    StepKind,
    TerminationReason,
    WaitKind,
)
from runs.operators import actions as operator_actions
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from tests.conftest import APPROVER_PERMISSIONS, _user
from tests.deferred_tools import DEFERRED_TOOLS, hand_offs
from tests.drifting_model import NOTIFY, request_for
from tests.helpers import fresh, later, step_inserts_held, wait_until
from tools.models import OutboxNotification

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("approvals"),
    pytest.mark.worker,
]

ASK = {
    "name": "ask_person",
    "arguments": {
        "question": "Which host is broken (take {take})?",
        "answer_schema": {
            "type": "object",
            "properties": {"host": {"type": "string", "pattern": "^db-[0-9]+$"}},
            "required": ["host"],
            "additionalProperties": False,
        },
    },
}
OPEN_TICKET = {"name": "open_ticket", "arguments": {"title": "restart db-2 (take {take})"}}
LOOK_UP = {"name": "look_up_ticket", "arguments": {"title": "who owns db-2 (take {take})"}}
EDITED = {"recipient": "ops", "message": "restarting db-2, not db-1"}


def model_name(model) -> str:
    return "scripted" if model is None else "drifting"


def the_requests(agent_run) -> list[ApprovalRequest]:
    return list(ApprovalRequest.objects.filter(run=agent_run).order_by("pk"))


def again(request: ApprovalRequest) -> ApprovalRequest:
    return ApprovalRequest.objects.get(pk=request.pk)


def told(model, text: str) -> bool:
    """Whether the drifting model's last conversation has a tool result with ``text``."""
    return any(
        message["role"] == "tool" and text in message["content"]
        for message in model.conversations[-1]
    )


def killed_at(workers, held: str, *, what: str) -> None:
    """A worker takes the run and is SIGKILLed while a step where ``held``
    holds waits to be inserted (it never becomes durable)."""
    with step_inserts_held(held) as (waiting, end_the_wait):
        worker = workers.start(NRLLM_LEASE_SECONDS=2)
        wait_until(waiting, timeout=30, what=what)
        workers.kill(worker)
        end_the_wait()


@pytest.fixture
def deferred_tools(settings):
    """The deferred tools, their calls not waiting for an approval first."""
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, *DEFERRED_TOOLS]
    settings.NRLLM_APPROVAL_REQUIRED_FOR = "none"
    return settings


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_an_edit_a_second_person_approves_executes_once_as_edited_and_the_model_is_told(
    model, settings, queue, workers, operator
):
    settings.NRLLM_APPROVAL_SECOND_PERSON = True
    plan = [{"calls": [NOTIFY]}, {"answer": "done (take {take})"}]
    agent_run = enqueue(request_for(model_name(model), plan, ["send_notification"]))
    workers.run_burst()
    (asked,) = the_requests(agent_run)

    edited = approval_actions.edit(
        asked, operator, digest=asked.digest, arguments=EDITED, note="db-2 is the broken one"
    )
    assert edited.ok, edited
    new = edited.made
    assert new.idempotency_key != asked.idempotency_key and new.digest != asked.digest
    assert again(asked).status == ApprovalStatus.REPLACED
    # Under four-eyes the editor cannot approve their own edit.
    own = approval_actions.approve(new, operator, digest=new.digest)
    assert (own.ok, own.code) == (False, "second_person_required")
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    petra = _user("petra", staff=True, permissions=APPROVER_PERMISSIONS)
    assert approval_actions.approve(new, petra, digest=new.digest).ok

    # The worker taking the released run dies after the edited write's step
    # is durable, before the final answer: the next one replays the edited
    # call as recorded, never runs it again.
    killed_at(workers, "NEW.kind = 'llm'", what="the final answer's step")
    assert "requeued" in reap_stale_runs(as_of=later()).decisions[str(agent_run.pk)]
    workers.run_burst()

    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    (notification,) = OutboxNotification.objects.all()
    assert (notification.recipient, notification.message) == (
        EDITED["recipient"],
        EDITED["message"],
    )
    assert notification.idempotency_key == new.idempotency_key
    write = agent_run.steps.get(kind=StepKind.TOOL)
    assert (write.arguments, write.idempotency_key) == (EDITED, new.idempotency_key)
    assert write.result["arguments"] == EDITED
    assert "olivia" in write.result["notice"] and "edited this call" in write.result["notice"]
    if model is not None:
        assert told(model, "edited this call") and told(model, EDITED["message"])
        assert model.requests_by_turn[0] == 1, model.requests_by_turn


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_an_answer_through_the_api_reaches_the_model_once_across_a_sigkill(
    model, queue, workers, api
):
    plan = [{"calls": [ASK]}, {"answer": "restarted (take {take})"}]
    agent_run = enqueue(request_for(model_name(model), plan, ["ask_person"]))
    workers.run_burst()
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.WAITING_FOR_INPUT
    assert (agent_run.lease_owner, agent_run.lease_expires_at) == ("", None)
    (question,) = the_requests(agent_run)
    assert question.kind == WaitKind.QUESTION

    url = f"/api/approvals/{question.pk}/answer/"
    bad = api.post(url, {"digest": question.digest, "answer": {"host": "db-1; rm"}}, format="json")
    assert bad.status_code == 400 and "answer.host" in bad.json()["detail"], bad.content
    assert again(question).status == ApprovalStatus.PENDING
    assert fresh(agent_run).step_count == agent_run.step_count
    answered = api.post(url, {"digest": question.digest, "answer": {"host": "db-2"}}, format="json")
    assert answered.status_code == 200, answered.content

    # The worker resuming the run dies before its first step is durable.
    killed_at(workers, "NEW.kind = 'resume'", what="the resumed attempt's first step")
    assert "requeued" in reap_stale_runs(as_of=later()).decisions[str(agent_run.pk)]
    workers.run_burst()

    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    assert the_requests(agent_run) == [question]  # never asked again
    outcome = agent_run.steps.get(kind=StepKind.TOOL)
    assert outcome.result == {"answer": {"host": "db-2"}, "answered_by": "olivia"}
    if model is not None:
        assert told(model, "db-2")
        assert model.requests_by_turn[0] == 1, model.requests_by_turn


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_a_deferred_completion_posted_twice_gives_one_result(
    model, deferred_tools, queue, workers, operator
):
    # As shipped, the hand-off (a non-idempotent write) waits for an approval first.
    deferred_tools.NRLLM_APPROVAL_REQUIRED_FOR = "non_idempotent_write"
    plan = [{"calls": [OPEN_TICKET]}, {"answer": "ticket done (take {take})"}]
    agent_run = enqueue(request_for(model_name(model), plan, ["open_ticket"]))
    workers.run_burst()
    (approval,) = the_requests(agent_run)
    assert approval_actions.approve(approval, operator, digest=approval.digest).ok
    assert hand_offs(agent_run.pk) == []
    workers.run_burst()
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_INPUT
    (hand_off,) = hand_offs(agent_run.pk)
    approved, deferred = the_requests(agent_run)
    assert (deferred.kind, deferred.reference) == (WaitKind.DEFERRED, f"TICKET-{hand_off.pk}")
    assert hand_off.idempotency_key == approved.idempotency_key == deferred.idempotency_key

    outside = APIClient()
    completion = {"result": {"restarted": "db-2"}}
    first = outside.post(hand_off.message, completion, format="json")
    again = outside.post(hand_off.message, completion, format="json")
    other = outside.post(hand_off.message, {"result": {"restarted": "db-1"}}, format="json")
    forged = outside.post(hand_off.message.rstrip("/") + "x/", completion, format="json")
    assert (first.status_code, first.json()["status"]) == (200, "completed"), first.content
    assert (again.status_code, again.json()["status"]) == (200, "unchanged"), again.content
    assert other.status_code == 409 and forged.status_code == 404
    workers.run_burst()

    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    (outcome,) = agent_run.steps.filter(kind=StepKind.TOOL)
    assert outcome.result == {"restarted": "db-2"}
    assert outcome.idempotency_key == hand_off.idempotency_key
    assert len(hand_offs(agent_run.pk)) == 1
    if model is not None:
        assert told(model, "db-2")


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_a_deferred_non_idempotent_write_past_its_deadline_is_in_doubt_not_retried(
    model, deferred_tools, queue, workers, operator
):
    plan = [{"calls": [OPEN_TICKET]}, {"answer": "ticket done (take {take})"}]
    agent_run = enqueue(request_for(model_name(model), plan, ["open_ticket"]))
    workers.run_burst()
    (hand_off,) = hand_offs(agent_run.pk)

    report = reap_stale_runs(as_of=later(2 * 86400))
    assert "in doubt" in report.decisions[str(agent_run.pk)], report.decisions
    workers.run_burst()

    agent_run = fresh(agent_run)
    assert (agent_run.status, agent_run.termination_reason) == (
        RunStatus.FAILED,
        TerminationReason.COMPLETION_EXPIRED,
    )
    assert agent_run.pending_call["idempotency_key"] == hand_off.idempotency_key
    assert is_write_in_doubt(agent_run)
    assert DeadLetter.objects.get(run=agent_run).reason == "completion_expired"
    assert operator_actions.requeue(agent_run, operator).code == "write_in_doubt"
    late = APIClient().post(hand_off.message, {"result": "done"}, format="json")
    assert late.status_code == 409, late.content
    assert len(hand_offs(agent_run.pk)) == 1  # never handed on again


def test_a_deferred_read_past_its_deadline_runs_again_with_its_key(deferred_tools, queue, workers):
    plan = [{"calls": [LOOK_UP]}, {"answer": "found (take {take})"}]
    agent_run = enqueue(request_for("scripted", plan, ["look_up_ticket"]))
    workers.run_burst()

    report = reap_stale_runs(as_of=later(2 * 86400))
    assert "runs again" in report.decisions[str(agent_run.pk)], report.decisions
    workers.run_burst()
    first, second = hand_offs(agent_run.pk)
    assert (first.idempotency_key, first.message) == (second.idempotency_key, second.message)
    assert fresh(agent_run).requeue_count == 1

    # A completion of the first hand-off, late, completes the call.
    assert APIClient().post(first.message, {"result": "alice"}, format="json").status_code == 200
    workers.run_burst()
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    expired, completed = the_requests(agent_run)
    assert (expired.status, completed.status) == (ApprovalStatus.EXPIRED, ApprovalStatus.ANSWERED)


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_a_rerun_replays_an_edited_call_as_recorded(model, operator):
    """In-process: the edited write ran; a rerun from the final turn copies
    its outcome and never sends it again."""
    from runs.operators.rerun import rerun_from

    plan = [{"calls": [NOTIFY]}, {"answer": "done (take {take})"}]
    agent_run = enqueue(request_for(model_name(model), plan, ["send_notification"]))
    (asked,) = the_requests(agent_run)
    new = approval_actions.edit(asked, operator, digest=asked.digest, arguments=EDITED).made
    assert approval_actions.approve(new, operator, digest=new.digest).ok
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    final = agent_run.steps.filter(kind=StepKind.LLM).order_by("-sequence").first()

    rerun = rerun_from(
        agent_run,
        final.sequence,
        operator,
        confirm_past_write=True,
        submitted_via="console",
    )
    assert rerun.ok, rerun.detail
    rerun_run = fresh(rerun.run)
    assert rerun_run.status == RunStatus.COMPLETED, rerun_run.error_message
    copied = rerun_run.steps.get(kind=StepKind.TOOL)
    assert (copied.arguments, copied.result) == (
        EDITED,
        agent_run.steps.get(kind=StepKind.TOOL).result,
    )
    assert OutboxNotification.objects.count() == 1


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_an_unanswered_question_becomes_the_calls_result_and_the_run_goes_on(model, settings):
    """In-process: the reaper answers a question past its expiry for nobody.
    The run-ended webhook is told of the wait, then of the end."""
    settings.NRLLM_HTTP_ALLOWED_HOSTS = ["127.0.0.1:9"]
    plan = [{"calls": [ASK]}, {"answer": "went on without it (take {take})"}]
    webhook = {"webhook": "http://127.0.0.1:9/hooks"}
    agent_run = enqueue(request_for(model_name(model), plan, ["ask_person"], **webhook))
    (question,) = the_requests(agent_run)

    report = reap_stale_runs(as_of=later(2 * 86400))
    assert "expired unanswered" in report.decisions[str(agent_run.pk)], report.decisions

    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    assert again(question).status == ApprovalStatus.EXPIRED
    outcome = agent_run.steps.get(kind=StepKind.TOOL)
    assert outcome.error.startswith("no answer: nobody answered this question")
    events = RunEvent.objects.filter(run=agent_run).order_by("occurred_at")
    assert [event.event_type for event in events] == ["run.waiting_for_input", "run.completed"]
    if model is not None:
        assert told(model, "nobody answered")


def test_a_cancel_while_a_deferred_write_waits_leaves_it_in_doubt(deferred_tools, operator):
    """In-process: the ticket was opened; the run cancelled before its
    completion may not be requeued to open another until reconciled."""
    plan = [{"calls": [OPEN_TICKET]}, {"answer": "done"}]
    agent_run = enqueue(request_for("scripted", plan, ["open_ticket"]))
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_INPUT
    assert operator_actions.cancel(agent_run, operator).ok

    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.CANCELLED and is_write_in_doubt(agent_run)
    (withdrawn,) = the_requests(agent_run)
    assert withdrawn.status == ApprovalStatus.WITHDRAWN
    assert operator_actions.requeue(agent_run, operator).code == "write_in_doubt"
    assert len(hand_offs(agent_run.pk)) == 1
