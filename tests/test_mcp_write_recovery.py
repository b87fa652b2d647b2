"""Writes through MCP tools under crashes and retries, with real rqworker
processes and the real tracker server over stdio and streamable HTTP, each
with the scripted and the drifting model.

- The server killed during a ``non_idempotent_write``: the call may have
  landed, so the run is dead-lettered ``write_interrupted`` with the call
  standing for an operator (G13); nothing repeats it, and an operator's
  requeue is refused until it is reconciled (G10).
- A retry after the writes were recorded (a failed model turn, a worker
  SIGKILLed): the run resumes from its journal (G12), and each write
  reaches the server once, with the idempotency key of its recorded step.
"""

import pytest

from runs.models import DeadLetter
from runs.models.vocabulary import RunStatus, StepKind, TerminationReason
from runs.operators import actions as operator_actions
from runs.operators.requeue_safety import requeue_safety
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from tests.drifting_model import MODELS
from tests.fake_openai import error
from tests.helpers import fresh, later, run_progress, wait_until
from tests.mcp_runs import (
    ANSWER,
    CREATE,
    HELD_CREATE,
    LABEL,
    SEARCH,
    server_fixture,  # noqa: F401 (the server fixture)
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_the_server_killed_during_a_write_dead_letters_the_run_and_the_write_never_repeats(
    model, server, workers, queue, operator
):
    tracker = server.tracker
    agent_run = enqueue(server.request(model, [HELD_CREATE], ANSWER))
    # One forking worker throughout: each job it takes runs in a work horse
    # of its own, a process with no MCP session yet (a stdio server of its own).
    worker = workers.start(NRLLM_WORKER_CLASS="runs.worker.Worker", **tracker.env)
    # The worker, its work horse and the horse's stdio server start first:
    # on a loaded host, seconds each.
    held = tracker.held(progress=lambda: run_progress(agent_run, worker))
    server.kill(held)
    wait_until(lambda: fresh(agent_run).is_terminal, timeout=60, what="the attempt to end")

    stopped = fresh(agent_run)
    assert (stopped.status, stopped.termination_reason, stopped.error_type) == (
        RunStatus.FAILED,
        TerminationReason.WRITE_INTERRUPTED,
        "WriteOutcomeUnknown",
    )
    assert "gave no answer to a call it may have received" in stopped.error_message
    # The call stands for an operator to reconcile; the model was told nothing.
    assert stopped.pending_effect == "non_idempotent_write"
    assert stopped.pending_call["idempotency_key"] == held["idempotency_key"]
    assert not stopped.steps.filter(kind=StepKind.TOOL).exists()
    assert DeadLetter.objects.get(run=stopped).reason == "write_interrupted"
    assert requeue_safety(stopped).code == "write_in_doubt"
    assert operator_actions.requeue(stopped, operator, "try again").code == "write_in_doubt"

    # The server is back and answers at once. Nothing retries the call:
    # not the reaper, not a stray wake-up in a new work horse.
    if not server.over_stdio:
        tracker.start_http()
    tracker.release()
    reap_stale_runs(as_of=later())
    stray = queue.enqueue("runs.jobs.execute_run_job", str(agent_run.pk))
    wait_until(
        lambda: stray.is_finished,
        timeout=30,
        what="the stray wake-up",
        progress=lambda: run_progress(agent_run, worker),
    )
    assert len(tracker.calls("create_issue")) == 1
    assert (fresh(agent_run).status, fresh(agent_run).lease_token) == (RunStatus.FAILED, 1)

    # Reconciled (it did not land) and requeued, the same call runs again,
    # with the same key: the turn that asked for it is replayed.
    assert operator_actions.reconcile(fresh(agent_run), operator, "not_applied", "not filed").ok
    assert operator_actions.requeue(fresh(agent_run), operator, "file it").ok
    wait_until(
        lambda: fresh(agent_run).is_terminal,
        timeout=30,
        what="the requeued attempt",
        progress=lambda: run_progress(agent_run, worker),
    )
    done = fresh(agent_run)
    assert done.status == RunStatus.COMPLETED, done.error_message
    first, again = tracker.calls("create_issue")
    assert again["idempotency_key"] == first["idempotency_key"]
    assert again["arguments"] == first["arguments"]
    if model is not None:
        assert model.requests_by_turn[0] == 1


# --- G12: a retry resumes, and each write reaches the server once -------------


def written_once_as_recorded(server, agent_run) -> None:
    """Every MCP call of the run reached the server once, with the
    arguments and the idempotency key of its recorded step."""
    recorded = agent_run.steps.filter(kind=StepKind.TOOL).order_by("sequence")
    arrived = server.tracker.calls()
    assert [call["tool"] for call in arrived] == ["search_issues", "create_issue", "label_issue"]
    assert [server.tool(call["tool"]) for call in arrived] == [s.tool_name for s in recorded]
    for call, step in zip(arrived, recorded, strict=True):
        assert (call["idempotency_key"], call["arguments"]) == (
            step.idempotency_key,
            step.arguments,
        )


def completed_on_its_second_attempt(agent_run, server, model) -> None:
    """The run completed after one requeue, each call at the server once as
    recorded, and (drifting) only turn 2, the one cut short, asked twice."""
    done = fresh(agent_run)
    assert done.status == RunStatus.COMPLETED, done.error_message
    assert (done.requeue_count, done.lease_token) == (1, 2)
    written_once_as_recorded(server, done)
    if model is not None:
        assert model.requests_by_turn == {0: 1, 1: 1, 2: 2, 3: 1}


@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_model_turn_failing_after_a_write_is_retried_and_each_write_reaches_the_server_once(
    model, server, workers
):
    # Turn 2 fails once with a retryable error, after the search and the
    # new issue were recorded; the retry resumes and labels the issue.
    if model is not None:
        model.fail_turn(2, error(503, "overloaded"))
    failure = {"error": "server_error", "attempts": 1}
    agent_run = enqueue(
        server.request(model, [SEARCH], [CREATE], [LABEL], ANSWER, scripted_before={2: failure})
    )
    # Retried at once (no backoff): what the retry does is the subject here;
    # test_crash_recovery.py's scheduler test waits a backoff out.
    workers.start(NRLLM_RETRY_BACKOFF_SECONDS=0, **server.tracker.env)
    wait_until(lambda: fresh(agent_run).is_terminal, timeout=60, what="the retry")

    completed_on_its_second_attempt(agent_run, server, model)


@pytest.mark.parametrize("model", MODELS, indirect=True)
# Over stdio, where the server dies with the worker (its child). Over HTTP
# the retry above already carries each key to the remote server.
@pytest.mark.parametrize("server", ["stdio"], indirect=True)
def test_a_worker_killed_after_a_write_was_recorded_resumes_and_each_write_reaches_the_server_once(
    model, server, workers
):
    # The model is thinking about turn 2 when the worker (and the stdio
    # server, its child) is SIGKILLed; the new issue is recorded.
    if model is not None:
        model.hold_turn(2)
    thinking = {"error": "server_error", "attempts": 1, "delay_seconds": 60}
    agent_run = enqueue(
        server.request(model, [SEARCH], [CREATE], [LABEL], ANSWER, scripted_before={2: thinking})
    )
    worker = workers.start(**server.tracker.env)
    # Through the worker's start, its stdio server's and two turns' calls.
    if model is not None:
        wait_until(
            model.held.is_set,
            timeout=30,
            what="turn 2 to be asked for",
            progress=lambda: run_progress(agent_run, worker),
        )
    else:
        wait_until(
            lambda: fresh(agent_run).steps.filter(tool_name=server.tool("create_issue")).exists(),
            timeout=30,
            what="the new issue's step",
            progress=lambda: run_progress(agent_run, worker),
        )
    workers.kill(worker)
    if model is not None:
        model.release.set()
    assert len(server.tracker.calls("create_issue")) == 1

    report = reap_stale_runs(as_of=later())
    assert report.decisions[str(agent_run.pk)].startswith("requeued"), report.decisions
    workers.run_burst(**server.tracker.env)

    completed_on_its_second_attempt(agent_run, server, model)
