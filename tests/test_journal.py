"""G12: the journal a resumed attempt replays — read in one query, never
copied step by step, and refused (naming the step) rather than improvised
over when it no longer fits the world."""

import importlib

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import transitions
from runs.models import AgentRun, DeadLetter, RunStep
from runs.operators.requeue_safety import requeue_safety
from runs.runtime import enqueue, run_queued
from runs.runtime.journal import JournalUnreplayable, read_journal
from runs.runtime.run_request import parse_run_request
from tests.helpers import answer, call, fresh, run_when_due, scripted
from tools.contract import idempotency_key_for
from tools.models import ToolSetting

pytestmark = pytest.mark.django_db(transaction=True)

FLAKY = {"error": "server_error", "attempts": 1}


def recorded_a_write_then_failed(tool, **arguments):
    """A queued run whose first attempt recorded a write, then failed with a
    retryable error: its retry waits in Redis while this process, playing
    the worker, changes the world before executing it."""
    agent_run = enqueue(scripted(call(tool, **arguments), FLAKY, answer(), tools=[tool]))
    run_queued(agent_run.pk)
    assert fresh(agent_run).status == "queued"
    return agent_run


def disable_upsert_note(agent_run, settings):
    ToolSetting.objects.update_or_create(name="upsert_note", defaults={"enabled": False})


def unregister_the_fence_probe(agent_run, settings):
    settings.NRLLM_TOOLS = []


def retire_the_provider(agent_run, settings):
    request = {**agent_run.request, "provider": {"kind": "retired"}}
    AgentRun.objects.filter(pk=agent_run.pk).update(request=request)


@pytest.mark.parametrize(
    ("tool", "arguments", "change_the_world", "reason"),
    [
        (
            "upsert_note",
            {"slug": "a", "body": "b"},
            disable_upsert_note,
            "step 3 records the idempotent_write tool 'upsert_note', which an operator has "
            "disabled since",
        ),
        (
            "fence_probe_write",
            {},
            unregister_the_fence_probe,
            "step 3 records the idempotent_write tool 'fence_probe_write', which is no longer "
            "registered",
        ),
        (
            "upsert_note",
            {"slug": "a", "body": "b"},
            retire_the_provider,
            'the stored request no longer parses: provider/kind: unknown provider "retired"; '
            'known: ["openai", "scripted"]',
        ),
    ],
)
def test_a_journal_that_no_longer_fits_the_world_dead_letters_the_run_naming_why(
    queue, settings, api, tool, arguments, change_the_world, reason
):
    settings.NRLLM_TOOLS = ["tests.tools_for_tests.FenceProbe"]
    agent_run = recorded_a_write_then_failed(tool, **arguments)
    change_the_world(agent_run, settings)
    run_when_due(agent_run.pk)

    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.termination_reason) == ("failed", "journal_unreplayable")
    assert (agent_run.error_type, agent_run.error_message) == ("JournalUnreplayable", reason)
    assert DeadLetter.objects.get(run=agent_run).reason == "journal_unreplayable"
    # The attempt did nothing live: no model turn, no tool call after the journal.
    assert list(agent_run.steps.filter(lease_token=2).values_list("kind", flat=True)) == ["request"]
    # It executed a write: the write audits list it, with the reason.
    [audit] = api.get("/api/write-audits/").json()
    assert audit["run"]["id"] == str(agent_run.pk)
    assert audit["run"]["error_message"] == reason
    # A requeue would meet the same journal: the verdict says so.
    verdict = requeue_safety(agent_run)
    assert not verdict.allowed and verdict.code in ("journal_unreplayable", "request_invalid")


def test_the_write_audit_page_shows_an_unreplayable_journal_that_holds_a_write(
    queue, operator_client
):
    agent_run = recorded_a_write_then_failed("upsert_note", slug="a", body="b")
    ToolSetting.objects.update_or_create(name="upsert_note", defaults={"enabled": False})
    run_when_due(agent_run.pk)
    page = operator_client.get("/admin/runs/agentrun/write-audits/").content.decode()
    assert str(agent_run.pk) in page and "journal_unreplayable" in page
    assert "which an operator has disabled since" in page


def journal_of(*steps):
    """A running run whose journal is ``steps`` (kind, result/tool), recorded
    through the guarded transitions, then requeued for a retry. An executed
    outcome gets the idempotency key of the call at its place, as the
    runtime gives it; ``"key": "other"`` gives it another call's."""
    request = parse_run_request(scripted(answer(), tools=["search_notes"])).as_json()
    agent_run = transitions.create_queued_run(request, "p")
    lease = transitions.claim(agent_run.pk, "w", 60).lease
    turns, outcomes = [], 0
    for step in steps:
        step = dict(step)
        if step["kind"] == "llm":
            turns.append(step["result"].get("tool_calls") or [])
            outcomes = 0
        elif turns and outcomes < len(turns[-1]):
            asked = turns[-1][outcomes]
            arguments = (
                {"query": "another"} if step.pop("key", "") == "other" else asked["arguments"]
            )
            position = f"{len(turns)}.{outcomes}"
            step["idempotency_key"] = idempotency_key_for(
                lease.run_id, position, asked["name"], arguments
            )
            outcomes += 1
        step.pop("key", None)
        outcome = transitions.record_step(lease, 60, step, clear_fence=False)
        assert outcome.persisted
    assert transitions.requeue_for_retry(
        lease, failure_class="connection", error_type="E", error_message="gone"
    )
    return agent_run


def turn(*names, content=""):
    calls = [{"name": name, "arguments": {"query": "q"}} for name in names]
    return {"kind": "llm", "result": {"content": content, "tool_calls": calls}}


def outcome(name="search_notes", effect="read_only", **extra):
    return {"kind": "tool", "tool_name": name, "effect": effect, "result": {"matches": []}, **extra}


@pytest.mark.parametrize(
    ("steps", "why"),
    [
        (
            [turn("search_notes", "search_notes"), outcome(), turn("search_notes")],
            "step 4: the model turn at step 2 asked for 2 calls, but the journal records 1 "
            "outcomes before the next turn (a gap)",
        ),
        ([outcome()], "step 2: a tool result before any model turn"),
        (
            [turn("search_notes"), outcome("read_note")],
            "step 3 records 'read_note' where the model turn at step 2 asked for 'search_notes'",
        ),
        (
            [turn("search_notes"), outcome(), outcome()],
            "step 4: more tool results than the 1 calls the model turn at step 2 asked for",
        ),
        (
            [turn(content="done"), turn("search_notes")],
            "step 3: a model turn after the final answer at step 2",
        ),
        (
            [{"kind": "llm", "result": {"tool_calls": "not a list"}}],
            "step 2: the recorded model turn is not in the shape of one",
        ),
        (
            [turn("search_notes", "search_notes"), outcome(key="other")],
            "step 3 records the outcome of another call than the one the model turn at step 2 "
            "asked for at its place 1.0",
        ),
    ],
)
def test_a_journal_with_a_hole_or_a_contradiction_is_never_replayed(steps, why):
    agent_run = journal_of(*steps)
    with pytest.raises(
        JournalUnreplayable, match="^" + why.replace("(", r"\(").replace(")", r"\)")
    ):
        read_journal(
            agent_run.pk, registered={"search_notes"}, disabled=(), max_iterations=5, requested=()
        )
    run_queued(agent_run.pk)
    agent_run.refresh_from_db()
    assert (agent_run.termination_reason, agent_run.error_message) == ("journal_unreplayable", why)


def test_a_journal_longer_than_the_iteration_cap_is_refused():
    agent_run = journal_of(turn("search_notes"), outcome(), turn("search_notes"), outcome())
    with pytest.raises(JournalUnreplayable, match="more than the run's max_iterations of 1"):
        read_journal(
            agent_run.pk, registered={"search_notes"}, disabled=(), max_iterations=1, requested=()
        )


def resumable_run(turns: int) -> AgentRun:
    """A failed run that recorded ``turns`` model turns and tool results and
    is requeued to resume; the resumed attempt plays the final answer live."""
    reads = [call("search_notes", query=f"q{index}") for index in range(turns)]
    agent_run = enqueue(
        scripted(
            *reads,
            {"error": "auth", "attempts": 1},
            answer("done"),
            tools=["search_notes"],
            max_iterations=turns + 1,
        )
    )
    agent_run = fresh(agent_run)
    assert agent_run.status == "failed"
    assert transitions.operator_requeue(
        agent_run.pk,
        seen_status=agent_run.status,
        seen_step_count=agent_run.step_count,
        step={"kind": "operator", "result": {"action": "requeue"}},
    )
    return agent_run


def test_a_resumed_attempt_reads_its_journal_once_and_copies_no_step(settings):
    settings.NRLLM_MAX_ITERATIONS = 100
    costs = {}
    for turns in (3, 30):
        agent_run = resumable_run(turns)
        before = fresh(agent_run).step_count
        with CaptureQueriesContext(connection) as queries:
            run_queued(agent_run.pk)
        agent_run = fresh(agent_run)
        assert agent_run.status == "completed"
        # The claim's request step, the resume step, the final answer: no copies.
        added = agent_run.steps.filter(sequence__gt=before)
        assert list(added.values_list("kind", flat=True)) == ["request", "resume", "llm"]
        reads = [q["sql"] for q in queries.captured_queries if 'FROM "runs_runstep"' in q["sql"]]
        costs[turns] = (len(queries), len(reads))
    # Claim, journal read, resume step, final answer with the settle.
    assert costs[3] == costs[30] == (4, 1)


def test_the_migration_begins_an_old_runs_journal_at_its_last_attempt():
    """Before resume, every attempt started over: a run's steps hold one
    conversation per attempt, and only the last one may be replayed."""
    migration = importlib.import_module("runs.migrations.0013_journal_resume")
    old = transitions.create_queued_run({"prompt": "p"}, "p")
    history = [
        (1, "request"),
        (1, "llm"),
        (1, "tool"),
        (1, "reaper"),
        (2, "request"),
        (2, "llm"),
        (2, "tool"),
        (2, "llm"),
    ]
    for sequence, (token, kind) in enumerate(history, start=1):
        RunStep.objects.create(run=old, sequence=sequence, lease_token=token, kind=kind)
    AgentRun.objects.filter(pk=old.pk).update(status="failed", step_count=8, lease_token=2)
    completed = transitions.create_queued_run({"prompt": "p"}, "p")
    RunStep.objects.create(run=completed, sequence=1, lease_token=1, kind="llm")
    AgentRun.objects.filter(pk=completed.pk).update(status="completed", step_count=1)

    with connection.cursor() as cursor:
        cursor.execute(migration.LAST_ATTEMPTS_CONVERSATION)
    assert fresh(old).journal_begins_after == 5  # attempt 2's llm is step 6
    assert fresh(completed).journal_begins_after == 0


def test_the_verdict_reads_the_journal_once_whatever_its_length(settings):
    settings.NRLLM_MAX_ITERATIONS = 100
    costs = []
    for turns in (3, 30):
        agent_run = AgentRun.objects.get(
            pk=enqueue(
                scripted(
                    *[call("search_notes", query=f"q{index}") for index in range(turns)],
                    {"error": "auth"},
                    tools=["search_notes"],
                    max_iterations=turns + 1,
                )
            ).pk
        )
        with CaptureQueriesContext(connection) as queries:
            assert requeue_safety(agent_run).allowed
        costs.append(len(queries))
    assert costs[0] == costs[1] <= 3
