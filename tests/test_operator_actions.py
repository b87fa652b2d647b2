"""G10 and G11: operators requeue only safe runs, through one verdict, and
every operator action is recorded on the run's own step stream."""

import threading

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection, transaction

from runs import transitions
from runs.models import AgentRun, DeadLetter
from runs.models.faults import step_inserts_refused
from runs.operators import actions as operator_actions
from runs.operators.requeue_safety import requeue_safety, restart_safety
from runs.runtime import enqueue, run
from tests.helpers import answer, call, scripted
from tools.models import OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)

NOTIFY = call("send_notification", recipient="ops", message="hi")


def completed_run():
    return run(scripted(call("search_notes", query="x"), answer(), tools=["search_notes"]))


def failed_not_retryable():
    return enqueue(
        scripted(call("search_notes", query="x"), {"error": "auth"}, tools=["search_notes"])
    )


def failed_after_a_non_idempotent_write():
    return enqueue(scripted(NOTIFY, {"error": "auth"}, tools=["send_notification"]))


def write_audit_failed():
    with step_inserts_refused("send_notification"):
        return enqueue(scripted(NOTIFY, answer(), tools=["send_notification"]))


def idempotent_audit_failed():
    with step_inserts_refused("upsert_note"):
        return enqueue(
            scripted(call("upsert_note", slug="a", body="b"), answer(), tools=["upsert_note"])
        )


def cancelled_before_start():
    with transaction.atomic():
        agent_run = enqueue(scripted(answer(), tools=["send_notification"]))
        transitions.cancel(agent_run.pk)
    return agent_run


def queued_run():
    return transitions.create_queued_run({"prompt": "p", "tools": []}, "p")


def write_interrupted():
    agent_run = enqueue(scripted(answer(), tools=["send_notification"]))
    AgentRun.objects.filter(pk=agent_run.pk).update(
        status="failed",
        termination_reason="write_interrupted",
        pending_effect="non_idempotent_write",
        pending_call={"tool": "send_notification", "arguments": {}, "idempotency_key": "k"},
    )
    return agent_run


@pytest.mark.parametrize(
    ("make_run", "allowed", "code", "mentions"),
    [
        (completed_run, False, "status", "this run is completed"),
        (queued_run, False, "status", "this run is queued"),
        (failed_not_retryable, True, "safe", "resumes after step 3; replays 0 writes"),
        (cancelled_before_start, True, "safe", "nothing recorded to replay"),
        (idempotent_audit_failed, True, "safe", "executes again with the same idempotency key"),
        (write_audit_failed, False, "write_in_doubt", "'send_notification' may have landed"),
        (write_interrupted, False, "write_in_doubt", "reconcile it first"),
        (
            failed_after_a_non_idempotent_write,
            True,
            "safe",
            "resumes after step 3; replays 1 writes without repeating them",
        ),
    ],
)
def test_the_requeue_verdict(make_run, allowed, code, mentions):
    agent_run = AgentRun.objects.get(pk=make_run().pk)
    verdict = requeue_safety(agent_run)
    assert (verdict.allowed, verdict.code) == (allowed, code)
    assert mentions in verdict.reason


@pytest.mark.parametrize(
    ("make_run", "allowed", "code", "mentions"),
    [
        (completed_run, False, "status", "this run is completed"),
        (failed_not_retryable, True, "safe", "from the beginning, replaying nothing"),
        (idempotent_audit_failed, True, "safe", "from the beginning"),
        (write_audit_failed, False, "write_in_doubt", "reconcile it first"),
        (failed_after_a_non_idempotent_write, False, "non_idempotent_executed", "step 3"),
    ],
)
def test_the_restart_verdict(make_run, allowed, code, mentions):
    agent_run = AgentRun.objects.get(pk=make_run().pk)
    verdict = restart_safety(agent_run)
    assert (verdict.allowed, verdict.code) == (allowed, code)
    assert mentions in verdict.reason


@pytest.mark.parametrize(("outcome", "allowed"), [("not_applied", True), ("applied", False)])
def test_a_reconciled_write_decides_the_verdict(operator, outcome, allowed):
    agent_run = AgentRun.objects.get(pk=write_audit_failed().pk)
    result = operator_actions.reconcile(agent_run, operator, outcome, "checked the outbox")
    assert result.ok
    assert requeue_safety(AgentRun.objects.get(pk=agent_run.pk)).allowed is allowed
    reconciliation = agent_run.reconciliation
    assert reconciliation.tool_name == "send_notification"
    assert reconciliation.arguments == {"recipient": "ops", "message": "hi"}
    assert len(reconciliation.idempotency_key) == 64
    assert DeadLetter.objects.get(run=agent_run).resolution == "reconciled"


def test_reconcile_needs_a_note_and_a_write_in_doubt(operator):
    agent_run = AgentRun.objects.get(pk=write_audit_failed().pk)
    assert operator_actions.reconcile(agent_run, operator, "applied", "  ").code == "note_required"
    assert operator_actions.reconcile(agent_run, operator, "maybe", "x").code == "invalid"
    done = AgentRun.objects.get(pk=completed_run().pk)
    assert operator_actions.reconcile(done, operator, "applied", "x").code == "nothing_to_reconcile"
    assert operator_actions.reconcile(agent_run, operator, "applied", "x").ok
    assert operator_actions.reconcile(agent_run, operator, "not_applied", "y").code == (
        "already_reconciled"
    )


def test_a_requeue_after_reconciling_not_applied_runs_the_write_again(operator):
    agent_run = AgentRun.objects.get(pk=write_audit_failed().pk)
    operator_actions.reconcile(agent_run, operator, "not_applied", "receiver never got it")
    result = operator_actions.requeue(AgentRun.objects.get(pk=agent_run.pk), operator, "retry")
    assert result.ok, result.detail
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.pending_effect) == ("completed", "")
    assert OutboxNotification.objects.count() == 2
    actions = [
        step.result["action"]
        for step in agent_run.steps.filter(kind="operator").order_by("sequence")
    ]
    assert actions == ["reconcile", "requeue"]


def test_every_operator_action_is_on_the_step_stream_and_in_the_admin_log(operator):
    agent_run = AgentRun.objects.get(pk=failed_not_retryable().pk)
    assert operator_actions.requeue(agent_run, operator, "flaky auth").ok
    step = AgentRun.objects.get(pk=agent_run.pk).steps.filter(kind="operator").get()
    assert step.result["operator"] == "olivia" and step.result["note"] == "flaky auth"
    assert step.result["action"] == "requeue" and step.created_at is not None
    entry = LogEntry.objects.get(object_id=str(agent_run.pk))
    assert entry.user == operator and "flaky auth" in entry.get_change_message()
    # Run in-process, the requeued run failed again: a new dead letter, the old one resolved.
    first, second = DeadLetter.objects.filter(run=agent_run).order_by("created_at")
    assert (first.resolution, second.resolution) == ("requeued", "")


def test_of_two_concurrent_requeues_one_succeeds(operator):
    agent_run = AgentRun.objects.get(pk=cancelled_before_start().pk)
    barrier = threading.Barrier(2)
    results = []

    def requeue_it():
        try:
            barrier.wait()
            with transaction.atomic():  # dispatch on commit, as in a request
                results.append(operator_actions.requeue(agent_run, operator, "twice"))
        finally:
            connection.close()

    threads = [threading.Thread(target=requeue_it) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(result.ok for result in results) == [False, True]
    assert [result.code for result in results if not result.ok] == ["changed"]
    assert AgentRun.objects.get(pk=agent_run.pk).steps.filter(kind="operator").count() == 1


def test_cancel_and_dismiss(operator):
    queued = queued_run()
    assert operator_actions.cancel(queued, operator, "not needed").code == "cancelled"
    assert operator_actions.cancel(AgentRun.objects.get(pk=queued.pk), operator).code == (
        "not_cancellable"
    )
    agent_run = AgentRun.objects.get(pk=failed_not_retryable().pk)
    dead_letter = DeadLetter.objects.get(run=agent_run)
    assert operator_actions.dismiss(dead_letter, operator, "").code == "note_required"
    assert operator_actions.dismiss(dead_letter, operator, "known outage").ok
    assert operator_actions.dismiss(dead_letter, operator, "again").code == "already_resolved"
    dead_letter.refresh_from_db()
    assert (dead_letter.resolution, dead_letter.resolved_by) == ("dismissed", operator)
    assert dead_letter.resolution_note == "known outage" and dead_letter.resolved_at


def test_a_requeue_decided_on_a_stale_view_is_refused(operator):
    seen = AgentRun.objects.get(pk=failed_not_retryable().pk)
    # Meanwhile another operator requeued it, and it failed again: same status.
    assert operator_actions.requeue(AgentRun.objects.get(pk=seen.pk), operator, "first").ok
    assert AgentRun.objects.get(pk=seen.pk).status == seen.status == "failed"
    assert operator_actions.requeue(seen, operator, "second").code == "changed"
