"""MCP servers that are down or go away, and the sessions a worker keeps,
with real rqworker processes and the real tracker server, each recovery
tried with the scripted and the drifting model.

- Down at start-up: a run offering its tools is refused at enqueue, naming
  tool and server, and nothing is stored; a queued run whose server is down
  when a worker claims it fails its attempt ``connection`` and is retried
  with backoff (G8), and completes once the server is back; a worker
  process that keeps its listings asks the server again at the retry.
- Gone between two calls: a stdio server is started again for the next call
  (a new process), and the run goes on; an HTTP server that is down makes
  the next call a tool error the model is told ("nothing was sent"), and
  the run goes on — what this runtime chose for a server gone mid-run.
- Sessions are kept per process: a ``SimpleWorker`` talks to one stdio
  server for all its runs, the forking worker to one per run attempt,
  never one per call.
"""

import json
import os
import signal
from datetime import timedelta

import psutil
import pytest

from runs.approvals import actions as approval_actions
from runs.models import AgentRun, ApprovalRequest, DeadLetter
from runs.models.selectors import writes_in_doubt
from runs.models.vocabulary import RunStatus, StepKind
from runs.queue.dispatch import executing_in_embedded_worker
from runs.runtime import enqueue
from runs.workers.embedded import execute_due_runs
from tests.drifting_model import MODELS
from tests.helpers import fresh, step_inserts_held, wait_until
from tests.mcp_runs import (
    ANSWER,
    CREATE,
    LABEL,
    SEARCH,
    Server,
    server_fixture,  # noqa: F401 (the server fixture)
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def over_http(http_tracker) -> Server:
    return Server(http_tracker, "webtracker")


def recorded(agent_run, tool: str):
    return agent_run.steps.get(kind=StepKind.TOOL, tool_name=tool)


# --- the server down at start-up ----------------------------------------------


@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_run_offering_tools_of_a_server_that_is_down_is_refused_and_nothing_is_stored(
    model, over_http, api
):
    over_http.tracker.stop_http()
    response = api.post(
        "/api/runs/", over_http.request(model, [SEARCH], [CREATE], ANSWER), format="json"
    )
    assert response.status_code == 400, response.content
    detail = response.json()["detail"]
    assert "tools: unavailable now" in detail
    for tool in ("webtracker__create_issue", "webtracker__search_issues"):
        assert f"{tool}: MCP server 'webtracker' cannot be reached" in detail
    assert "Traceback" not in json.dumps(response.json())
    assert not AgentRun.objects.exists()


@pytest.mark.worker
@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_queued_run_whose_server_is_down_when_claimed_is_retried_with_backoff(
    model, over_http, workers
):
    tracker = over_http.tracker
    agent_run = enqueue(over_http.request(model, [SEARCH], [CREATE], ANSWER))
    tracker.stop_http()
    # No scheduler: the retry's job waits in RQ's schedule, the run queued.
    workers.run_burst(NRLLM_RETRY_BACKOFF_SECONDS=1, **tracker.env)

    waiting = fresh(agent_run)
    assert (waiting.status, waiting.failure_class, waiting.requeue_count) == (
        RunStatus.QUEUED,
        "connection",
        1,
    )
    assert "MCP server 'webtracker' cannot be reached" in waiting.error_message
    # Due after its backoff (1 s), counted from the failed attempt's claim.
    assert waiting.available_at - waiting.started_at >= timedelta(seconds=1)
    assert not DeadLetter.objects.exists()
    # The attempt stopped before its first model turn and its first call.
    assert tracker.calls() == []
    if model is not None:
        assert sum(model.requests_by_turn.values()) == 0

    tracker.start_http()
    workers.start(with_scheduler=True, **tracker.env)
    wait_until(lambda: fresh(agent_run).is_terminal, timeout=60, what="the retry")
    done = fresh(agent_run)
    assert done.status == RunStatus.COMPLETED, done.error_message
    assert (done.requeue_count, done.lease_token) == (1, 2)
    (searched,) = tracker.calls("search_issues")
    (created,) = tracker.calls("create_issue")
    write = recorded(done, over_http.tool("create_issue"))
    assert created["idempotency_key"] == write.idempotency_key
    if model is not None:
        assert model.requests_by_turn == {0: 1, 1: 1, 2: 1}


@pytest.mark.worker
@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_worker_process_that_found_a_server_unreachable_asks_it_again_when_it_retries(
    model, over_http, workers
):
    """A ``SimpleWorker`` (and the embedded worker) keeps its listings for
    its next runs; the retry, due sooner than a failed listing is asked
    again (``catalog.RETRY_SECONDS``), asks the server anew rather than fail
    on the listing of the attempt it retries."""
    tracker = over_http.tracker
    agent_run = enqueue(over_http.request(model, [SEARCH], [CREATE], ANSWER))
    # Hung (stopped) rather than gone: it answers again the moment it is
    # continued, well before the retry (the default backoff, 2 s).
    os.kill(tracker.process.pid, signal.SIGSTOP)
    try:
        workers.start(
            with_scheduler=True,
            NRLLM_WORKER_CLASS="runs.worker.SimpleWorker",
            NRLLM_RETRY_BACKOFF_SECONDS=2,
            NRLLM_MCP_CONNECT_TIMEOUT_SECONDS=1,
            **tracker.env,
        )
        wait_until(lambda: fresh(agent_run).requeue_count, timeout=30, what="the failed attempt")
    finally:
        os.kill(tracker.process.pid, signal.SIGCONT)
    assert fresh(agent_run).failure_class == "connection"

    wait_until(lambda: fresh(agent_run).is_terminal, timeout=60, what="the retry")
    done = fresh(agent_run)
    assert done.status == RunStatus.COMPLETED, done.error_message
    assert (done.requeue_count, done.lease_token) == (1, 2)
    assert [call["tool"] for call in tracker.calls()] == ["search_issues", "create_issue"]


@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_an_approved_write_whose_server_went_down_since_it_was_listed_waits_for_the_server(
    model, over_http, approvals, operator, settings
):
    """The embedded worker (and a ``SimpleWorker``) keeps its listings for a
    minute. An attempt asks its servers anew all the same: with the server
    down since, the approved write is retried once the server is back —
    not turned into a tool error the model is told, the approval spent on
    a call that never left."""
    settings.NRLLM_RETRY_BACKOFF_SECONDS = 0
    tracker = over_http.tracker
    agent_run = enqueue(over_http.request(model, [CREATE], ANSWER))  # listed here, now
    (approval,) = ApprovalRequest.objects.filter(run=agent_run)
    tracker.stop_http()

    with executing_in_embedded_worker():
        assert approval_actions.approve(approval, operator, digest=approval.digest).ok
        execute_due_runs(limit=1)
        waiting = fresh(agent_run)
        assert (waiting.status, waiting.failure_class, waiting.requeue_count) == (
            RunStatus.QUEUED,
            "connection",
            1,
        ), waiting.error_message
        assert not waiting.steps.filter(kind=StepKind.TOOL).exists()
        if model is not None:
            assert model.requests_by_turn == {0: 1}  # the turn after the write was not asked

        tracker.start_http()
        execute_due_runs(limit=1)

    done = fresh(agent_run)
    assert done.status == RunStatus.COMPLETED, done.error_message
    (created,) = tracker.calls("create_issue")
    assert created["idempotency_key"] == approval.idempotency_key


# --- the server going away mid-run --------------------------------------------


def server_gone_after_the_search(server: Server, workers, agent_run) -> dict:
    """A worker runs ``agent_run``; its search reaches the server, and while
    the search's step waits to be recorded, the server process dies. Returns
    the search as the server logged it."""
    search = server.tool("search_issues")
    with step_inserts_held(f"NEW.tool_name = '{search}'") as (waiting, _):
        workers.start(**server.tracker.env)
        wait_until(waiting, timeout=30, what="the search's step waiting")
        (searched,) = server.tracker.calls("search_issues")
        server.kill(searched)
        wait_until(lambda: gone(searched["pid"]), what="the server process gone")
    # Leaving the block, the step goes in and the run goes on.
    wait_until(lambda: fresh(agent_run).is_terminal, timeout=60, what="the run to end")
    return searched


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.worker
@pytest.mark.parametrize("model", MODELS, indirect=True)
@pytest.mark.parametrize("server", ["stdio"], indirect=True)
def test_a_stdio_server_that_died_between_two_calls_is_started_again_for_the_next(
    model, server, workers
):
    agent_run = enqueue(server.request(model, [SEARCH], [CREATE], ANSWER))
    searched = server_gone_after_the_search(server, workers, agent_run)

    done = fresh(agent_run)
    assert done.status == RunStatus.COMPLETED, done.error_message
    (created,) = server.tracker.calls("create_issue")
    assert created["pid"] != searched["pid"]  # a new server process
    write = recorded(done, server.tool("create_issue"))
    assert (write.error, write.idempotency_key) == ("", created["idempotency_key"])
    assert created["arguments"]["title"] in str(write.result)  # the new server's answer


@pytest.mark.worker
@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_an_http_server_gone_between_two_calls_makes_the_next_a_tool_error_and_the_run_goes_on(
    model, over_http, workers, request
):
    agent_run = enqueue(over_http.request(model, [SEARCH], [CREATE], ANSWER))
    server_gone_after_the_search(over_http, workers, agent_run)

    done = fresh(agent_run)
    assert done.status == RunStatus.COMPLETED, done.error_message
    # Nothing reached the server, so nothing is in doubt: the model is told.
    assert over_http.tracker.calls("create_issue") == []
    write = recorded(done, over_http.tool("create_issue"))
    expected = (
        "webtracker__create_issue: MCP server 'webtracker' cannot be reached, nothing was sent"
    )
    assert write.error.startswith(expected), write.error
    assert (done.pending_effect, done.pending_call) == ("", None)
    assert not writes_in_doubt(AgentRun.objects.filter(pk=done.pk)).exists()
    if model is not None:
        told = request.getfixturevalue("fake_openai").tool_results_told()
        assert any(expected in text for text in told), told


# --- sessions are kept per process --------------------------------------------


@pytest.mark.worker
@pytest.mark.parametrize(
    ("worker_class", "server_processes"),
    [
        ("runs.worker.SimpleWorker", 1),
        ("runs.worker.Worker", 2),
        ("runs.worker.ConcurrentWorker", 1),
    ],
)
def test_a_worker_process_keeps_one_stdio_server_for_its_calls(
    worker_class, server_processes, tracker, workers
):
    server = Server(tracker, "tracker")
    runs = [
        enqueue(server.request(None, [SEARCH], [CREATE, LABEL], [SEARCH], ANSWER)) for _ in range(2)
    ]
    workers.run_burst(NRLLM_WORKER_CLASS=worker_class, **tracker.env)

    pids_by_run = []
    for agent_run in runs:
        assert fresh(agent_run).status == RunStatus.COMPLETED
        steps = agent_run.steps.filter(kind=StepKind.TOOL)
        keys = set(steps.values_list("idempotency_key", flat=True))
        calls = [call for call in tracker.calls() if call["idempotency_key"] in keys]
        assert len(calls) == 4
        pids_by_run.append({call["pid"] for call in calls})
    # One server per run attempt at most, never one per call; a
    # SimpleWorker's runs share its one, and so do a ConcurrentWorker's runs
    # in flight at once (both open the session together: one is opened, G15).
    assert [len(pids) for pids in pids_by_run] == [1, 1]
    assert len(set.union(*pids_by_run)) == server_processes
