"""Retention (#30, G11's one exception): ``prune_runs`` deletes whole ended
runs past their age, in batches, and never a run with an open question."""

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.db.models import F
from django.test import Client

from api.models import RunCreationKey
from runs import transitions
from runs.jobs import prune_job
from runs.models import (
    AgentRun,
    ApprovalRequest,
    DeadLetter,
    RunEvent,
    RunStep,
    WriteReconciliation,
)
from runs.models.faults import step_inserts_refused
from runs.models.vocabulary import ApprovalStatus
from runs.operators import actions as operator_actions
from runs.operators.requeue_safety import requeue_safety
from runs.runtime import enqueue, run
from tests.approval_requests import waiting
from tests.helpers import (
    answer,
    call,
    fresh,
    rows_locked_elsewhere,
    scripted,
    the_turn_lost_when_a_note_is_written,
)

pytestmark = pytest.mark.django_db(transaction=True)

SEARCH = call("search_notes", query="x")


def aged(agent_run, days=100):
    """``agent_run`` as if it had been created and ended ``days`` ago."""
    ago = timedelta(days=days)
    AgentRun.objects.filter(pk=agent_run.pk).update(
        created_at=F("created_at") - ago, finished_at=F("finished_at") - ago
    )
    return agent_run


def failed_on_auth():
    agent_run = enqueue(
        scripted(call("search_notes", query="x"), {"error": "auth"}, tools=["search_notes"])
    )
    assert DeadLetter.objects.filter(run=agent_run, resolved_at__isnull=True).exists()
    return agent_run


def left_in_doubt():
    """A run that ended with its fence on a write it may have sent."""
    agent_run = enqueue(scripted(SEARCH, {"error": "auth"}, tools=["search_notes"]))
    AgentRun.objects.filter(pk=agent_run.pk).update(
        pending_effect="non_idempotent_write",
        pending_call={"tool": "send_notification", "arguments": {}, "idempotency_key": "k"},
    )
    DeadLetter.objects.filter(run=agent_run).update(resolved_at=F("created_at"))
    return AgentRun.objects.get(pk=agent_run.pk)


def prune(*args) -> str:
    out = StringIO()
    call_command("prune_runs", *args, stdout=out)
    return out.getvalue()


def test_only_ended_runs_without_an_open_question_go_whole_in_batches(operator, approvals):
    # Past the age and with nothing left to answer: deleted.
    completed = aged(
        run(scripted(call("search_notes", query="x"), answer(), tools=["search_notes"]))
    )
    RunCreationKey.objects.create(user=operator, key="k", body_sha256="0" * 64, run=completed)
    dismissed = failed_on_auth()
    assert operator_actions.dismiss(dismissed.dead_letters.get(), operator, "known outage").ok
    reconciled = left_in_doubt()
    assert operator_actions.reconcile(reconciled, operator, "applied", "seen in the mailbox").ok
    aged(dismissed), aged(reconciled)
    # Each with a question still open, or not ended, or not old enough: kept.
    in_doubt = aged(left_in_doubt())
    dead_lettered = aged(failed_on_auth())
    waiting_run, request = waiting()
    aged(waiting_run)
    # An ended run still holding a pending approval (no path leaves one; the
    # rule holds whatever the cause).
    stray_approval, _ = waiting()
    AgentRun.objects.filter(pk=stray_approval.pk).update(
        status="failed", finished_at=F("created_at")
    )
    aged(stray_approval)
    recent = run(scripted(answer("recent")))
    queued = aged(transitions.create_queued_run({"prompt": "p", "tools": []}, "p"))
    # Cancelled with a run-ended webhook (G19): kept while it is retried.
    told, telling = (
        transitions.create_queued_run({"prompt": "p", "webhook": "http://hooks.test/"}, "p")
        for _ in range(2)
    )
    for cancelled in (told, telling):
        transitions.cancel(cancelled.pk)
        aged(cancelled)
    RunEvent.objects.filter(run=told).update(delivered_at=F("occurred_at"))
    gone = {completed.pk, dismissed.pk, reconciled.pk, told.pk}
    kept = {
        *(in_doubt.pk, dead_lettered.pk, waiting_run.pk, stray_approval.pk),
        *(recent.pk, queued.pk, telling.pk),
    }
    steps_of_gone = RunStep.objects.filter(run_id__in=gone).count()

    dry = prune("--older-than", "90d", "--dry-run")
    assert dry.startswith(f"would delete 4 runs ({steps_of_gone} steps) that ended before ")
    assert (
        "kept, with a question open: writes in doubt 1, open dead letters 1, pending approvals 1, "
        "run-ended webhooks not yet delivered 1" in dry
    )
    assert set(AgentRun.objects.values_list("pk", flat=True)) == gone | kept

    done = prune("--older-than", "90d", "--batch-size", "2")
    assert done.startswith(f"deleted 4 runs ({steps_of_gone} steps) that ended before ")
    assert " in 2 batches;" in done
    assert set(AgentRun.objects.values_list("pk", flat=True)) == kept
    assert not RunStep.objects.filter(run_id__in=gone).exists()
    assert not DeadLetter.objects.filter(run_id__in=gone).exists()
    assert not RunCreationKey.objects.exists()
    # What an audit needs stays: the admin log of every operator action, and
    # what the operator found about the write (its run's id now a name).
    assert sorted(LogEntry.objects.values_list("change_message", flat=True)) == [
        "Dismissed. known outage",
        "Reconciled applied. seen in the mailbox",
    ]
    finding = WriteReconciliation.objects.get()
    assert (finding.run_id, finding.outcome, finding.tool_name) == (
        reconciled.pk,
        "applied",
        "send_notification",
    )
    assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.PENDING
    # The console lists it, its run named and marked deleted.
    operator.user_permissions.add(Permission.objects.get(codename="view_writereconciliation"))
    client = Client()
    client.force_login(operator)
    listed = client.get("/admin/runs/writereconciliation/").content.decode()
    assert f'<code title="{reconciled.pk}">{str(reconciled.pk)[:8]}</code> (deleted' in listed
    page = client.get(f"/admin/runs/writereconciliation/{finding.pk}/change/")
    assert page.status_code == 200 and "seen in the mailbox" in page.content.decode()
    assert prune("--older-than", "90d").startswith("deleted 0 runs (0 steps)")


def test_an_idempotent_write_in_doubt_keeps_its_run_as_its_requeue_verdict_does(operator):
    """An idempotent write on the fence is in doubt when its call would not
    run again with its key (G10): kept, interactive (no dead letter to keep
    it) or queued with its dead letter dismissed, unreconciled. One whose
    call runs again as it ran is no question: it goes."""
    note = scripted(call("upsert_note", slug="a", body="b"), answer(), tools=["upsert_note"])
    with the_turn_lost_when_a_note_is_written():
        interactive, queued = run(note), enqueue(note)
    assert operator_actions.dismiss(queued.dead_letters.get(), operator, "seen later").ok
    with step_inserts_refused("upsert_note"):
        unrecorded = run(note)
    interactive, queued, unrecorded = (fresh(ended) for ended in (interactive, queued, unrecorded))
    assert [
        (ended.termination_reason, ended.error_type, ended.pending_effect)
        for ended in (interactive, queued, unrecorded)
    ] == [
        ("write_interrupted", "WriteNotDurable", "idempotent_write"),
        ("write_interrupted", "WriteNotDurable", "idempotent_write"),
        ("not_retryable", "AuditPersistenceFailed", "idempotent_write"),
    ]
    assert not interactive.steps.filter(kind="llm").exists()
    assert [requeue_safety(ended).code for ended in (interactive, queued, unrecorded)] == [
        "write_in_doubt",
        "write_in_doubt",
        "safe",
    ]
    for ended in (interactive, queued, unrecorded):
        aged(ended)

    dry = prune("--older-than", "90d", "--dry-run")
    assert dry.startswith("would delete 1 run ")
    assert "kept, with a question open: writes in doubt 2, open dead letters 0" in dry
    assert prune("--older-than", "90d").startswith("deleted 1 run ")
    assert set(AgentRun.objects.values_list("pk", flat=True)) == {interactive.pk, queued.pk}
    # Reconciled, the question is answered: it goes.
    assert operator_actions.reconcile(interactive, operator, "not_applied", "not in the log").ok
    assert prune("--older-than", "90d").startswith("deleted 1 run ")
    assert set(AgentRun.objects.values_list("pk", flat=True)) == {queued.pk}


def test_a_run_locked_by_another_transaction_is_left_for_the_next_pass():
    """A batch never waits on a lock (an operator's action on a run, say):
    it skips the run, and the next pass takes it."""
    busy = aged(run(scripted(answer("busy"))))
    idle = aged(run(scripted(answer("idle"))))
    with rows_locked_elsewhere(AgentRun.objects.filter(pk=busy.pk)):
        assert prune("--older-than", "1d").startswith("deleted 1 run ")
    assert list(AgentRun.objects.values_list("pk", flat=True)) == [busy.pk]
    assert not AgentRun.objects.filter(pk=idle.pk).exists()
    assert prune("--older-than", "1d").startswith("deleted 1 run ")


@pytest.mark.parametrize("age", ["90", "0d", "0h", "90 days", "-1d", "1w", "36501d", "999999d"])
def test_an_age_that_is_not_days_or_hours_in_bounds_is_refused(age):
    with pytest.raises(CommandError, match="give a whole number of days or hours"):
        prune(f"--older-than={age}")


def test_a_batch_past_what_a_statement_can_bind_is_refused():
    with pytest.raises(CommandError, match="--batch-size must be from 1 to 10000"):
        prune("--older-than", "1d", "--batch-size", "70000")


def test_retention_runs_on_rqs_cron_when_its_age_is_set(settings):
    from django_rq.cron import DjangoCronScheduler

    old, young = aged(run(scripted(answer())), days=91), aged(run(scripted(answer())), days=89)

    settings.NRLLM_RETENTION_DAYS = 90
    settings.NRLLM_RETENTION_INTERVAL_SECONDS = 900
    scheduler = DjangoCronScheduler()
    scheduler.load_config_from_file("runs.cron")
    registered = {job.func.__name__: job for job in scheduler.get_jobs()}
    assert registered["prune_job"].interval == 900
    assert registered["prune_job"].kwargs == {"days": 90}
    settings.NRLLM_RETENTION_DAYS = 0
    scheduler = DjangoCronScheduler()
    scheduler.load_config_from_file("runs.cron")
    assert [job.func.__name__ for job in scheduler.get_jobs()] == [
        "reap_job",
        "fire_schedules_job",
    ]
    # The age comes with the job, not from the worker's settings: a worker
    # without them (0) must not prune everything that has ended.
    assert prune_job(days=0).startswith("retention is off")
    assert prune_job(**registered["prune_job"].kwargs).startswith("deleted 1 run ")
    assert list(AgentRun.objects.values_list("pk", flat=True)) == [young.pk]
    assert old.pk not in AgentRun.objects.values_list("pk", flat=True)
