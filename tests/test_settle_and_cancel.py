"""G9: terminal is terminal; cancel is a fence noticed at the next step boundary."""

import pytest

from runs import transitions
from runs.models import AgentRun, DeadLetter
from runs.runtime import enqueue, run, run_queued
from runs.transitions import CancelOutcome, FinishOutcome, Lease
from tests.helpers import answer, call, scripted, wait_until
from tools.models import OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)


def lease_of(agent_run):
    return Lease(str(agent_run.pk), "w", agent_run.lease_token)


def test_a_second_or_late_settle_changes_nothing(caplog):
    agent_run = transitions.create_queued_run(scripted(answer()), "p")
    lease = transitions.claim(agent_run.pk, "w", 60).lease
    assert transitions.settle(lease, "completed", "completed", output="first")
    before = AgentRun.objects.get(pk=agent_run.pk)

    assert not transitions.settle(lease, "failed", "not_retryable")
    assert not transitions.dead_letter(
        lease, "not_retryable", failure_class="unknown", error_type="E", error_message="late"
    )
    assert not transitions.requeue_for_retry(
        lease, failure_class="connection", error_type="", error_message=""
    )
    after = AgentRun.objects.get(pk=agent_run.pk)
    assert (after.status, after.output, after.finished_at) == (
        "completed",
        "first",
        before.finished_at,
    )
    assert DeadLetter.objects.count() == 0
    assert "settle ignored" in caplog.text


def test_cancelling_a_queued_run_means_it_never_starts():
    agent_run = transitions.create_queued_run(
        scripted(call("send_notification", recipient="a", message="b"), answer()), "p"
    )
    assert transitions.cancel(agent_run.pk) is CancelOutcome.CANCELLED
    run_queued(agent_run.pk)  # its job arrives late
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.termination_reason) == ("cancelled", "cancelled")
    assert agent_run.steps.count() == 0 and OutboxNotification.objects.count() == 0


def test_cancelling_an_ended_run_changes_nothing():
    agent_run = run(scripted(answer("x")))
    assert transitions.cancel(agent_run.pk) is CancelOutcome.TERMINAL
    assert AgentRun.objects.get(pk=agent_run.pk).status == "completed"
    assert transitions.cancel("00000000-0000-0000-0000-000000000000") is CancelOutcome.NOT_FOUND


def test_a_requested_cancel_refuses_the_renewal_before_a_tool():
    agent_run = transitions.create_queued_run(scripted(answer()), "p")
    lease = transitions.claim(agent_run.pk, "w", 60).lease
    assert transitions.cancel(agent_run.pk) is CancelOutcome.REQUESTED
    assert transitions.cancel(agent_run.pk) is CancelOutcome.ALREADY_REQUESTED
    assert not transitions.renew_lease(lease, 60, fence="non_idempotent_write")
    assert AgentRun.objects.get(pk=agent_run.pk).pending_effect == ""
    assert transitions.cancel_requested(lease)


@pytest.mark.worker
def test_cancelling_mid_run_stops_before_the_next_tool(workers):
    agent_run = enqueue(
        scripted(
            {**call("send_notification", recipient="a", message="b"), "delay_seconds": 1.5},
            answer(),
            tools=["send_notification"],
        )
    )
    worker = workers.start(burst=True)
    wait_until(lambda: AgentRun.objects.get(pk=agent_run.pk).step_count >= 1, what="request step")
    assert transitions.cancel(agent_run.pk) is CancelOutcome.REQUESTED
    worker.communicate(timeout=30)

    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.termination_reason) == ("cancelled", "cancelled")
    assert OutboxNotification.objects.count() == 0
    assert list(agent_run.steps.values_list("kind", flat=True)) == ["request", "llm"]
    # Terminal stays terminal: a late job does nothing.
    run_queued(agent_run.pk)
    assert AgentRun.objects.get(pk=agent_run.pk).status == "cancelled"


@pytest.mark.worker
def test_a_cancel_noticed_at_the_step_boundary_wins_over_a_final_answer(workers):
    agent_run = enqueue(scripted(answer("too late", delay_seconds=1.5)))
    worker = workers.start(burst=True)
    wait_until(lambda: AgentRun.objects.get(pk=agent_run.pk).step_count >= 1, what="request step")
    assert transitions.cancel(agent_run.pk) is CancelOutcome.REQUESTED
    worker.communicate(timeout=30)
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.termination_reason, agent_run.output) == (
        "cancelled",
        "cancelled",
        "",
    )


def test_the_final_answer_is_recorded_with_the_settle_and_a_cancel_still_wins():
    answered = transitions.create_queued_run(scripted(answer()), "p")
    lease = transitions.claim(answered.pk, "w", 60).lease
    final = {"kind": "llm", "result": {"content": "done", "tool_calls": []}}
    assert transitions.finish(lease, [final], output="done") is FinishOutcome.COMPLETED
    answered.refresh_from_db()
    assert (answered.status, answered.output, answered.lease_owner) == ("completed", "done", "")
    assert list(answered.steps.values_list("kind", flat=True)) == ["request", "llm"]
    # A late finish (or settle) changes nothing.
    assert transitions.finish(lease, [final], output="again") is FinishOutcome.LEASE_LOST

    cancelled = transitions.create_queued_run(scripted(answer()), "p")
    lease = transitions.claim(cancelled.pk, "w", 60).lease
    assert transitions.cancel(cancelled.pk) is CancelOutcome.REQUESTED
    assert transitions.finish(lease, [final], output="done") is FinishOutcome.CANCELLED
    cancelled.refresh_from_db()
    assert (cancelled.status, cancelled.termination_reason, cancelled.output) == (
        "cancelled",
        "cancelled",
        "",
    )
    assert cancelled.steps.filter(kind="llm").exists()  # what the model said is kept
