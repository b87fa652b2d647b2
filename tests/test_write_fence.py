"""G6: a write's fence is on the run row while the tool runs, and cleared with its audit."""

import pytest
from django.db.models import F

from runs import transitions
from runs.models import AgentRun
from runs.runtime import enqueue, run, run_queued
from runs.runtime.run_request import parse_run_request
from runs.transitions import Lease, NextCall, RecordOutcome
from tests.helpers import answer, call, scripted, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
PROBES = ["tests.tools_for_tests.FenceProbe", "tests.tools_for_tests.ReadFenceProbe"]
PROBES_NAMES = ["fence_probe_write", "fence_probe_read"]


def test_the_fence_stands_while_a_write_runs_and_not_for_a_read(settings):
    settings.NRLLM_TOOLS = PROBES
    agent_run = run(
        scripted(
            {"tool_calls": [{"name": "fence_probe_write"}, {"name": "fence_probe_read"}]},
            answer(),
            tools=["fence_probe_write", "fence_probe_read"],
        )
    )
    seen = dict(agent_run.steps.filter(kind="tool").values_list("tool_name", "result"))
    assert seen["fence_probe_write"]["pending_effect"] == "idempotent_write"
    assert seen["fence_probe_read"]["pending_effect"] == ""
    assert agent_run.pending_effect == ""


@pytest.mark.worker
def test_a_worker_fences_a_webhook_post_until_its_step_is_recorded(workers, http_server):
    agent_run = enqueue(
        scripted(
            call("post_webhook", url=http_server.url("/hold"), payload={"n": 1}),
            answer(),
            tools=["post_webhook"],
        )
    )
    workers.start(burst=True)
    assert http_server.held.wait(timeout=30), "the webhook was never called"
    during = AgentRun.objects.get(pk=agent_run.pk)
    assert during.pending_effect == "non_idempotent_write"
    assert during.step_count == 2  # request, llm: the tool's step is not recorded yet
    http_server.release.set()

    wait_until(
        lambda: AgentRun.objects.get(pk=agent_run.pk).status == "completed", what="completion"
    )
    agent_run.refresh_from_db()
    assert agent_run.pending_effect == ""
    step = agent_run.steps.get(kind="tool")
    assert step.effect == "non_idempotent_write"
    [post] = http_server.posts()
    assert post.headers["Idempotency-Key"] == step.idempotency_key


def test_a_worker_that_lost_the_run_stamps_no_fence():
    agent_run = transitions.create_queued_run(scripted(answer()), "p")
    lease = transitions.claim(agent_run.pk, "w", 60).lease
    stale = Lease(lease.run_id, lease.owner, lease.token - 1)
    assert not transitions.renew_lease(stale, 60, fence="non_idempotent_write")
    assert AgentRun.objects.get(pk=agent_run.pk).pending_effect == ""
    assert transitions.renew_lease(lease, 60, fence="non_idempotent_write")
    assert AgentRun.objects.get(pk=agent_run.pk).pending_effect == "non_idempotent_write"


def test_the_step_before_a_write_stamps_its_fence_unless_a_cancel_was_requested():
    """The renewal before a call rides on the previous step's record (G5, G6);
    a cancel requested meanwhile stamps nothing, and the worker stops."""
    agent_run = transitions.create_queued_run(scripted(answer()), "p")
    lease = transitions.claim(agent_run.pk, "w", 60).lease
    write = NextCall(fence="non_idempotent_write", call={"tool": "t", "idempotency_key": "k"})
    outcome = transitions.record_step(
        lease, 60, {"kind": "llm"}, clear_fence=False, next_call=write
    )
    assert outcome is RecordOutcome.PERSISTED
    stamped = AgentRun.objects.get(pk=agent_run.pk)
    assert (stamped.pending_effect, stamped.pending_call["idempotency_key"]) == (
        "non_idempotent_write",
        "k",
    )

    # The write's own record clears its fence; the next one is stamped after a cancel request.
    assert transitions.cancel(agent_run.pk) is transitions.CancelOutcome.REQUESTED
    outcome = transitions.record_step(
        lease,
        60,
        {"kind": "tool", "effect": "non_idempotent_write"},
        clear_fence=True,
        next_call=write,
    )
    assert outcome is RecordOutcome.PERSISTED_CANCEL_REQUESTED
    after = AgentRun.objects.get(pk=agent_run.pk)
    assert (after.pending_effect, after.pending_call, after.step_count) == ("", None, 3)


def test_a_re_executed_run_stamps_the_fence_before_a_write_it_has_not_recorded(settings):
    """A re-executed attempt (its journal holds only the request) stamps the
    write's fence before running it, as a first attempt does."""
    settings.NRLLM_TOOLS = PROBES
    request = scripted(
        {"tool_calls": [{"name": "fence_probe_write"}]}, answer(), tools=PROBES_NAMES
    )
    agent_run = transitions.create_queued_run(parse_run_request(request).as_json(), "p")
    first = transitions.claim(agent_run.pk, "w", 60).lease
    assert transitions.record_step(first, 60, {"kind": "request"}, clear_fence=False).persisted
    assert transitions.requeue_for_retry(
        first, failure_class="connection", error_type="E", error_message="gone"
    )
    run_queued(agent_run.pk)
    agent_run.refresh_from_db()
    assert agent_run.status == "completed"
    probe = agent_run.steps.get(kind="tool")
    assert probe.result == {"pending_effect": "idempotent_write", "lease_token": 2}
    assert agent_run.pending_effect == ""


def _lose_the_last_step(run_id) -> None:
    """What a server crash behind a transaction pooler leaves: the run's
    latest record, which did not wait for the flush, is gone, and the
    worker's connection did not break. (The append-only trigger is the
    database's; a recovery does not run it, nor does this.)"""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute(
            "DELETE FROM runs_runstep WHERE run_id = %s AND sequence ="
            " (SELECT max(sequence) FROM runs_runstep WHERE run_id = %s)",
            [run_id, run_id],
        )
        cursor.execute("SET session_replication_role = DEFAULT")
    AgentRun.objects.filter(pk=run_id).update(
        step_count=F("step_count") - 1, attempt_steps=F("attempt_steps") - 1
    )


def test_a_fence_is_never_stamped_over_steps_the_database_lost():
    """Before a call the step before it did not renew for (the first live
    call after a resume, say), the lease is renewed and a write's fence
    stamped on their own — guarded, as every record is, on the attempt's
    step count. Over a turn the database lost, that renewal matches nothing:
    the attempt writes the turn again with it, so the write never starts
    without the turn that asked for it on disk (G6, G12)."""
    from runs.models.vocabulary import StepKind
    from runs.runtime.execution import LeasedExecution
    from runs.runtime.loop import PlannedCall, StepEvent
    from tools.registry import offered_tools

    agent_run = transitions.create_queued_run(scripted(answer()), "p")
    lease = transitions.claim(agent_run.pk, "w", 60).lease
    execution = LeasedExecution(lease, 60, 30, recorded_steps=1)
    arguments = {"recipient": "ops", "message": "hi"}
    turn = {"content": "", "tool_calls": [{"name": "send_notification", "arguments": arguments}]}
    execution.after_step(StepEvent(kind=StepKind.LLM, result=turn))
    _lose_the_last_step(agent_run.pk)

    tool = offered_tools(["send_notification"], frozenset())["send_notification"]
    execution.before_tool(PlannedCall(tool=tool, arguments=arguments, position="1.0"))

    agent_run.refresh_from_db()
    assert list(agent_run.steps.values_list("kind", flat=True)) == ["request", "llm"]
    assert (agent_run.attempt_steps, agent_run.pending_effect) == (2, "non_idempotent_write")
    assert agent_run.steps.get(kind="llm").result == turn
