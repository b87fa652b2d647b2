"""G12: a re-executed run resumes from its journal. Each recovery path is
tried with the ``scripted`` provider and with a model that words every
answer differently (``tests.drifting_model``), through real rqworkers where
a worker is involved: a write executes once, and recorded turns are never
asked for again."""

import pytest

from runs.models.faults import step_inserts_refused
from runs.operators import actions as operator_actions
from runs.operators.requeue_safety import requeue_safety, restart_safety
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from tests.drifting_model import MODELS, NOTIFY, openai_request, request_for
from tests.fake_openai import error
from tests.helpers import fresh, later, retried_when_due, wait_until
from tools.models import Note, OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)

SHORT_LEASE = {"NRLLM_LEASE_SECONDS": 2}


def notify_and_post(http_server):
    """A turn that sends a notification and posts a webhook, then an answer."""
    post = {
        "name": "post_webhook",
        "arguments": {"url": http_server.url("/release"), "payload": {"text": "v2 (take {take})"}},
    }
    return [{"calls": [NOTIFY, post]}, {"answer": "Done (take {take})."}]


@pytest.mark.worker
@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_write_recorded_before_a_server_error_is_not_repeated_by_the_retry(
    model, workers, http_server
):
    tools = ["send_notification", "post_webhook"]
    plan = notify_and_post(http_server)
    if model is None:
        request = request_for("scripted", plan, tools, scripted_before={1: _server_error()})
    else:
        model.fail_turn(1, error(500))
        request = request_for("drifting", plan, tools)
    agent_run = enqueue(request)
    # Retried at once (no backoff): what the retry does is the subject here;
    # test_crash_recovery.py's scheduler test waits a backoff out.
    workers.start(NRLLM_RETRY_BACKOFF_SECONDS=0)
    wait_until(lambda: fresh(agent_run).status == "completed", timeout=40, what="the retry")

    agent_run.refresh_from_db()
    assert (agent_run.requeue_count, agent_run.lease_token) == (1, 2)
    assert OutboxNotification.objects.count() == 1
    assert len(http_server.posts()) == 1
    if model is not None:
        # Turn 0 (the writes) was replayed on the retry, never asked for again.
        assert model.requests_by_turn == {0: 1, 1: 2}
        assert agent_run.output.startswith("Done (take ")


def _server_error():
    return {"error": "server_error", "attempts": 1}


@pytest.mark.worker
@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_worker_killed_in_the_model_call_after_a_recorded_write_resumes_without_it(
    model, workers, http_server
):
    tools = ["send_notification", "post_webhook"]
    plan = notify_and_post(http_server)
    if model is None:
        agent_run = enqueue(request_for("scripted", plan, tools, scripted_delays={1: 3}))
    else:
        model.hold_turn(1)
        agent_run = enqueue(request_for("drifting", plan, tools))
    worker = workers.start(**SHORT_LEASE)
    if model is None:
        wait_until(
            lambda: fresh(agent_run).steps.filter(kind="tool").count() == 2,
            what="both writes recorded",
        )
    else:
        assert model.held.wait(timeout=30), "the second model call never came"
    workers.kill(worker)
    assert fresh(agent_run).pending_effect == ""  # the writes' fences were cleared

    report = reap_stale_runs(as_of=later())
    assert report.decisions[str(agent_run.pk)].startswith("requeued")
    if model is not None:
        model.release.set()
    workers.run_burst()

    agent_run.refresh_from_db()
    assert agent_run.status == "completed"
    assert OutboxNotification.objects.count() == 1
    assert len(http_server.posts()) == 1
    resume = agent_run.steps.get(kind="resume").result
    assert (resume["model_turns"], resume["tool_results"], resume["writes"]) == (1, 2, 2)
    if model is not None:
        assert model.requests_by_turn == {0: 1, 1: 2}


def test_a_rate_limit_after_a_recorded_idempotent_write_asks_only_for_the_next_turn(
    drifting_model, fake_openai
):
    upsert = {"name": "upsert_note", "arguments": {"slug": "release", "body": "v2 (take {take})"}}
    drifting_model.fail_turn(1, error(429, headers={"retry-after": "0"}))
    agent_run = enqueue(
        openai_request("ship it", [{"calls": [upsert]}, {"answer": "ok"}], ["upsert_note"])
    )
    retried_when_due()
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.requeue_count) == ("completed", 1)
    assert drifting_model.requests_by_turn == {0: 1, 1: 2}
    assert Note.objects.get(slug="release").body == "v2 (take 1)"
    assert agent_run.steps.filter(kind="tool").count() == 1
    # The resumed request carried the recorded turn as it was: its arguments
    # and the protocol's id for the call.
    resumed = fake_openai.requests[-1]["body"]["messages"]
    assert resumed[1]["tool_calls"][0]["id"] == "call_1_0"
    assert resumed[2] == {
        "role": "tool",
        "tool_call_id": "call_1_0",
        "content": '{"created": true, "slug": "release"}',
    }
    # Replay spent no tokens on turn 0 again: 11 prompt + 7 completion saved.
    assert agent_run.tokens_saved_by_replay == 18
    assert agent_run.prompt_tokens == 22  # turn 0 and the answer, never turn 0 twice


@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_write_does_not_start_while_an_earlier_read_step_is_unwritten(model, settings):
    settings.NRLLM_MAX_REQUEUES = 0
    Note.objects.create(slug="plan", body="ship v2")
    read = {"name": "read_note", "arguments": {"slug": "plan"}}
    plan = [{"calls": [read]}, {"calls": [NOTIFY]}, {"answer": "sent"}]
    tools = ["read_note", "send_notification"]
    with step_inserts_refused("read_note"):
        agent_run = enqueue(request_for("scripted" if model is None else "drifting", plan, tools))
    agent_run.refresh_from_db()
    # The read ran, but its step was refused and so was the turn after it
    # (written together, in order): the notification never started.
    assert (agent_run.status, agent_run.error_type) == ("failed", "StepsNotDurable")
    assert agent_run.termination_reason == "retries_exhausted"
    assert OutboxNotification.objects.count() == 0
    assert list(agent_run.steps.values_list("kind", flat=True)) == ["request", "llm"]

    # The database takes steps again: the requeued run resumes after the read's turn.
    operator = _operator()
    assert operator_actions.requeue(fresh(agent_run), operator, "db fixed").ok
    agent_run.refresh_from_db()
    assert agent_run.status == "completed"
    assert OutboxNotification.objects.count() == 1
    read_step = agent_run.steps.get(kind="tool", tool_name="read_note")
    write_step = agent_run.steps.get(kind="tool", tool_name="send_notification")
    assert read_step.lease_token == write_step.lease_token == 2
    assert read_step.sequence < write_step.sequence
    if model is not None:
        # Turn 0 was recorded and replayed; turn 1 was never recorded, so asked twice.
        assert model.requests_by_turn == {0: 1, 1: 2, 2: 1}


def _operator():
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user("resumer", is_staff=True)


@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_an_operator_requeue_resumes_after_a_recorded_non_idempotent_write(model):
    plan = [{"calls": [NOTIFY]}, {"answer": "sent"}]
    if model is None:
        request = request_for(
            "scripted", plan, ["send_notification"], scripted_before={1: _auth_error()}
        )
    else:
        model.fail_turn(1, error(401))
        request = request_for("drifting", plan, ["send_notification"])
    agent_run = enqueue(request)
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.termination_reason) == ("failed", "not_retryable")

    verdict = requeue_safety(agent_run)
    assert verdict.allowed, verdict.reason
    assert verdict.reason.startswith("resumes after step 3; replays 1 writes without repeating")
    refused = restart_safety(agent_run)
    assert (refused.allowed, refused.code) == (False, "non_idempotent_executed")
    assert "step 3 executed the non_idempotent_write 'send_notification'" in refused.reason

    operator = _operator()
    assert operator_actions.restart(agent_run, operator, "x").code == "non_idempotent_executed"
    result = operator_actions.requeue(agent_run, operator, "key rotated")
    assert result.ok and "resumes after step 3" in result.detail
    agent_run.refresh_from_db()
    assert agent_run.status == "completed"
    assert OutboxNotification.objects.count() == 1
    if model is not None:
        assert model.requests_by_turn == {0: 1, 1: 2}


def _auth_error():
    return {"error": "auth", "attempts": 1}


def test_a_restart_replays_nothing_and_asks_the_model_from_the_first_turn(drifting_model):
    search = {"name": "search_notes", "arguments": {"query": "v2 (take {take})"}}
    drifting_model.fail_turn(1, error(401))
    agent_run = enqueue(
        openai_request("look", [{"calls": [search]}, {"answer": "found"}], ["search_notes"])
    )
    agent_run.refresh_from_db()
    assert agent_run.status == "failed"
    result = operator_actions.restart(agent_run, _operator(), "start over")
    assert result.ok, result.detail
    agent_run.refresh_from_db()
    assert agent_run.status == "completed"
    assert drifting_model.requests_by_turn == {0: 2, 1: 2}
    assert not agent_run.steps.filter(kind="resume").exists()
    restart = agent_run.steps.get(kind="operator")
    assert agent_run.journal_begins_after == restart.sequence
    queries = [step.arguments for step in agent_run.steps.filter(kind="tool")]
    assert len(queries) == 2 and queries[0] != queries[1]  # the model worded it anew


@pytest.mark.worker
def test_a_redispatched_run_whose_job_redis_lost_resumes_without_repeating_its_write(
    drifting_model, workers, queue, settings
):
    """The retry's job is lost (Redis restarted without persistence): the
    reaper dispatches the queued run again, and that attempt resumes too."""
    settings.NRLLM_REDISPATCH_AFTER_SECONDS = 60
    drifting_model.fail_turn(1, error(500))
    plan = [{"calls": [NOTIFY]}, {"answer": "sent (take {take})"}]
    agent_run = enqueue(openai_request("ship it", plan, ["send_notification"]))
    workers.run_burst()  # attempt 1: the write, then a 500; the retry waits in Redis
    assert fresh(agent_run).status == "queued"
    queue.connection.flushdb()

    report = reap_stale_runs(as_of=later(3600))
    assert report.decisions[str(agent_run.pk)].startswith("redispatched")
    workers.run_burst()
    agent_run.refresh_from_db()
    assert agent_run.status == "completed"
    assert OutboxNotification.objects.count() == 1
    assert drifting_model.requests_by_turn == {0: 1, 1: 2}
    assert agent_run.steps.filter(kind="resume").count() == 1
