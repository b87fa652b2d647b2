"""G12's edges in what a journal holds and a model sends: a verdict on any
LLM step a row can hold, token counts a provider gets wrong, a recorded
final answer at the iteration cap, a tool call without an id or a name, a
cap that is not a whole number, the turns a resumed attempt tells the model,
and a result the journal keeps in another form than the model saw."""

import pytest
from django.db import connection

from runs.models import RunStep
from runs.operators.requeue_safety import requeue_safety
from runs.runtime import enqueue, run_queued
from tests.helpers import (
    answer,
    call,
    cancelled_once,
    fresh,
    run_when_due,
    scripted,
)
from tools.contract import Tool
from tools.models import Note, OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)


def _failed_after_a_read():
    Note.objects.create(slug="plan", body="ship v2")
    agent_run = fresh(
        enqueue(
            scripted(call("search_notes", query="plan"), {"error": "auth"}, tools=["search_notes"])
        )
    )
    assert agent_run.status == "failed"
    return agent_run


def _append_raw_llm_step(agent_run, result_json: str):
    """An llm step as a database row can hold it (an old release's, an
    import's, a hand-made one), after the journal's last step."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_agentrun SET step_count = step_count + 1 WHERE id = %s "
            "RETURNING step_count, lease_token",
            [agent_run.pk],
        )
        sequence, token = cursor.fetchone()
        cursor.execute(
            "INSERT INTO runs_runstep (run_id, sequence, lease_token, created_at, kind, "
            "tool_name, effect, arguments, result, error, idempotency_key) "
            "VALUES (%s, %s, %s, now(), 'llm', '', '', NULL, %s::jsonb, '', '')",
            [agent_run.pk, sequence, token, result_json],
        )
    return fresh(agent_run)


@pytest.mark.parametrize(
    ("result_json", "code"),
    [
        ('{"tool_calls": [{"name": "search_notes"}], "usage": {"prompt_tokens": "many"}}', "safe"),
        ('{"tool_calls": [{"name": "search_notes"}], "usage": {"prompt_tokens": [3]}}', "safe"),
        ('{"tool_calls": [{"name": "search_notes"}], "usage": {"prompt_tokens": 1e400}}', "safe"),
        ("null", "journal_unreplayable"),
        ("[1, 2]", "journal_unreplayable"),
        ('{"content": 5}', "journal_unreplayable"),
        ('{"tool_calls": "abc"}', "journal_unreplayable"),
        ('{"tool_calls": [{"id": 1}]}', "journal_unreplayable"),
    ],
)
def test_the_verdict_says_why_on_any_llm_step_a_row_can_hold(
    result_json, code, api, operator_client
):
    agent_run = _append_raw_llm_step(_failed_after_a_read(), result_json)
    assert requeue_safety(agent_run).code == code
    assert operator_client.get(f"/admin/runs/agentrun/{agent_run.pk}/change/").status_code == 200
    assert api.get(f"/api/runs/{agent_run.pk}/requeue/").status_code == 200
    expected = 202 if code == "safe" else 409
    assert api.post(f"/api/runs/{agent_run.pk}/requeue/", {}, format="json").status_code == (
        expected
    )


def test_odd_token_counts_from_a_provider_never_fail_a_record(fake_openai):
    from tests.fake_openai import Reply, completion

    body = completion("done")
    body["usage"] = {"prompt_tokens": -5, "completion_tokens": 10**12}
    fake_openai.script(Reply(body=body))
    agent_run = fresh(
        enqueue({"prompt": "hi", "tools": [], "provider": {"kind": "openai", "model": "m"}})
    )
    assert agent_run.status == "completed", agent_run.error_message
    # Counts that are no sane whole number say nothing: unknown, never a
    # clamped guess (G17), and the record still goes in.
    assert (agent_run.prompt_tokens, agent_run.completion_tokens) == (0, 0)
    assert (agent_run.unpriced_turns, agent_run.known_cost) == (1, None)


@pytest.mark.parametrize("max_iterations", [2, 3])
def test_a_recorded_final_answer_at_the_cap_is_what_a_resume_completes_with(max_iterations, queue):
    Note.objects.create(slug="plan", body="ship v2")
    agent_run = enqueue(
        scripted(
            call("search_notes", query="plan"),
            answer("the plan is v2", delay_seconds=1.5),
            tools=["search_notes"],
            max_iterations=max_iterations,
        )
    )
    tool_step = RunStep.objects.filter(run_id=agent_run.pk, kind="tool")
    with cancelled_once(agent_run.pk, tool_step.exists, what="the tool step"):
        run_queued(agent_run.pk)
    agent_run = fresh(agent_run)
    assert agent_run.status == "cancelled"
    verdict = requeue_safety(agent_run)
    assert verdict.allowed, verdict.reason
    assert "recorded final answer completes the run" in verdict.reason


def test_a_model_tool_call_without_an_id_or_name_is_taken_as_it_comes(fake_openai):
    """An OpenAI-compatible server may send ``"id": null``: the call gets an
    id of the loop's own; one with no name is refused as not offered."""
    import json

    from tests.fake_openai import Reply, completion

    Note.objects.create(slug="plan", body="ship v2")
    fake_openai.script(
        Reply(body=completion(tool_calls=[(None, "search_notes", json.dumps({"query": "plan"}))])),
        Reply(body=completion(tool_calls=[("c2", None, "{}")])),
        Reply(body=completion("found it")),
    )
    agent_run = fresh(
        enqueue(
            {
                "prompt": "find",
                "tools": ["search_notes"],
                "provider": {"kind": "openai", "model": "m"},
            }
        )
    )
    assert (agent_run.status, agent_run.output) == ("completed", "found it"), (
        agent_run.error_message
    )
    assert "is not offered to this run" in agent_run.steps.filter(kind="tool").last().error


def test_a_max_iterations_that_is_not_a_whole_number_is_refused(api):
    response = api.post(
        "/api/runs/",
        {
            "prompt": "hi",
            "provider": {"kind": "scripted", "turns": [{"content": "x"}]},
            "max_iterations": 2.0,
        },
        format="json",
    )
    assert response.status_code == 400
    assert "max_iterations: 2.0 is not a whole number" in response.json()["detail"]


def test_a_resumed_attempt_tells_the_model_the_turns_it_was_told_live(fake_openai, queue):
    """Faithful replay: up to where it goes live, the resumed attempt sends the
    conversation the live one sent (the model's key order included)."""
    from tests.fake_openai import Reply, completion, error

    arguments = '{"recipient": "ops", "message": "v2 shipped"}'
    fake_openai.script(
        Reply(body=completion(tool_calls=[("c1", "send_notification", arguments)])), error(500)
    )
    fake_openai.default = Reply(body=completion("done"))
    agent_run = enqueue(
        {
            "prompt": "notify",
            "tools": ["send_notification"],
            "provider": {"kind": "openai", "model": "m"},
        }
    )
    run_queued(agent_run.pk)  # attempt 1: the write, then a 500 (retryable)
    assert fresh(agent_run).status == "queued"
    run_when_due(agent_run.pk)  # attempt 2: resumes
    assert fresh(agent_run).status == "completed"
    live, resumed = (request["body"]["messages"] for request in fake_openai.requests[1:3])
    assert resumed == live
    assert OutboxNotification.objects.count() == 1


class Colliding(Tool):
    name = "colliding_result"
    description = "returns values the journal keeps in another form"
    parameters = {"type": "object", "properties": {}, "additionalProperties": True}

    def run(self, arguments, context):
        return {
            "a\x00": 1,
            "a\ufffd": 2,
            1: "int key",
            "1": "str key",
            "t": ((1.5e300, -0.0), (float("nan"), 1e16)),
        }


def test_a_result_the_journal_keeps_in_another_form_is_what_the_model_saw(settings):
    settings.NRLLM_TOOLS = ["tests.test_resume_model_output.Colliding"]
    agent_run = fresh(
        enqueue(scripted(call("colliding_result"), answer("ok"), tools=["colliding_result"]))
    )
    assert agent_run.status == "completed", agent_run.error_message
    step = agent_run.steps.get(kind="tool")
    assert step.result["a\ufffd"] == 2 and step.result["1"] == "str key"
    assert step.result["t"] == [[15 * 10**299, 0.0], ["NaN", 10**16]]
