"""G2, G6 and G12 when the database connection breaks around a record: a
statement that committed but whose reply never came (a network blip, a
failover, a proxy restart), one that never reached the server, and the
database away for a while after. The worker cannot know what landed; it
asks the database before it writes anything again, so no step is ever
recorded twice, the journal stays a prefix of what the attempt did, a write
never starts without its fence, and a write that never started is never
left in doubt.

The faults are real, at the wire: ``tests.db_proxy`` between this process
(or a real rqworker) and PostgreSQL.
"""

import threading

import pytest
from django.db import connection

from runs import transitions
from runs.models import AgentRun, RunStep
from runs.operators import actions as operator_actions
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue, run_queued
from tests.db_proxy import FaultProxy, Rule, proxied_connection
from tests.drifting_model import openai_request, scripted_request
from tests.fake_openai import error
from tests.helpers import answer, call, cancelled_once, fresh, run_when_due, scripted, wait_until
from tests.test_crash_recovery import later
from tools.models import Note, OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def proxy(queue):
    """This process's database connection goes through the proxy (and a
    retry's job waits in Redis, for the test to run)."""
    with proxied_connection() as fault:
        yield fault


def journal_of(agent_run):
    return list(
        RunStep.objects.filter(run=agent_run)
        .order_by("sequence")
        .values_list("kind", "tool_name", "lease_token")
    )


# --- a record that committed unheard ------------------------------------------


@pytest.mark.parametrize("model", ["scripted", "drifting"])
def test_a_read_step_whose_commit_reply_was_lost_is_not_written_twice(proxy, model, request):
    """A read's record commits unheard; the write that follows and its turn
    are recorded; the next model call fails (retryable). The retry resumes
    and finishes, and the journal holds each step once — also when the model
    words the retried turn anew."""
    Note.objects.create(slug="release", body="v2 is ready ZZMARK")
    plan = [
        {"calls": [{"name": "search_notes", "arguments": {"query": "release"}}]},
        {
            "calls": [
                {
                    "name": "send_notification",
                    "arguments": {"recipient": "ops", "message": "v2 {take}"},
                }
            ]
        },
        {"answer": "done"},
    ]
    tools = ["search_notes", "send_notification"]
    if model == "drifting":
        drifting = request.getfixturevalue("drifting_model")
        drifting.fail_turn(2, error(500))
        agent_run = enqueue(openai_request("ship", plan, tools))
    else:
        server_error = {"error": "server_error", "attempts": 1}
        agent_run = enqueue(scripted_request("ship", plan, tools, before={2: server_error}))
    rule = proxy.add(Rule(b"ZZMARK", "drop_reply"))
    run_queued(agent_run.pk)  # attempt 1
    assert rule.fired.is_set(), "the proxy never dropped a reply"
    assert fresh(agent_run).status == "queued"  # requeued for the retry
    assert [kind for kind, _, _ in journal_of(agent_run)] == [
        "request",
        "llm",
        "tool",
        "llm",
        "tool",
    ]
    run_when_due(agent_run.pk)  # attempt 2: the retry
    agent_run = fresh(agent_run)
    assert agent_run.status == "completed", agent_run.error_message
    assert OutboxNotification.objects.count() == 1
    assert agent_run.steps.filter(tool_name="search_notes").count() == 1
    if model == "drifting":
        assert drifting.requests_by_turn == {0: 1, 1: 1, 2: 2}


def test_a_read_whose_reply_was_lost_is_never_replayed_as_another_calls_outcome(proxy):
    """One turn calls search_notes twice. The first record commits unheard,
    the second never reaches the server, then the model call fails. The
    retry replays the first search and runs the second live: each call's
    outcome is its own."""
    Note.objects.create(slug="release", body="v2 is ready ZZMARK")
    Note.objects.create(slug="other", body="unrelated")
    agent_run = enqueue(
        scripted(
            {
                "tool_calls": [
                    {"name": "search_notes", "arguments": {"query": "release"}},
                    {"name": "search_notes", "arguments": {"query": "other ZZOTHER"}},
                ]
            },
            {"error": "server_error", "attempts": 1},
            answer("done"),
            tools=["search_notes"],
        )
    )
    proxy.add(Rule(b"ZZMARK", "drop_reply"))
    second = proxy.add(Rule(b'"matches": []', "kill_before"))
    run_queued(agent_run.pk)  # attempt 1
    assert second.fired.is_set()
    assert fresh(agent_run).status == "queued"
    run_when_due(agent_run.pk)  # attempt 2
    agent_run = fresh(agent_run)
    assert agent_run.status == "completed", agent_run.error_message
    searches = list(
        agent_run.steps.filter(kind="tool").order_by("sequence").values_list("arguments", flat=True)
    )
    assert searches == [{"query": "release"}, {"query": "other ZZOTHER"}]


def test_a_resume_step_whose_commit_reply_was_lost_is_recorded_and_counted_once(
    proxy, drifting_model
):
    search = {"name": "search_notes", "arguments": {"query": "v2 (take {take})"}}
    drifting_model.fail_turn(1, error(500))
    agent_run = enqueue(
        openai_request("look", [{"calls": [search]}, {"answer": "found"}], ["search_notes"])
    )
    run_queued(agent_run.pk)  # attempt 1: turn 0 and its search recorded, turn 1 fails
    assert fresh(agent_run).status == "queued"
    rule = proxy.add(Rule(b"resumed after step", "drop_reply"))
    run_when_due(agent_run.pk)  # attempt 2: resumes
    assert rule.fired.is_set()
    agent_run = fresh(agent_run)
    assert agent_run.status == "completed"
    assert agent_run.steps.filter(kind="resume").count() == 1
    assert agent_run.tokens_saved_by_replay == 18  # turn 0: 11 prompt + 7 completion


def test_a_write_whose_record_committed_unheard_goes_on_instead_of_failing_its_audit(proxy):
    """Asked, the database says the write's step is there: its audit did not
    fail (G2), and the run goes on; the notification was sent once."""
    agent_run = enqueue(
        scripted(
            call("send_notification", recipient="ops", message="v2 shipped"),
            answer("sent"),
            tools=["send_notification"],
        )
    )
    rule = proxy.add(Rule(b"notification_id", "drop_reply"))
    run_queued(agent_run.pk)
    assert rule.fired.is_set()
    agent_run = fresh(agent_run)
    assert (agent_run.status, agent_run.output) == ("completed", "sent")
    assert OutboxNotification.objects.count() == 1
    assert agent_run.steps.filter(kind="tool").count() == 1
    assert agent_run.pending_effect == ""


def test_the_flush_before_a_write_whose_reply_was_lost_lets_the_write_run_once(proxy):
    """A read step's record never reaches the server; the flush before the
    write (that read step and the write's fence) commits unheard: the
    attempt finds it, runs the write once, with its fence, and records
    every step once."""
    Note.objects.create(slug="release", body="v2 ZZR")
    agent_run = enqueue(
        scripted(
            {
                "tool_calls": [
                    {"name": "search_notes", "arguments": {"query": "release"}},
                    {"name": "send_notification", "arguments": {"recipient": "o", "message": "m"}},
                ]
            },
            answer("done"),
            tools=["search_notes", "send_notification"],
        )
    )
    first = proxy.add(Rule(b"ZZR", "kill_before"))
    second = proxy.add(Rule(b"ZZR", "drop_reply"))
    run_queued(agent_run.pk)
    assert first.fired.is_set() and second.fired.is_set()
    agent_run = fresh(agent_run)
    assert agent_run.status == "completed"
    assert OutboxNotification.objects.count() == 1
    assert [(kind, tool) for kind, tool, _ in journal_of(agent_run)] == [
        ("request", ""),
        ("llm", ""),
        ("tool", "search_notes"),
        ("tool", "send_notification"),
        ("llm", ""),
    ]


def test_a_final_answer_whose_reply_was_lost_is_recorded_once(proxy):
    agent_run = enqueue(scripted(answer("ZZF done"), tools=[]))
    rule = proxy.add(Rule(b"ZZF", "drop_reply"))
    run_queued(agent_run.pk)
    assert rule.fired.is_set()
    agent_run = fresh(agent_run)
    assert (agent_run.status, agent_run.output) == ("completed", "ZZF done")
    assert agent_run.steps.filter(kind="llm").count() == 1


# --- the database away after a record in doubt -----------------------------------


def test_a_step_recorded_while_an_earlier_one_is_in_doubt_is_not_a_lost_lease(proxy):
    """A read's record commits unheard; the database is then away for the
    count, the heartbeat, the next turn's record and its heartbeat. The
    attempt still holds its lease: it finds the read step there, writes the
    turn after it and goes on."""
    Note.objects.create(slug="release", body="v2 is ready ZZMARK")
    agent_run = enqueue(
        scripted(
            call("search_notes", query="release"),
            call("search_notes", query="again"),
            answer("done"),
            tools=["search_notes"],
        )
    )
    rule = proxy.add(Rule(b"ZZMARK", "drop_reply", then_refuse=4))
    run_queued(agent_run.pk)
    assert rule.fired.is_set() and proxy.refused == 4
    agent_run = fresh(agent_run)
    assert (agent_run.status, agent_run.termination_reason) == ("completed", "completed")
    assert [(kind, tool) for kind, tool, _ in journal_of(agent_run)] == [
        ("request", ""),
        ("llm", ""),
        ("tool", "search_notes"),
        ("llm", ""),
        ("tool", "search_notes"),
        ("llm", ""),
    ]


def test_a_write_that_never_started_is_never_left_a_write_in_doubt(proxy):
    """The turn that asks for a non-idempotent write is recorded (stamping
    the write's fence) unheard, and the database is away for a while. The
    write either runs once, fenced, or does not start — and then its fence
    is withdrawn and the run is retried, not dead-lettered for an operator
    to reconcile a write that never ran."""
    agent_run = enqueue(
        scripted(
            call("send_notification", recipient="ops", message="v2 ZZW2"),
            answer("done"),
            tools=["send_notification"],
        )
    )
    rule = proxy.add(Rule(b"ZZW2", "drop_reply", then_refuse=4))
    run_queued(agent_run.pk)
    assert rule.fired.is_set()
    agent_run = fresh(agent_run)
    sent = OutboxNotification.objects.count()
    if sent:
        assert (sent, agent_run.status) == (1, "completed")
    else:
        assert (agent_run.status, agent_run.error_type) == ("queued", "StepsNotDurable")
        assert agent_run.pending_effect == ""
        run_when_due(agent_run.pk)  # the retry
        assert fresh(agent_run).status == "completed"
        assert OutboxNotification.objects.count() == 1


def test_the_final_answer_is_not_recorded_after_a_hole(proxy):
    """A turn's record never reaches the server and the database stays away
    through its (refused) call and the final answer: nothing is written
    after the hole, though the run completes."""
    agent_run = enqueue(
        scripted(
            {"tool_calls": [{"name": "no_such_tool", "arguments": {"q": "ZZK"}}]},
            answer("done"),
            tools=["search_notes"],
        )
    )
    rule = proxy.add(Rule(b"ZZK", "kill_before", then_refuse=5))
    run_queued(agent_run.pk)
    assert rule.fired.is_set()
    agent_run = fresh(agent_run)
    kinds = [(kind, tool) for kind, tool, _ in journal_of(agent_run)]
    assert kinds in (
        [("request", "")],
        [("request", ""), ("llm", ""), ("tool", "no_such_tool"), ("llm", "")],
    ), kinds


def test_a_cancel_after_an_unheard_fence_stamp_leaves_no_write_in_doubt(proxy):
    """The turn asking for a non-idempotent write stamps its fence unheard,
    and an operator's cancel lands before the worker asks the database: the
    write does not start, its fence is withdrawn, the run ends cancelled."""
    agent_run = enqueue(
        scripted(
            call("send_notification", recipient="ops", message="v2 ZZC"),
            answer("done"),
            tools=["send_notification"],
        )
    )

    def cancel_now():
        def cancel():
            transitions.cancel(agent_run.pk)
            connection.close()

        canceller = threading.Thread(target=cancel)
        canceller.start()
        canceller.join()

    rule = proxy.add(Rule(b"ZZC", "drop_reply", on_fire=cancel_now))
    run_queued(agent_run.pk)
    assert rule.fired.is_set()
    agent_run = fresh(agent_run)
    assert OutboxNotification.objects.count() == 0
    assert (agent_run.status, agent_run.pending_effect) == ("cancelled", "")


@pytest.mark.worker
def test_a_non_idempotent_write_is_never_sent_unfenced_nor_twice_after_a_broken_renewal(
    workers, http_server, operator
):
    """A resumed attempt's resume step commits unheard, the database is away
    for the count and the heartbeat, and the renewal that would stamp the
    write's fence never reaches the server: the write must not start
    without its fence, and a real worker killed mid-write and the reaper
    after it must not lead to a second POST."""
    url = http_server.url("/hold")
    post = {"name": "post_webhook", "arguments": {"url": url, "payload": {"v": "ZZW"}}}
    agent_run = enqueue(
        {
            "prompt": "notify",
            "tools": ["post_webhook"],
            "provider": {
                "kind": "scripted",
                "turns": [{"tool_calls": [post], "delay_seconds": 1.5}, {"content": "sent"}],
            },
        }
    )
    # Attempt 1, here: a cancel wins while the model thinks; the turn asking
    # for the write is recorded, no fence stamped. An operator requeues.
    running = AgentRun.objects.filter(pk=agent_run.pk, status="running")
    with cancelled_once(agent_run.pk, running.exists, what="running"):
        run_queued(agent_run.pk)
    assert (fresh(agent_run).status, fresh(agent_run).pending_effect) == ("cancelled", "")
    assert operator_actions.requeue(fresh(agent_run), operator, "resume").ok

    # Attempt 2: a real worker whose connections go through the proxy.
    settings_dict = connection.settings_dict
    proxy = FaultProxy((settings_dict["HOST"], int(settings_dict["PORT"])))
    proxy.add(Rule(b"resumed after step", "drop_reply", then_refuse=2))
    renewal = proxy.add(Rule(b"ZZW", "kill_before"))
    port = f":{settings_dict['PORT']}/"
    workers.env = {
        **workers.env,
        "DATABASE_URL": workers.env["DATABASE_URL"].replace(port, f":{proxy.port}/"),
    }
    worker = workers.start()
    try:
        wait_until(renewal.fired.is_set, what="the renewal cut off")
        if http_server.held.wait(timeout=5):
            # It started after all: then only with its fence standing.
            assert fresh(agent_run).pending_effect == "non_idempotent_write"
        workers.kill(worker)
    finally:
        http_server.release.set()
        proxy.close()

    decision = reap_stale_runs(as_of=later()).decisions.get(str(agent_run.pk), "")
    if decision.startswith("requeued"):
        run_queued(agent_run.pk)  # attempt 3: the automatic path resumes
    posts = [r for r in http_server.posts() if r.path == "/hold"]
    assert len(posts) <= 1, (decision, fresh(agent_run).status)
    if fresh(agent_run).status == "completed":
        assert len(posts) == 1
