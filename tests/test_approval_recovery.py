"""G14 under crashes and races, with real rqworker processes and both the
scripted and the drifting model: an approved call resumes on another worker
and executes once, as recorded; a worker SIGKILLed after the approval, before
or during the write, is handled by the fence and the reaper (no second
execution); two decisions at once release the run once; a run that cannot
record its wait does not run the call."""

import threading

import pytest
from django.db import connection

from runs.approvals import actions as approval_actions
from runs.models import ApprovalRequest
from runs.models.faults import approval_requests_refused
from runs.models.vocabulary import ApprovalStatus, RunStatus, StepKind, TerminationReason
from runs.operators import actions as operator_actions
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from tests.drifting_model import NOTIFY, SEARCH, request_for
from tests.helpers import fresh, later, step_inserts_held, wait_until
from tools.models import OutboxNotification

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals")]

TOOLS = ["search_notes", "send_notification"]
PLAN = [{"calls": [SEARCH]}, {"calls": [NOTIFY]}, {"answer": "sent (take {take})"}]


def model_name(model) -> str:
    return "scripted" if model is None else "drifting"


def the_request(agent_run) -> ApprovalRequest:
    (request,) = ApprovalRequest.objects.filter(run=agent_run)
    return request


def parked_and_approved(model, workers, operator):
    """A run parked by a real worker, its notification approved: queued for
    the next worker. Returns the run and its approval request."""
    agent_run = enqueue(request_for(model_name(model), PLAN, TOOLS))
    workers.run_burst()
    request = the_request(agent_run)
    assert approval_actions.approve(request, operator, digest=request.digest).ok
    return agent_run, request


def killed_at(workers, held: str, *, what: str) -> None:
    """A worker takes the run and is SIGKILLed while a step where ``held``
    holds waits to be inserted (it never becomes durable)."""
    with step_inserts_held(held) as (waiting, end_the_wait):
        worker = workers.start(NRLLM_LEASE_SECONDS=2)
        wait_until(waiting, timeout=30, what=what)
        workers.kill(worker)
        end_the_wait()


@pytest.mark.worker
@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_an_approved_write_resumes_on_another_worker_and_executes_once(
    model, queue, workers, operator
):
    agent_run = enqueue(request_for(model_name(model), PLAN, TOOLS))
    workers.run_burst()
    parked = fresh(agent_run)
    assert parked.status == RunStatus.WAITING_FOR_APPROVAL
    assert (parked.lease_owner, parked.lease_expires_at, parked.pending_effect) == ("", None, "")
    request = the_request(agent_run)

    assert approval_actions.approve(request, operator, digest=request.digest).ok
    assert fresh(agent_run).status == RunStatus.QUEUED
    workers.run_burst()  # another worker process

    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    (notification,) = OutboxNotification.objects.all()
    assert notification.idempotency_key == request.idempotency_key
    assert notification.message == request.arguments["message"]
    write = agent_run.steps.get(kind=StepKind.TOOL, tool_name="send_notification")
    assert write.lease_token == request.lease_token + 1  # the next attempt ran it
    if model is not None:
        # The call executed is the recorded one: the model was not asked again.
        assert model.requests_by_turn[1] == 1, model.requests_by_turn


@pytest.mark.worker
@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_a_worker_killed_after_the_approval_before_the_write_repeats_nothing(
    model, queue, workers, operator
):
    agent_run, request = parked_and_approved(model, workers, operator)

    # The resumed attempt stops before its first step is durable: nothing of
    # the approved turn has run.
    killed_at(workers, "NEW.kind = 'resume'", what="the resumed attempt's first step")
    assert OutboxNotification.objects.count() == 0
    report = reap_stale_runs(as_of=later())
    assert report.decisions[str(agent_run.pk)].startswith("requeued"), report.decisions
    workers.run_burst()

    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    assert [n.idempotency_key for n in OutboxNotification.objects.all()] == [
        request.idempotency_key
    ]
    # The approval held across the crash: nobody was asked again.
    assert ApprovalRequest.objects.filter(run=agent_run).count() == 1
    if model is not None:
        assert model.requests_by_turn[1] == 1, model.requests_by_turn


@pytest.mark.worker
@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_a_worker_killed_during_the_approved_write_is_dead_lettered_write_interrupted(
    model, queue, workers, operator
):
    agent_run, request = parked_and_approved(model, workers, operator)

    # The notification went out; the worker dies before its step is durable.
    held = "NEW.kind = 'tool' AND NEW.tool_name = 'send_notification'"
    killed_at(workers, held, what="the approved write's step")
    report = reap_stale_runs(as_of=later())

    assert report.decisions[str(agent_run.pk)] == "dead_lettered: write_interrupted"
    agent_run = fresh(agent_run)
    assert agent_run.termination_reason == TerminationReason.WRITE_INTERRUPTED
    assert agent_run.pending_call["idempotency_key"] == request.idempotency_key
    assert OutboxNotification.objects.count() == 1
    # Not requeueable until an operator reconciles the write (G10); the
    # approval is spent, and no one can approve the call again.
    assert operator_actions.requeue(agent_run, operator).code == "write_in_doubt"
    again = approval_actions.approve(request, operator, digest=request.digest)
    assert again.code == "already_decided"


def test_two_decisions_of_one_turns_calls_at_once_release_the_run_once(operator, approver):
    plan = [
        {"calls": [NOTIFY, {**NOTIFY, "arguments": {"recipient": "ops", "message": "too"}}]},
        {"answer": "both"},
    ]
    agent_run = enqueue(request_for("scripted", plan, TOOLS))
    first, second = ApprovalRequest.objects.filter(run=agent_run).order_by("position")
    barrier = threading.Barrier(2)
    results = {}

    def decide(request, user):
        try:
            barrier.wait(timeout=10)
            results[request.position] = approval_actions.approve(
                request, user, digest=request.digest
            )
        finally:
            connection.close()

    threads = [
        threading.Thread(target=decide, args=(first, operator)),
        threading.Thread(target=decide, args=(second, approver)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert all(result.ok for result in results.values()), results
    assert sorted(result.detail.split(";")[1].strip() for result in results.values()) == [
        "the run goes back to the queue",
        "the run still waits for its other calls",
    ]
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    assert agent_run.dispatch_count == 1  # queued at creation (0), released once (1)
    assert OutboxNotification.objects.count() == 2
    assert agent_run.steps.filter(kind=StepKind.REQUEST).count() == 2  # two attempts


def test_one_call_of_a_turn_approved_and_one_denied_sends_only_the_approved(operator):
    plan = [
        {"calls": [NOTIFY, {**NOTIFY, "arguments": {"recipient": "ops", "message": "no"}}]},
        {"answer": "one of two"},
    ]
    agent_run = enqueue(request_for("scripted", plan, TOOLS))
    first, second = ApprovalRequest.objects.filter(run=agent_run).order_by("position")

    assert approval_actions.deny(second, operator, digest=second.digest, note="not ops").ok
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL  # the first still waits
    assert approval_actions.approve(first, operator, digest=first.digest).ok

    assert fresh(agent_run).status == RunStatus.COMPLETED
    (sent,) = OutboxNotification.objects.all()
    assert sent.idempotency_key == first.idempotency_key


def test_a_run_whose_wait_cannot_be_recorded_does_not_run_the_call():
    agent_run = enqueue(request_for("scripted", PLAN, TOOLS))
    # (enqueue ran it inline: it waits now.) A second run meets a refusal.
    with approval_requests_refused():
        refused = enqueue(request_for("scripted", PLAN, TOOLS))

    refused = fresh(refused)
    assert refused.status == RunStatus.FAILED
    assert OutboxNotification.objects.count() == 0
    assert not ApprovalRequest.objects.filter(run=refused).exists()
    # All or nothing: the turn that asked was not recorded without its wait.
    assert not refused.steps.filter(kind=StepKind.APPROVAL).exists()
    assert refused.steps.filter(kind=StepKind.LLM).count() == 1  # the read's turn only
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_a_run_cancelled_while_waiting_and_requeued_asks_again(model, operator):
    agent_run = enqueue(request_for(model_name(model), PLAN, TOOLS))
    first = the_request(agent_run)
    assert operator_actions.cancel(fresh(agent_run), operator, "wrong day").ok
    assert fresh(agent_run).status == RunStatus.CANCELLED

    assert operator_actions.requeue(fresh(agent_run), operator, "today then").ok

    statuses = dict(ApprovalRequest.objects.filter(run=agent_run).values_list("pk", "status"))
    assert statuses[first.pk] == ApprovalStatus.WITHDRAWN
    (second,) = ApprovalRequest.objects.filter(run=agent_run, status=ApprovalStatus.PENDING)
    assert second.idempotency_key == first.idempotency_key
    assert approval_actions.approve(second, operator, digest=second.digest).ok
    assert fresh(agent_run).status == RunStatus.COMPLETED
    assert OutboxNotification.objects.count() == 1


@pytest.mark.worker
@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_an_approval_a_cancel_ended_before_the_write_is_asked_again_after_a_requeue(
    model, queue, workers, api
):
    """Approved through the API — the turn's last call, so the run is back in
    the queue — then cancelled before any worker took it, then requeued: the
    approval belonged to the run the operator stopped. The next worker asks
    again (a new digest) instead of sending the write."""
    agent_run = enqueue(request_for(model_name(model), PLAN, TOOLS))
    workers.run_burst()
    request = the_request(agent_run)
    approved = api.post(
        f"/api/approvals/{request.pk}/approve/", {"digest": request.digest}, format="json"
    )
    assert approved.status_code == 200, approved.content
    assert fresh(agent_run).status == RunStatus.QUEUED

    cancelled = api.post(f"/api/runs/{agent_run.pk}/cancel/", {"note": "stop"}, format="json")
    assert cancelled.status_code == 202, cancelled.content
    assert fresh(agent_run).status == RunStatus.CANCELLED
    requeued = api.post(f"/api/runs/{agent_run.pk}/requeue/", {"note": "go on"}, format="json")
    assert requeued.status_code == 202, requeued.content
    assert "approval of send_notification" in requeued.json()["detail"]

    workers.run_burst()  # one worker process

    agent_run = fresh(agent_run)
    assert OutboxNotification.objects.count() == 0
    assert agent_run.status == RunStatus.WAITING_FOR_APPROVAL, agent_run.error_message
    (asked,) = ApprovalRequest.objects.filter(run=agent_run, status=ApprovalStatus.PENDING)
    assert (asked.position, asked.idempotency_key) == (request.position, request.idempotency_key)
    assert asked.digest != request.digest
    request.refresh_from_db()
    assert request.status == ApprovalStatus.WITHDRAWN
    shown = api.get(f"/api/approvals/{request.pk}/").json()
    assert (shown["status"], shown["decided_by"]) == ("withdrawn", "olivia")
