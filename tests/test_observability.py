"""/healthz, /readyz, /metrics, and JSON log lines for state changes."""

import json
import logging

import pytest
from django.test import Client

from ground.logs import JsonFormatter
from runs.runtime import run
from tests.helpers import answer, call, manage, retried_when_due, scripted

pytestmark = pytest.mark.django_db


def test_healthz_needs_nothing():
    response = Client().get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_readyz_checks_the_database_and_redis(settings):
    assert Client().get("/readyz").json() == {
        "ready": True,
        "checks": {"database": "ok", "durable_commits": "ok"},
    }
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["redis"].startswith("error: ConnectionError")


def test_a_server_that_cannot_make_a_commit_durable_is_not_ready_and_no_worker_starts(
    settings, worker_env
):
    """The test server runs with fsync off (the harness allows it): without
    that allowance /readyz is 503 and ``rqworker`` refuses to start, both
    naming why (G6, G12)."""
    settings.NRLLM_ALLOW_NON_DURABLE_DATABASE = False
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert "fsync = off" in response.json()["checks"]["durable_commits"]

    env = {**worker_env, "NRLLM_ALLOW_NON_DURABLE_DATABASE": "false"}
    done = manage("rqworker", "--burst", settings.NRLLM_QUEUE_NAME, env=env)
    assert done.returncode != 0
    assert "rqworker not started" in done.stderr and "fsync = off" in done.stderr
    assert "Traceback" not in done.stderr
    done = manage("rqworker-pool", "--burst", settings.NRLLM_QUEUE_NAME, env=env)
    assert done.returncode != 0 and "rqworker-pool not started" in done.stderr


def test_metrics_are_access_controlled(settings, viewer_client, outsider_client):
    assert Client().get("/metrics").status_code == 401
    assert outsider_client.get("/metrics").status_code == 401
    assert viewer_client.get("/metrics").status_code == 200  # staff
    settings.NRLLM_METRICS_TOKEN = "scrape-me"
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me").status_code == 200
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401


def test_metrics_report_runs_steps_and_doubt(settings):
    settings.NRLLM_METRICS_TOKEN = "t"

    def scrape():
        return Client().get("/metrics", HTTP_AUTHORIZATION="Bearer t").content.decode()

    def value(text, line_start):
        matches = [line for line in text.splitlines() if line.startswith(line_start)]
        return float(matches[0].rsplit(" ", 1)[1]) if matches else 0.0

    before = scrape()
    run(scripted(call("search_notes", query="x"), answer(), tools=["search_notes"]))
    after = scrape()
    tool_steps = 'nrllm_steps_total{effect="read_only",kind="tool"}'
    assert value(after, tool_steps) == value(before, tool_steps) + 1
    assert 'nrllm_runs{reason="completed",status="completed"} 1.0' in after
    assert "nrllm_dead_letters_open 0.0" in after
    assert "nrllm_writes_in_doubt 0.0" in after
    assert 'nrllm_provider_call_seconds_count{kind="scripted"}' in after
    assert "nrllm_step_record_seconds_bucket" in after


@pytest.mark.django_db(transaction=True)
def test_metrics_count_resumed_attempts_and_the_steps_they_replayed(settings):
    from runs.runtime import enqueue

    settings.NRLLM_METRICS_TOKEN = "t"

    def scrape():
        text = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer t").content.decode()
        lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line[:1] != "#")
        return {name: float(value) for name, value in lines.items()}

    before = scrape()
    enqueue(
        scripted(
            call("search_notes", query="x"),
            {"error": "server_error", "attempts": 1},
            answer(),
            tools=["search_notes"],
        )
    )
    retried_when_due()
    after = scrape()

    def grown(name):
        return after.get(name, 0) - before.get(name, 0)

    assert grown("nrllm_resumes_total") == 1
    assert grown('nrllm_replayed_steps_total{kind="llm"}') == 1
    assert grown('nrllm_replayed_steps_total{kind="tool"}') == 1


def test_state_changes_log_json_lines_with_run_lease_and_step_sequence(caplog):
    with caplog.at_level(logging.INFO, logger="runs.transitions"):
        agent_run = run(
            scripted(call("search_notes", query="q"), answer("x"), tools=["search_notes"])
        )
    lines = [json.loads(JsonFormatter().format(record)) for record in caplog.records]
    assert {line["run_id"] for line in lines} == {str(agent_run.pk)}
    recorded = [
        (line["sequence"], line["kind"]) for line in lines if line.get("action") == "record_step"
    ]
    assert recorded == [(1, "request"), (2, "llm"), (3, "tool")]
    settle = next(line for line in lines if line.get("action") == "settle")
    assert (settle["lease_token"], settle["sequence"], settle["status"], settle["reason"]) == (
        1,
        4,  # the final answer, recorded with the settle
        "completed",
        "completed",
    )
    assert agent_run.steps.count() == 4
