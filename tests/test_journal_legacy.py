"""G12 for runs recorded before attempts resumed (migration 0013): every
attempt then started over, and a write an earlier attempt had recorded was
found again by its idempotency key. The journal begins at the last attempt's
conversation; if an earlier attempt got further — it executed a
non-idempotent write the last one had not reached — resuming could repeat
that write, so the run is not resumed: the verdict refuses it, and an
attempt that meets it (the reaper's, a retry's) is dead-lettered
``journal_unreplayable`` naming the write.
"""

import importlib

import pytest
from django.db import connection

from runs.models import AgentRun, RunStep
from runs.operators.requeue_safety import requeue_safety, restart_safety
from runs.runtime import run_queued
from runs.runtime.run_request import parse_run_request
from runs.transitions import create_queued_run
from tests.helpers import answer, call, scripted
from tools.contract import idempotency_key_for
from tools.models import OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)

SEARCH = {"query": "plan"}
NOTIFY = {"recipient": "ops", "message": "v2 shipped"}


def llm(*calls):
    return {
        "content": "",
        "tool_calls": [{"name": name, "arguments": arguments} for name, arguments in calls],
    }


def old_run(status, *, last_attempt_reached_the_write=False):
    """A run as the old code left it, migrated."""
    request = parse_run_request(
        scripted(
            call("search_notes", **SEARCH),
            call("send_notification", **NOTIFY),
            answer("done"),
            tools=["search_notes", "send_notification"],
        )
    ).as_json()
    run = create_queued_run(request, request["prompt"])
    run_id = str(run.pk)
    notify_key = idempotency_key_for(run_id, "2.0", "send_notification", NOTIFY)
    search_key = idempotency_key_for(run_id, "1.0", "search_notes", SEARCH)
    # The world: attempt 1's notification was sent.
    sent = OutboxNotification.objects.create(
        recipient="ops", message="v2 shipped", run_id=run.pk, idempotency_key=notify_key
    )
    result = {"notification_id": sent.pk, "recipient": "ops"}
    searched = {
        "kind": "tool",
        "tool_name": "search_notes",
        "effect": "read_only",
        "arguments": SEARCH,
        "result": {"matches": []},
        "idempotency_key": search_key,
    }
    # What the old code recorded. Attempt 1: search, notify, then the model
    # call for turn 3 failed (server_error, retried). Attempt 2 started over:
    # search again, then its model call for turn 2 failed (retried again).
    history = [
        (1, {"kind": "request", "arguments": request}),
        (1, {"kind": "llm", "result": llm(("search_notes", SEARCH))}),
        (1, searched),
        (1, {"kind": "llm", "result": llm(("send_notification", NOTIFY))}),
        (
            1,
            {
                "kind": "tool",
                "tool_name": "send_notification",
                "effect": "non_idempotent_write",
                "arguments": NOTIFY,
                "result": result,
                "idempotency_key": notify_key,
            },
        ),
        (2, {"kind": "request", "arguments": request}),
        (2, {"kind": "llm", "result": llm(("search_notes", SEARCH))}),
        (2, searched),
    ]
    if last_attempt_reached_the_write:
        replayed = {**history[4][1], "replay_of": 5}
        history += [
            (2, {"kind": "llm", "result": llm(("send_notification", NOTIFY))}),
            (2, replayed),
        ]
    for sequence, (token, step) in enumerate(history, start=1):
        RunStep.objects.create(run=run, sequence=sequence, lease_token=token, **step)
    AgentRun.objects.filter(pk=run.pk).update(
        status=status, step_count=len(history), lease_token=2, requeue_count=2
    )

    migration = importlib.import_module("runs.migrations.0013_journal_resume")
    with connection.cursor() as cursor:
        cursor.execute(migration.LAST_ATTEMPTS_CONVERSATION)
    run = AgentRun.objects.get(pk=run.pk)
    assert run.journal_begins_after == 6  # attempt 2's conversation
    return run


WHY = (
    "step 5 executed the non_idempotent_write 'send_notification' before the journal begins "
    "(an attempt that started over, before attempts resumed), and the journal does not hold "
    "it: resuming could repeat it"
)


def test_an_old_runs_write_recorded_by_an_earlier_attempt_is_not_repeated_after_the_migration():
    run = old_run("queued")
    run_queued(run.pk)  # the first attempt after the upgrade

    run = AgentRun.objects.get(pk=run.pk)
    assert (run.status, run.termination_reason) == ("failed", "journal_unreplayable")
    assert run.error_message == WHY
    assert OutboxNotification.objects.count() == 1


def test_an_old_failed_run_that_executed_a_non_idempotent_write_is_refused_both_ways():
    run = old_run("failed")
    requeue = requeue_safety(run)
    assert (requeue.allowed, requeue.code) == (False, "journal_unreplayable")
    assert WHY in requeue.reason
    restart = restart_safety(run)
    assert (restart.allowed, restart.code) == (False, "non_idempotent_executed")


def test_an_old_run_whose_last_attempt_replayed_the_write_resumes_after_it():
    """The last attempt got as far: it holds the write (the old code copied
    its outcome under the same key), so resuming repeats nothing."""
    run = old_run("failed", last_attempt_reached_the_write=True)
    verdict = requeue_safety(run)
    assert verdict.allowed, verdict.reason
    assert verdict.reason.startswith("resumes after step 10; replays 1 writes")
