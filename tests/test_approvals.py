"""G14: a call that needs approval waits for an operator, bound to the exact
call by its digest; approved, it executes once, as approved; denied, it never
executes and the model is told. In-process here (the embedded default's
dispatch); with real workers, SIGKILLs and concurrent decisions in
``test_approval_recovery.py``."""

import pytest
from django.db import DatabaseError

from runs import transitions
from runs.approvals import actions as approval_actions
from runs.models import AgentRun, ApprovalRequest
from runs.models.faults import step_inserts_refused
from runs.models.vocabulary import ApprovalStatus, RunStatus, StepKind, TerminationReason
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue, run
from tests.drifting_model import NOTIFY, SEARCH, request_for
from tests.helpers import fresh, later
from tools.models import OutboxNotification

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals")]

TOOLS = ["search_notes", "send_notification"]
#: A read, then a turn that reads and notifies at once, then the answer.
PLAN = [{"calls": [SEARCH]}, {"calls": [SEARCH, NOTIFY]}, {"answer": "sent (take {take})"}]


def pending(agent_run) -> list[ApprovalRequest]:
    return list(ApprovalRequest.objects.filter(run=agent_run, status=ApprovalStatus.PENDING))


def steps_of(agent_run, kind) -> list:
    return list(agent_run.steps.filter(kind=kind).order_by("sequence"))


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_a_non_idempotent_write_waits_holding_no_lease_and_runs_once_when_approved(model, operator):
    agent_run = enqueue(request_for("scripted" if model is None else "drifting", PLAN, TOOLS))
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.WAITING_FOR_APPROVAL
    assert (agent_run.lease_owner, agent_run.lease_expires_at) == ("", None)
    assert agent_run.pending_effect == ""
    (request,) = pending(agent_run)
    # The turn that asked is recorded, and no tool of it ran: not even its read.
    turn = agent_run.steps.get(sequence=request.turn_sequence)
    assert turn.kind == StepKind.LLM
    assert [call["name"] for call in turn.result["tool_calls"]] == [
        "search_notes",
        "send_notification",
    ]
    assert [step.tool_name for step in steps_of(agent_run, StepKind.TOOL)] == ["search_notes"]
    assert request.tool_name == "send_notification"
    assert request.position == "2.1"
    assert request.arguments == turn.result["tool_calls"][1]["arguments"]
    assert OutboxNotification.objects.count() == 0
    # The reaper leaves a waiting run alone, however late it looks.
    assert reap_stale_runs(as_of=later(60)).decisions == {}

    result = approval_actions.approve(request, operator, digest=request.digest, note="ok")

    assert result.ok, result
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    # Exactly the approved call, once: its arguments and idempotency key.
    (notification,) = OutboxNotification.objects.all()
    assert notification.idempotency_key == request.idempotency_key
    assert notification.message == request.arguments["message"]
    writes = [s for s in steps_of(agent_run, StepKind.TOOL) if s.tool_name == "send_notification"]
    assert [(s.idempotency_key, s.arguments) for s in writes] == [
        (request.idempotency_key, request.arguments)
    ]
    decision = steps_of(agent_run, StepKind.APPROVAL)[-1]
    assert decision.result["action"] == "approved"
    assert decision.result["operator"] == "olivia"
    assert decision.result["digest"] == request.digest
    assert decision.result["note"] == "ok"
    if model is not None:
        # The turn was replayed from the journal, never asked again.
        assert model.requests_by_turn[1] == 1


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_a_denied_call_never_executes_and_the_model_is_told(model, operator, fake_openai):
    agent_run = enqueue(request_for("scripted" if model is None else "drifting", PLAN, TOOLS))
    (request,) = pending(agent_run)

    result = approval_actions.deny(request, operator, digest=request.digest, note="not today")

    assert result.ok, result
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED
    assert OutboxNotification.objects.count() == 0
    denial = agent_run.steps.get(kind=StepKind.TOOL, tool_name="send_notification")
    assert denial.idempotency_key == "" and denial.effect == ""
    assert "denied" in denial.error and "not today" in denial.error
    if model is not None:
        told = fake_openai.tool_results_told()
        assert any("not today" in content for content in told)


def test_an_interactive_run_waits_and_a_worker_finishes_it(operator):
    agent_run = run(request_for("scripted", [{"calls": [NOTIFY]}, {"answer": "ok"}], TOOLS))
    assert agent_run.status == RunStatus.WAITING_FOR_APPROVAL
    (request,) = pending(agent_run)

    approval_actions.approve(request, operator, digest=request.digest)

    agent_run = fresh(agent_run)
    assert (agent_run.status, agent_run.mode) == (RunStatus.COMPLETED, "queued")
    assert OutboxNotification.objects.count() == 1


def test_a_stale_digest_is_refused_and_changes_nothing(operator):
    agent_run = enqueue(request_for("scripted", PLAN, TOOLS))
    (request,) = pending(agent_run)
    before = fresh(agent_run).step_count

    result = approval_actions.approve(request, operator, digest="0" * 64)

    assert (result.ok, result.code) == (False, "stale_digest")
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    assert fresh(agent_run).step_count == before
    assert pending(agent_run) == [request]


def test_an_approval_whose_step_is_refused_does_not_release_the_run(operator):
    agent_run = enqueue(request_for("scripted", PLAN, TOOLS))
    (request,) = pending(agent_run)

    with step_inserts_refused(kind=StepKind.APPROVAL), pytest.raises(DatabaseError):
        approval_actions.approve(request, operator, digest=request.digest)

    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.WAITING_FOR_APPROVAL
    assert pending(agent_run) == [request]
    assert OutboxNotification.objects.count() == 0
    # Once the database takes the step, the same approval goes through.
    assert approval_actions.approve(request, operator, digest=request.digest).ok
    assert fresh(agent_run).status == RunStatus.COMPLETED


def test_a_second_decision_of_the_same_call_is_refused(operator):
    agent_run = enqueue(request_for("scripted", PLAN, TOOLS))
    (request,) = pending(agent_run)
    assert approval_actions.deny(request, operator, digest=request.digest).ok

    again = approval_actions.approve(request, operator, digest=request.digest)

    assert (again.ok, again.code) == (False, "already_decided")
    assert OutboxNotification.objects.count() == 0


def test_a_user_without_the_permission_cannot_decide(viewer):
    agent_run = enqueue(request_for("scripted", PLAN, TOOLS))
    (request,) = pending(agent_run)

    for decide in (approval_actions.approve, approval_actions.deny):
        result = decide(request, viewer, digest=request.digest)
        assert (result.ok, result.code) == (False, "permission_denied")
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL


def test_four_eyes_the_submitter_may_deny_but_not_approve(settings, operator, approver):
    settings.NRLLM_APPROVAL_SECOND_PERSON = True
    agent_run = enqueue(request_for("scripted", PLAN, TOOLS), submitted_by=operator)
    (request,) = pending(agent_run)

    own = approval_actions.approve(request, operator, digest=request.digest)

    assert (own.ok, own.code) == (False, "second_person_required")
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    assert approval_actions.approve(request, approver, digest=request.digest).ok
    request.refresh_from_db()
    assert (request.decided_by, request.by_submitter) == (approver, False)


def test_without_four_eyes_the_record_shows_an_approval_was_the_submitters_own(operator):
    agent_run = enqueue(request_for("scripted", PLAN, TOOLS), submitted_by=operator)
    (request,) = pending(agent_run)
    assert approval_actions.approve(request, operator, digest=request.digest).ok
    request.refresh_from_db()
    assert request.by_submitter is True
    assert steps_of(agent_run, StepKind.APPROVAL)[-1].result["by_submitter"] is True


def test_an_unanswered_request_expires_and_the_run_fails_with_its_own_reason(operator):
    agent_run = enqueue(request_for("scripted", PLAN, TOOLS))
    (request,) = pending(agent_run)
    assert reap_stale_runs(as_of=later(3600)).decisions == {}

    report = reap_stale_runs(as_of=later(86400 + 60))

    assert report.decisions == {str(agent_run.pk): "approval_expired: nobody decided in time"}
    agent_run = fresh(agent_run)
    assert (agent_run.status, agent_run.termination_reason) == (
        RunStatus.FAILED,
        TerminationReason.APPROVAL_EXPIRED,
    )
    request.refresh_from_db()
    assert request.status == ApprovalStatus.EXPIRED
    late = approval_actions.approve(request, operator, digest=request.digest)
    assert (late.ok, late.code) == (False, "already_decided")
    assert OutboxNotification.objects.count() == 0


def test_a_cancel_while_waiting_ends_the_run_and_withdraws_its_request(operator):
    agent_run = enqueue(request_for("scripted", PLAN, TOOLS))
    (request,) = pending(agent_run)

    assert transitions.cancel(agent_run.pk) is transitions.CancelOutcome.CANCELLED

    assert fresh(agent_run).status == RunStatus.CANCELLED
    request.refresh_from_db()
    assert request.status == ApprovalStatus.WITHDRAWN
    late = approval_actions.approve(request, operator, digest=request.digest)
    assert late.ok is False
    assert OutboxNotification.objects.count() == 0


def test_a_request_may_ask_for_more_approvals_than_the_policy(operator):
    plan = [{"calls": [SEARCH]}, {"answer": "ok"}]
    request = {**request_for("scripted", plan, TOOLS), "require_approval": ["search_notes"]}
    agent_run = enqueue(request)
    (request,) = pending(agent_run)
    assert (request.tool_name, request.required_by) == ("search_notes", "request")
    assert approval_actions.approve(request, operator, digest=request.digest).ok
    assert fresh(agent_run).status == RunStatus.COMPLETED


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_a_run_requeued_after_expiry_asks_again_and_an_old_digest_does_not_count(model, operator):
    agent_run = enqueue(request_for("scripted" if model is None else "drifting", PLAN, TOOLS))
    (first,) = pending(agent_run)
    reap_stale_runs(as_of=later(86400 + 60))
    from runs.operators import actions as operator_actions
    from runs.operators.requeue_safety import requeue_safety

    # The verdict says what the requeue will do: wait again, for the same call.
    verdict = requeue_safety(fresh(agent_run))
    assert "waits for an operator's approval of send_notification first" in verdict.reason
    assert operator_actions.requeue(fresh(agent_run), operator, "try again").ok

    (second,) = pending(agent_run)
    assert second.pk != first.pk and second.digest != first.digest
    assert (second.turn_sequence, second.idempotency_key) == (
        first.turn_sequence,
        first.idempotency_key,
    )
    assert approval_actions.approve(second, operator, digest=first.digest).code == "stale_digest"
    assert approval_actions.approve(second, operator, digest=second.digest).ok
    assert fresh(agent_run).status == RunStatus.COMPLETED
    assert OutboxNotification.objects.count() == 1


def test_waiting_runs_are_not_requeueable(operator):
    from runs.operators.requeue_safety import requeue_safety

    agent_run = enqueue(request_for("scripted", PLAN, TOOLS))
    assert requeue_safety(fresh(agent_run)).code == "status"
    assert AgentRun.objects.get(pk=agent_run.pk).is_terminal is False


def test_a_request_past_its_expiry_cannot_be_approved_before_the_reaper_looks(operator):
    agent_run = enqueue(request_for("scripted", PLAN, TOOLS))
    (request,) = pending(agent_run)
    ApprovalRequest.objects.filter(pk=request.pk).update(expires_at=request.requested_at)

    late = approval_actions.approve(request, operator, digest=request.digest)

    assert (late.ok, late.code) == (False, "expired")
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    assert OutboxNotification.objects.count() == 0
