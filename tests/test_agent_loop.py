"""The agent loop through the runtime: steps, refusals, the iteration cap."""

import pytest

from runs.models import AgentRun
from runs.runtime import run
from tests.helpers import answer, call, scripted
from tools.models import Note, OutboxNotification

pytestmark = pytest.mark.django_db


def steps_of(agent_run):
    return list(agent_run.steps.values_list("sequence", "kind", "tool_name", "effect", "error"))


def test_a_run_that_reads_and_writes_records_every_step():
    Note.objects.create(slug="plan", body="ship it")
    agent_run = run(
        scripted(
            call("read_note", slug="plan"),
            {
                "tool_calls": [
                    {"name": "upsert_note", "arguments": {"slug": "plan", "body": "shipped"}},
                    {"name": "send_notification", "arguments": {"recipient": "a", "message": "b"}},
                ]
            },
            answer("all done"),
            tools=["read_note", "upsert_note", "send_notification"],
        )
    )
    assert (agent_run.status, agent_run.termination_reason, agent_run.output) == (
        "completed",
        "completed",
        "all done",
    )
    assert steps_of(agent_run) == [
        (1, "request", "", "", ""),
        (2, "llm", "", "", ""),
        (3, "tool", "read_note", "read_only", ""),
        (4, "llm", "", "", ""),
        (5, "tool", "upsert_note", "idempotent_write", ""),
        (6, "tool", "send_notification", "non_idempotent_write", ""),
        (7, "llm", "", "", ""),
    ]
    assert agent_run.steps.get(sequence=3).result == {"slug": "plan", "body": "ship it"}
    assert Note.objects.get(slug="plan").body == "shipped"
    notification = OutboxNotification.objects.get()
    assert notification.idempotency_key == agent_run.steps.get(sequence=6).idempotency_key
    assert agent_run.pending_effect == "" and agent_run.lease_owner == ""
    assert {step.lease_token for step in agent_run.steps.all()} == {1}


def test_a_tool_that_was_not_offered_is_refused_and_never_executed():
    agent_run = run(
        scripted(
            call("send_notification", recipient="a", message="b"),
            answer(),
            tools=["read_note"],
        )
    )
    assert agent_run.status == "completed"
    step = agent_run.steps.get(kind="tool")
    assert step.error.startswith("tool 'send_notification' is not offered to this run")
    assert step.effect == "" and step.idempotency_key == ""
    assert OutboxNotification.objects.count() == 0


def test_invalid_arguments_become_a_tool_error_and_are_not_executed():
    agent_run = run(
        scripted(
            call("send_notification", recipient="a", message="", extra=1),
            answer(),
            tools=["send_notification"],
        )
    )
    step = agent_run.steps.get(kind="tool")
    assert step.error.startswith("invalid arguments: ")
    assert "message: '' should be non-empty" in step.error
    assert "'extra' was unexpected" in step.error
    assert OutboxNotification.objects.count() == 0
    assert agent_run.status == "completed"


def test_a_tool_error_is_fed_back_and_the_run_goes_on():
    agent_run = run(scripted(call("read_note", slug="nope"), answer("sorry"), tools=["read_note"]))
    assert agent_run.steps.get(kind="tool").error == "no note with slug 'nope'"
    assert agent_run.output == "sorry"


def test_the_iteration_cap_ends_the_run():
    agent_run = run(
        scripted(
            *[call("search_notes", query="x")] * 5,
            tools=["search_notes"],
            max_iterations=2,
        )
    )
    assert (agent_run.status, agent_run.termination_reason) == ("failed", "max_iterations")
    assert agent_run.steps.filter(kind="llm").count() == 2


def test_an_interactive_provider_failure_settles_failed():
    agent_run = run(scripted({"error": "rate_limit"}))
    assert (agent_run.status, agent_run.termination_reason, agent_run.failure_class) == (
        "failed",
        "provider_failed",
        "rate_limit",
    )
    assert agent_run.dead_letters.count() == 0
    assert AgentRun.objects.get().mode == "interactive"


def _enqueue_a_notification_then_disable_the_tool():
    """Enqueue a run that calls send_notification; an operator switches the
    tool off before any worker picks the run up (both in one transaction,
    so the run executes only once the switch is committed)."""
    from django.db import transaction

    from runs.runtime import enqueue
    from tools.models import ToolSetting

    with transaction.atomic():
        agent_run = enqueue(
            scripted(
                call("send_notification", recipient="a", message="b"),
                answer(),
                tools=["send_notification"],
            )
        )
        ToolSetting.objects.filter(name="send_notification").update(enabled=False)
    agent_run.refresh_from_db()
    return agent_run


@pytest.mark.django_db(transaction=True)
def test_a_tool_disabled_after_enqueue_is_not_offered_and_not_executed():
    agent_run = _enqueue_a_notification_then_disable_the_tool()
    assert agent_run.status == "completed"
    assert "is not offered to this run" in agent_run.steps.get(kind="tool").error
    assert OutboxNotification.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_tool_disabled_after_enqueue_is_not_offered_when_the_claim_falls_back_to_the_orm():
    from runs.models.faults import step_inserts_refused

    # The request step refused: the one-statement claim fails with it, and
    # the claim is made again without it, through the ORM.
    with step_inserts_refused(kind="request"):
        agent_run = _enqueue_a_notification_then_disable_the_tool()
    assert agent_run.status == "completed"
    assert list(agent_run.steps.values_list("kind", flat=True)) == ["llm", "tool", "llm"]
    assert "is not offered to this run" in agent_run.steps.get(kind="tool").error
    assert OutboxNotification.objects.count() == 0
