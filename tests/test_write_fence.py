"""G6: a write's fence is on the run row while the tool runs, and cleared with its audit."""

import pytest

from runs import transitions
from runs.models import AgentRun
from runs.runtime import enqueue, run
from runs.transitions import Lease
from tests.helpers import answer, call, scripted, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
PROBES = ["tests.tools_for_tests.FenceProbe", "tests.tools_for_tests.ReadFenceProbe"]


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
    lease = transitions.claim(agent_run.pk, "w", 60)
    stale = Lease(lease.run_id, lease.owner, lease.token - 1)
    assert not transitions.renew_lease(stale, 60, fence="non_idempotent_write")
    assert AgentRun.objects.get(pk=agent_run.pk).pending_effect == ""
    assert transitions.renew_lease(lease, 60, fence="non_idempotent_write")
    assert AgentRun.objects.get(pk=agent_run.pk).pending_effect == "non_idempotent_write"


def test_the_lease_is_extended_to_cover_a_tools_own_time_limit(settings):
    settings.NRLLM_TOOLS = ["tests.tools_for_tests.LeaseProbe"]
    settings.NRLLM_LEASE_SECONDS = 5
    settings.NRLLM_OPERATION_MARGIN_SECONDS = 30
    agent_run = run(
        scripted({"tool_calls": [{"name": "lease_probe"}]}, answer(), tools=["lease_probe"])
    )
    remaining = agent_run.steps.get(kind="tool").result["lease_remaining_seconds"]
    assert 600 + 30 - 5 < remaining <= 600 + 30  # the tool's 600 s limit plus the margin
    assert agent_run.status == "completed"
