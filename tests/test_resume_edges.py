"""G12's edges: a step whose content the database would refuse, a cancel
while a resumed attempt replays a final answer, verdicts that say what a
resume can and cannot do, a write in doubt whose tool is gone, an
interactive run an operator requeues, and model text in refusals. What a
journal holds and a model sends: ``test_resume_model_output.py``."""

import logging
import threading

import pytest
from django.db import connection

from runs import transitions
from runs.models import AgentRun
from runs.models.faults import step_inserts_refused
from runs.operators import actions as operator_actions
from runs.operators.requeue_safety import requeue_safety
from runs.runtime import enqueue, run, run_queued
from runs.runtime.run_request import parse_run_request
from tests.helpers import (
    answer,
    call,
    fresh,
    run_when_due,
    scripted,
)
from tools.contract import Tool
from tools.models import Note, OutboxNotification, ToolSetting

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE = '<img src=x onerror="alert(1)">'


class TextWithNul(Tool):
    """A read that returns text with a NUL and a lone surrogate in it (as a
    fetched page may): PostgreSQL refuses both."""

    name = "text_with_nul"
    description = "returns text the database cannot store as it is"
    parameters = {"type": "object", "properties": {}, "additionalProperties": True}

    def run(self, arguments, context):
        return {"text": "before\x00after\ud800"}


def test_a_result_the_database_would_refuse_is_recorded_as_the_model_was_told(settings):
    """The NUL and the surrogate are replaced as the result arrives: the model
    gets the text the journal keeps, every step is recorded, and the write
    after it runs once."""
    settings.NRLLM_TOOLS = ["tests.test_resume_edges.TextWithNul"]
    Note.objects.create(slug="plan", body="ship v2")
    agent_run = fresh(
        enqueue(
            scripted(
                call("text_with_nul"),
                call("send_notification", recipient="ops", message="v2"),
                answer("sent"),
                tools=["text_with_nul", "send_notification"],
            )
        )
    )
    assert agent_run.status == "completed"
    kinds = list(agent_run.steps.values_list("kind", "tool_name"))
    assert kinds == [
        ("request", ""),
        ("llm", ""),
        ("tool", "text_with_nul"),
        ("llm", ""),
        ("tool", "send_notification"),
        ("llm", ""),
    ]
    read = agent_run.steps.get(tool_name="text_with_nul")
    assert read.result == {"text": "before\ufffdafter\ufffd"}
    assert OutboxNotification.objects.count() == 1


def test_a_request_the_database_could_not_store_is_refused_naming_where(api):
    response = api.post(
        "/api/runs/",
        {"prompt": "say \x00", "provider": {"kind": "scripted", "turns": [{"content": "x"}]}},
        format="json",
    )
    assert response.status_code == 400
    assert "prompt: contains a character that cannot be stored" in response.json()["detail"]
    assert AgentRun.objects.count() == 0


def test_a_cancel_during_a_resume_that_replays_the_final_answer_wins(queue, operator):
    """G9: a cancel wins over a final answer, also a replayed one. A run
    cancelled as its final answer came in is requeued; a cancel that commits
    after its resumed attempt wrote the resume step, before the replayed
    answer settles the run, still wins: the attempt learns of it only at
    that settle."""
    request = parse_run_request(scripted(answer("the answer"))).as_json()
    agent_run = transitions.create_queued_run(request, "p")
    lease = transitions.claim(agent_run.pk, "w", 60).lease
    assert transitions.cancel(agent_run.pk) is transitions.CancelOutcome.REQUESTED
    final = {"kind": "llm", "result": {"content": "the answer", "tool_calls": []}}
    assert transitions.finish(lease, [final], output="the answer") is (
        transitions.FinishOutcome.CANCELLED
    )
    verdict = requeue_safety(fresh(agent_run))
    assert "the recorded final answer completes the run, no model call" in verdict.reason
    assert operator_actions.requeue(fresh(agent_run), operator, "again").ok

    with _cancelled_after_the_resume_step(agent_run.pk) as outcome:
        run_queued(agent_run.pk)
    assert outcome["cancel"] is transitions.CancelOutcome.REQUESTED
    assert fresh(agent_run).status == "cancelled"


class _cancelled_after_the_resume_step(logging.Handler):
    """A log sink that stalls (a full stderr pipe) on the line the resume
    step's record logs — after its commit, before the next statement — while
    an operator's cancel commits on a connection of its own. Not a window
    timed by sleeps or lock waits: after a lock wait the attempt's next
    statement may take the run's row before the woken cancel does."""

    def __init__(self, run_id):
        super().__init__(logging.INFO)
        self.run_id = run_id
        self.outcome = {}
        self._logger = logging.getLogger("runs.transitions")

    def __enter__(self):
        self._level = self._logger.level
        self._logger.setLevel(logging.INFO)
        self._logger.addHandler(self)
        return self.outcome

    def __exit__(self, *exc):
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)

    def handle(self, record):
        # Without the handler's lock: the cancel logs a line of its own.
        self.emit(record)

    def emit(self, record):
        resume_step = (getattr(record, "action", ""), getattr(record, "kind", ""))
        if resume_step != ("record_step", "resume"):
            return
        canceller = threading.Thread(target=self._cancel)
        canceller.start()
        canceller.join()

    def _cancel(self):
        try:
            self.outcome["cancel"] = transitions.cancel(self.run_id)
        finally:
            connection.close()


def test_a_replayed_final_answer_completes_the_run_without_a_model_call(queue, operator):
    request = parse_run_request(scripted(answer("the answer"))).as_json()
    agent_run = transitions.create_queued_run(request, "p")
    lease = transitions.claim(agent_run.pk, "w", 60).lease
    transitions.cancel(agent_run.pk)
    final = {"kind": "llm", "result": {"content": "the answer", "tool_calls": []}}
    transitions.finish(lease, [final], output="the answer")
    assert operator_actions.requeue(fresh(agent_run), operator, "again").ok
    # The script is used up: a model call would fail the run.
    AgentRun.objects.filter(pk=agent_run.pk).update(
        request={**request, "provider": {"kind": "scripted", "turns": [{"error": "auth"}]}}
    )
    run_queued(agent_run.pk)
    agent_run = fresh(agent_run)
    assert (agent_run.status, agent_run.output) == ("completed", "the answer")
    assert agent_run.steps.filter(kind="llm").count() == 1


def test_the_requeue_verdict_refuses_a_journal_the_resumed_attempt_would_refuse():
    request = parse_run_request(scripted(answer(), tools=["search_notes"])).as_json()
    agent_run = transitions.create_queued_run(request, "p")
    lease = transitions.claim(agent_run.pk, "w", 60).lease
    two_calls = {
        "kind": "llm",
        "result": {
            "content": "",
            "tool_calls": [
                {"name": "search_notes", "arguments": {"query": "a"}},
                {"name": "search_notes", "arguments": {"query": "b"}},
            ],
        },
    }
    refused = {"kind": "tool", "tool_name": "search_notes", "error": "not offered"}
    next_turn = {"kind": "llm", "result": {"content": "", "tool_calls": []}}
    for step in (two_calls, refused, next_turn):
        assert transitions.record_step(lease, 60, step, clear_fence=False).persisted
    assert transitions.settle(lease, "failed", "not_retryable")
    verdict = requeue_safety(fresh(agent_run))
    assert (verdict.allowed, verdict.code) == (False, "journal_unreplayable")
    assert "a resumed attempt would stop at once: step 4: the model turn at step 2" in (
        verdict.reason
    )


def test_the_requeue_verdict_refuses_a_run_with_no_iteration_left(operator):
    agent_run = fresh(
        enqueue(
            scripted(
                call("search_notes", query="a"), answer(), tools=["search_notes"], max_iterations=1
            )
        )
    )
    assert agent_run.termination_reason == "max_iterations"
    verdict = requeue_safety(agent_run)
    assert (verdict.allowed, verdict.code) == (False, "max_iterations_reached")
    assert "restart it from the beginning instead" in verdict.reason
    assert operator_actions.requeue(agent_run, operator, "more").code == "max_iterations_reached"


def test_a_write_in_doubt_whose_tool_was_disabled_since_is_not_told_to_the_model_as_never_offered(
    http_server, settings
):
    """The idempotent webhook landed, its audit failed (the fence stands); an
    operator disables the tool. Resuming would go live on that call and tell
    the model the tool was never offered: the verdict refuses, and a resumed
    attempt stops rather than improvise."""
    settings.NRLLM_TOOLS = ["tests.tools_for_tests.IdempotentWebhook"]
    put = call("put_webhook", url=http_server.url("/put"), payload={"v": 2})
    with step_inserts_refused("put_webhook"):
        agent_run = fresh(enqueue(scripted(put, answer("done"), tools=["put_webhook"])))
    assert (agent_run.error_type, agent_run.pending_effect) == (
        "AuditPersistenceFailed",
        "idempotent_write",
    )
    ToolSetting.objects.update_or_create(name="put_webhook", defaults={"enabled": False})
    verdict = requeue_safety(agent_run)
    why = (
        "step 2: the model turn asked for the idempotent_write tool 'put_webhook', whose "
        "outcome is not recorded and which an operator has disabled since"
    )
    assert (verdict.allowed, verdict.code) == (False, "journal_unreplayable")
    assert why in verdict.reason

    # A requeue that asks no verdict (the transition itself): the attempt stops there.
    assert transitions.operator_requeue(
        agent_run.pk,
        seen_status="failed",
        seen_step_count=agent_run.step_count,
        step={"kind": "operator", "result": {"action": "test"}},
    )
    run_queued(agent_run.pk)
    agent_run = fresh(agent_run)
    assert (agent_run.termination_reason, agent_run.error_message) == ("journal_unreplayable", why)
    assert len([r for r in http_server.received if r.path == "/put"]) == 1


def test_an_interactive_run_requeued_by_an_operator_resumes_without_repeating_its_write(operator):
    agent_run = run(
        scripted(
            call("send_notification", recipient="ops", message="v2"),
            {"error": "server_error", "attempts": 1},
            answer("sent"),
            tools=["send_notification"],
        )
    )
    assert (agent_run.status, agent_run.mode) == ("failed", "interactive")
    assert operator_actions.requeue(agent_run, operator, "again").ok
    agent_run = fresh(agent_run)
    assert agent_run.status == "completed", agent_run.termination_reason
    assert OutboxNotification.objects.count() == 1
    assert agent_run.steps.filter(kind="resume").count() == 1


def test_the_pages_escape_model_text_in_an_unreplayable_journal(operator_client, settings, queue):
    settings.NRLLM_TOOLS = ["tests.tools_for_tests.FenceProbe"]
    agent_run = enqueue(
        scripted(
            {"tool_calls": [{"name": "fence_probe_write", "arguments": {"x": HOSTILE}}]},
            {"error": "server_error", "attempts": 1},
            answer(HOSTILE),
            tools=["fence_probe_write"],
        )
    )
    run_queued(agent_run.pk)  # attempt 1 records the write; its retry waits in Redis
    # The tool is renamed in a new release: its recorded outcome names a tool gone.
    settings.NRLLM_TOOLS = []
    AgentRun.objects.filter(pk=agent_run.pk).update(
        request={**fresh(agent_run).request, "prompt": HOSTILE}, prompt=HOSTILE
    )
    run_when_due(agent_run.pk)
    agent_run = fresh(agent_run)
    assert agent_run.termination_reason == "journal_unreplayable"
    for url in (
        f"/admin/runs/agentrun/{agent_run.pk}/change/",
        "/admin/runs/agentrun/write-audits/",
        "/admin/runs/deadletter/",
    ):
        page = operator_client.get(url).content.decode()
        assert "<img src=x" not in page, url
    page = operator_client.get(f"/admin/runs/agentrun/{agent_run.pk}/change/").content.decode()
    assert "&lt;img src=x" in page


@pytest.mark.worker
def test_a_write_that_may_have_run_and_cannot_be_offered_again_stands_as_the_write_in_question(
    workers, http_server, settings, api
):
    """An idempotent webhook is in flight when its worker is SIGKILLed; the
    reaper requeues it (the fence cleared); an operator disables the tool.
    The resumed attempt stops at that call — and the run shows it as the
    write in question, on the write audits, as an interrupted write."""
    from runs.models.selectors import write_audit_runs
    from runs.reaper import reap_stale_runs
    from tests.test_crash_recovery import kill_mid_call, later

    settings.NRLLM_TOOLS = ["tests.tools_for_tests.IdempotentWebhook"]
    put = call("put_webhook", url=http_server.url("/hold"), payload={"v": 1})
    agent_run = enqueue(scripted(put, answer("done"), tools=["put_webhook"]))
    kill_mid_call(workers, http_server)
    assert reap_stale_runs(as_of=later()).decisions[str(agent_run.pk)].startswith("requeued")
    ToolSetting.objects.update_or_create(name="put_webhook", defaults={"enabled": False})
    run_queued(agent_run.pk)
    agent_run = fresh(agent_run)
    assert agent_run.termination_reason == "journal_unreplayable"
    assert "whose outcome is not recorded" in agent_run.error_message
    assert agent_run.pending_effect == "idempotent_write"
    assert agent_run.pending_call["tool"] == "put_webhook"
    key = http_server.received[0].headers["Idempotency-Key"]
    assert agent_run.pending_call["idempotency_key"] == key
    assert agent_run.pk in [run.pk for run in write_audit_runs()]
    [audit] = api.get("/api/write-audits/").json()
    assert (audit["tool"], audit["idempotency_key"]) == ("put_webhook", key)
