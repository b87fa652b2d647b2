"""The OpenAI-compatible provider against a local chat-completions server:
tool calling round trips, the failure table row by row, the circuit breaker."""

import json
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from runs.models import AgentRun, CircuitTransition, ProviderCircuit
from runs.providers.openai_failures import FAILURE_TABLE
from runs.runtime import enqueue, run
from runs.runtime.run_request import InvalidRunRequest
from tests.fake_openai import Reply, completion, error
from tests.helpers import retried_when_due
from tools.models import Note, OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)

OPENAI = {"kind": "openai", "model": "fake-model"}


def request(*, tools=("read_note", "send_notification"), **provider):
    return {"prompt": "do it", "tools": list(tools), "provider": {**OPENAI, **provider}}


def test_a_run_calls_a_read_and_a_write_tool_and_answers(fake_openai):
    Note.objects.create(slug="plan", body="ship")
    fake_openai.script(
        Reply(body=completion(tool_calls=[("c1", "read_note", '{"slug": "plan"}')])),
        Reply(
            body=completion(
                tool_calls=[
                    ("c2", "send_notification", '{"recipient": "team", "message": "shipped"}')
                ]
            )
        ),
        Reply(body=completion("All done.")),
    )
    agent_run = run(request(temperature=0.2, max_tokens=64))
    assert (agent_run.status, agent_run.output) == ("completed", "All done.")
    assert OutboxNotification.objects.get().recipient == "team"

    first, second, third = (sent["body"] for sent in fake_openai.requests)
    assert (first["model"], first["temperature"], first["max_tokens"]) == ("fake-model", 0.2, 64)
    functions = {tool["function"]["name"]: tool for tool in first["tools"]}
    assert functions["read_note"]["type"] == "function"
    assert functions["read_note"]["function"]["parameters"]["required"] == ["slug"]
    headers = {name.lower(): value for name, value in fake_openai.requests[0]["headers"].items()}
    assert headers["authorization"] == "Bearer sk-test-not-a-real-key"
    # Tool calls and results round-trip in the protocol's own shape.
    assistant, tool_result = second["messages"][-2:]
    assert assistant["tool_calls"][0]["id"] == "c1"
    assert tool_result == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": json.dumps({"body": "ship", "slug": "plan"}, sort_keys=True),
    }
    assert third["messages"][-1]["tool_call_id"] == "c2"

    llm_steps = list(agent_run.steps.filter(kind="llm").order_by("sequence"))
    assert [step.result["finish_reason"] for step in llm_steps] == [
        "tool_calls",
        "tool_calls",
        "stop",
    ]
    assert all(step.result["model"] == "fake-model" for step in llm_steps)
    assert llm_steps[0].result["usage"] == {"prompt_tokens": 11, "completion_tokens": 7}
    assert all(step.result["latency_ms"] >= 0 for step in llm_steps)
    assert (agent_run.prompt_tokens, agent_run.completion_tokens) == (33, 21)
    # The key is configuration: it is stored nowhere.
    stored = json.dumps([agent_run.request, list(agent_run.steps.values_list("result", flat=True))])
    assert "sk-test" not in stored


def test_a_malformed_tool_call_is_fed_back_as_a_tool_error(fake_openai):
    fake_openai.script(
        Reply(body=completion(tool_calls=[("c1", "read_note", "{not json")])),
        Reply(body=completion(tool_calls=[("c2", "drop_tables", "{}")])),
        Reply(body=completion("sorry")),
    )
    agent_run = run(request())
    errors = list(agent_run.steps.filter(kind="tool").values_list("error", flat=True))
    assert "not valid JSON" in errors[0] and "is not offered to this run" in errors[1]
    fed_back = [
        message
        for message in fake_openai.requests[2]["body"]["messages"]
        if message["role"] == "tool"
    ]
    assert [message["tool_call_id"] for message in fed_back] == ["c1", "c2"]
    assert "not valid JSON" in fed_back[0]["content"]
    assert agent_run.status == "completed"


def test_arguments_nested_past_the_parsers_recursion_are_the_models_mistake(fake_openai):
    fake_openai.script(
        Reply(body=completion(tool_calls=[("c1", "read_note", "[" * 100_000)])),
        Reply(body=completion("sorry")),
    )
    agent_run = run(request())
    assert agent_run.status == "completed"
    error = agent_run.steps.get(kind="tool").error
    assert "not valid JSON (nested too deeply)" in error


def test_a_run_naming_an_unconfigured_provider_is_refused_at_enqueue(settings):
    settings.NRLLM_OPENAI_API_KEY = ""
    with pytest.raises(InvalidRunRequest, match="not configured: set NRLLM_OPENAI_API_KEY"):
        enqueue(request())
    assert AgentRun.objects.count() == 0


@pytest.mark.parametrize(
    ("status", "failure_class"),
    [
        (429, "rate_limit"),
        (401, "auth"),
        (403, "auth"),
        (400, "client_error"),
        (404, "client_error"),
        (422, "client_error"),
        (500, "server_error"),
        (502, "server_error"),
        (503, "server_error"),
        (418, "unknown"),
    ],
)
def test_each_http_failure_maps_to_its_class(fake_openai, status, failure_class):
    fake_openai.script(error(status))
    agent_run = run(request())
    assert (agent_run.status, agent_run.failure_class) == ("failed", failure_class)


@pytest.mark.parametrize(
    ("reply", "named"),
    [
        (Reply(raw=b"<html>502 Bad Gateway</html>", content_type="text/html"), "not JSON"),
        (Reply(raw=b'{"choices": [', content_type="application/json"), "not JSON"),
        (Reply(raw=b'{"choices": "\xff"}'), "not JSON (not UTF-8)"),
        (Reply(raw=b"[" * 100_000), "not JSON (nested too deeply)"),
        (Reply(raw=b"[" * 100_000, content_type="text/plain"), "not JSON"),
        (Reply(raw=b"null"), "the body is missing, not an object"),
        (Reply(body={**completion("x"), "choices": []}), "'choices' is empty"),
        (Reply(body={"id": "x"}), "'choices' is missing, not a list"),
        (Reply(body={"choices": [{"index": 0}]}), "choices[0].message is missing"),
        (
            Reply(body={"choices": [{"message": {"content": ["a"]}}]}),
            "choices[0].message.content is a list, not a string",
        ),
        (
            Reply(body={"choices": [{"message": {"tool_calls": [{"id": "c1"}]}}]}),
            "choices[0].message.tool_calls[0].function is missing",
        ),
    ],
)
def test_a_200_that_is_not_a_chat_completion_is_a_server_error_naming_what_is_wrong(
    fake_openai, settings, reply, named
):
    """Retried with backoff as a server's failure (the queued run is back in
    the queue, nothing recorded of the turn), never read as an answer; and a
    circuit's trial answered so has failed."""
    settings.NRLLM_RETRY_BACKOFF_SECONDS = 60
    fake_openai.script(reply)
    agent_run = enqueue(request())
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.requeue_count) == ("queued", 1)
    assert agent_run.failure_class == "server_error"
    assert agent_run.error_message.endswith(named) or named in agent_run.error_message
    assert "the provider's answer is not a chat completion" in agent_run.error_message
    assert not agent_run.steps.filter(kind="llm").exists()

    settings.NRLLM_CIRCUIT_FAILURES = 1
    ProviderCircuit.objects.update(state="open", opened_at=timezone.now() - timedelta(hours=1))
    fake_openai.script(reply)
    assert run(request()).failure_class == "server_error"  # the trial
    assert transitions()[-2:] == [("open", "half_open"), ("half_open", "open")]


def test_the_table_has_a_row_for_connections_and_5xx():
    described = {what for what, _, _ in FAILURE_TABLE}
    assert {"connection error or timeout", "HTTP 5xx"} <= described


def test_a_refused_connection_is_a_connection_failure(settings):
    settings.NRLLM_OPENAI_BASE_URL = "http://127.0.0.1:1/v1"
    settings.NRLLM_OPENAI_API_KEY = "sk-test"
    assert run(request()).failure_class == "connection"


def test_a_slow_response_past_the_read_timeout_is_a_connection_failure(fake_openai, settings):
    settings.NRLLM_OPENAI_READ_TIMEOUT_SECONDS = 1
    fake_openai.script(Reply(body=completion("late"), delay_seconds=3))
    agent_run = run(request())
    assert (agent_run.failure_class, agent_run.error_type) == ("connection", "ProviderError")


def test_429_passes_the_servers_retry_after_to_the_backoff(fake_openai, settings):
    settings.NRLLM_RETRY_BACKOFF_SECONDS = 1
    fake_openai.script(error(429, headers={"retry-after": "40"}))
    agent_run = enqueue(request())
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.requeue_count) == ("queued", 1)
    assert agent_run.available_at - agent_run.created_at >= timedelta(seconds=39)
    retried_when_due()
    agent_run.refresh_from_db()
    assert agent_run.status == "completed"


def circuit():
    return ProviderCircuit.objects.get()


def transitions():
    return list(
        CircuitTransition.objects.order_by("at", "pk").values_list("from_state", "to_state")
    )


def test_the_breaker_opens_fails_fast_and_a_trial_closes_it(fake_openai, settings):
    settings.NRLLM_CIRCUIT_FAILURES = 2
    fake_openai.default = error(500)
    assert [run(request()).failure_class for _ in range(3)] == [
        "server_error",
        "server_error",
        "circuit_open",
    ]
    assert len(fake_openai.requests) == 2  # the third never reached the provider
    assert circuit().state == "open"

    fake_openai.default = Reply(body=completion("back"))
    assert run(request()).failure_class == "circuit_open"  # still cooling down
    ProviderCircuit.objects.update(opened_at=timezone.now() - timedelta(hours=1))
    assert run(request()).status == "completed"
    assert circuit().state == "closed"
    assert transitions() == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


def test_a_failed_trial_reopens_the_circuit(fake_openai, settings):
    settings.NRLLM_CIRCUIT_FAILURES = 1
    fake_openai.default = error(502)
    run(request())
    ProviderCircuit.objects.update(opened_at=timezone.now() - timedelta(hours=1))
    assert run(request()).failure_class == "server_error"  # the trial
    assert circuit().state == "open"
    assert transitions()[-2:] == [("open", "half_open"), ("half_open", "open")]


def test_a_call_let_through_closed_does_not_close_the_circuit_that_opened_meanwhile(
    fake_openai, settings
):
    """Only a trial's success closes a circuit: a call let through while it
    was closed and answered after other calls opened it leaves it open, so
    the cool-down holds."""
    settings.NRLLM_CIRCUIT_FAILURES = 2

    def brain(body):
        if any(message.get("content") == "slow" for message in body["messages"]):
            return Reply(body=completion("late, but fine"), delay_seconds=1.5)
        return error(500)

    fake_openai.brain = brain
    finished = []

    def run_slowly():
        try:
            finished.append(run({**request(), "prompt": "slow"}))
        finally:
            connection.close()  # this thread's own

    slow = threading.Thread(target=run_slowly)
    slow.start()
    deadline = time.monotonic() + 10
    while not fake_openai.requests and time.monotonic() < deadline:
        time.sleep(0.01)  # the slow call is on its way before the circuit opens
    assert [run(request()).failure_class for _ in range(2)] == ["server_error"] * 2
    slow.join(timeout=30)
    assert finished[0].status == "completed"
    assert circuit().state == "open"
    assert transitions() == [("closed", "open")]


def test_client_errors_do_not_count_towards_the_breaker(fake_openai, settings):
    settings.NRLLM_CIRCUIT_FAILURES = 1
    fake_openai.default = error(400)
    run(request())
    run(request())
    assert circuit().state == "closed" and len(fake_openai.requests) == 2


@pytest.mark.worker
def test_the_breaker_is_shared_by_two_worker_processes(fake_openai, workers, settings):
    fake_openai.default = error(500)
    runs = [enqueue(request()) for _ in range(8)]
    # One run at a time a process (the forking worker): the bound below
    # counts one call in flight per worker.
    env = {
        "NRLLM_CIRCUIT_FAILURES": 3,
        "NRLLM_MAX_REQUEUES": 0,
        "NRLLM_WORKER_CLASS": "runs.worker.Worker",
    }
    pair = [workers.start(burst=True, **env), workers.start(burst=True, **env)]
    for worker in pair:
        worker.communicate(timeout=60)
    classes = sorted(AgentRun.objects.values_list("failure_class", flat=True))
    # At most one call per worker can be in flight when the circuit opens.
    assert 3 <= len(fake_openai.requests) <= 4
    assert classes.count("circuit_open") == 8 - len(fake_openai.requests)
    # circuit_open is retryable: with no budget left those runs are exhausted, not refused.
    reasons = set(
        AgentRun.objects.filter(failure_class="circuit_open").values_list(
            "termination_reason", flat=True
        )
    )
    assert reasons == {"retries_exhausted"}
    assert circuit().state == "open"

    fake_openai.default = Reply(body=completion("recovered"))
    ProviderCircuit.objects.update(opened_at=timezone.now() - timedelta(hours=1))
    recovered = enqueue(request())
    workers.run_burst(**env)
    recovered.refresh_from_db()
    assert recovered.status == "completed" and circuit().state == "closed"
    assert len(runs) == 8


def test_circuits_are_visible_to_operators(fake_openai, settings, api, operator_client):
    settings.NRLLM_CIRCUIT_FAILURES = 1
    fake_openai.default = error(500)
    run(request())
    [listed] = api.get("/api/providers/").json()
    assert listed["state"] == "open" and listed["key"].endswith(" fake-model")
    assert listed["transitions"][0]["to_state"] == "open"
    assert listed["cooldown_left_seconds"] > 0
    page = operator_client.get("/admin/").content.decode()  # the overview
    assert "fake-model" in page and "closed → open" in page


def test_a_worker_without_the_key_fails_the_run_as_configuration(fake_openai, settings):
    from django.db import transaction

    with transaction.atomic():
        agent_run = enqueue(request())  # valid while the key is set...
        settings.NRLLM_OPENAI_API_KEY = ""  # ...but the executing process has none
    agent_run.refresh_from_db()
    assert (agent_run.failure_class, agent_run.termination_reason) == (
        "configuration",
        "not_retryable",
    )
    assert fake_openai.requests == []
