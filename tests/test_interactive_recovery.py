"""An interactive run is its caller's (G7, G9): interrupted, it ends
``cancelled``; abandoned (its caller killed), the reaper ends it and no
worker ever finishes what the caller started. Through real ``run_agent``
processes, with the ``scripted`` provider and a model that words every
answer differently."""

import json
import signal
import subprocess
import sys
import time

import pytest
from django.conf import settings as django_settings

from runs import transitions
from runs.models import AgentRun, RunStep
from runs.reaper import reap_stale_runs
from tests.drifting_model import NOTIFY, SEARCH, request_for
from tests.helpers import ROOT, later, step_inserts_held, wait_until
from tools.models import OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)

# A read, then a slow model turn that asks for a notification: the caller
# stops the run while the model thinks, before the write.
PLAN = [{"calls": [SEARCH]}, {"calls": [NOTIFY], "delay_seconds": 6}, {"answer": "Sent."}]


def start_run_agent(model, worker_env, *, plan=PLAN) -> subprocess.Popen:
    """``manage.py run_agent -`` on ``plan``, as an operator would start it."""
    request = request_for(
        "scripted" if model is None else "drifting", plan, ["search_notes", "send_notification"]
    )
    process = subprocess.Popen(
        [sys.executable, "manage.py", "run_agent", "-"],
        cwd=ROOT,
        env={
            **worker_env,
            "NRLLM_OPENAI_BASE_URL": django_settings.NRLLM_OPENAI_BASE_URL,
            "NRLLM_OPENAI_API_KEY": django_settings.NRLLM_OPENAI_API_KEY,
        },
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As an operator's shell starts it: with Ctrl-C's default action. A
        # test suite started in the background (`make test &`) ignores
        # SIGINT, and a child would inherit that and never see the signal.
        preexec_fn=_default_sigint,
    )
    process.stdin.write(json.dumps(request))
    process.stdin.close()
    process.stdin = None  # communicate() has nothing more to send
    return process


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def the_read_is_recorded():
    """The run, once its read step is durable (the model is thinking)."""
    step = RunStep.objects.filter(kind="tool", tool_name="search_notes").first()
    return step and AgentRun.objects.get(pk=step.run_id)


@pytest.mark.parametrize(
    ("model", "signum"),
    [("scripted", signal.SIGINT), ("drifting", signal.SIGTERM)],
    indirect=["model"],
    ids=["scripted-SIGINT", "drifting-SIGTERM"],
)
def test_an_interrupted_run_agent_ends_its_run_cancelled_and_nothing_finishes_it(
    model, signum, worker_env, queue
):
    process = start_run_agent(model, worker_env)
    agent_run = wait_until(the_read_is_recorded, timeout=30, what="the read")
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr
    assert f"interrupted: run {agent_run.pk} is cancelled" in stderr

    ended = AgentRun.objects.get(pk=agent_run.pk)
    assert (ended.status, ended.termination_reason) == ("cancelled", "cancelled")
    reap_stale_runs(as_of=later())
    assert AgentRun.objects.get(pk=agent_run.pk).status == "cancelled"
    assert OutboxNotification.objects.count() == 0 and queue.count == 0


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_an_interactive_run_whose_caller_was_killed_is_ended_by_the_reaper_never_finished(
    model, worker_env, queue
):
    process = start_run_agent(model, worker_env)
    agent_run = wait_until(the_read_is_recorded, timeout=30, what="the read")
    process.kill()
    process.communicate(timeout=30)
    assert AgentRun.objects.get(pk=agent_run.pk).status == "running"

    report = reap_stale_runs(as_of=later())
    assert report.decisions == {str(agent_run.pk): "abandoned: abandoned"}
    ended = AgentRun.objects.get(pk=agent_run.pk)
    assert (ended.status, ended.termination_reason, ended.lease_token) == (
        "failed",
        "abandoned",
        1,
    )
    # Not turned into a queued run: no job, no worker, no notification.
    assert queue.count == 0 and queue.scheduled_job_registry.count == 0
    assert OutboxNotification.objects.count() == 0


def test_an_abandoned_interactive_run_fenced_on_a_non_idempotent_write_is_in_doubt():
    lease = transitions.begin_interactive({"prompt": "p"}, "p", "gone", 60)
    call = {"tool": "send_notification", "arguments": {}, "idempotency_key": "k"}
    assert transitions.renew_lease(lease, 60, fence="non_idempotent_write", call=call)
    reap_stale_runs(as_of=later())
    ended = AgentRun.objects.get(pk=lease.run_id)
    assert (ended.status, ended.termination_reason) == ("failed", "write_interrupted")
    assert ended.pending_call == call and ended.dead_letters.get().reason == "write_interrupted"


def test_two_sigterms_while_a_writes_record_is_held_still_end_the_run_cancelled_once(
    worker_env, queue
):
    """A signal lands inside a database statement (the write's own record,
    held by the test) and a second one follows while the run settles: exit
    130 without a traceback, the run cancelled, the write done once."""
    plan = [{"calls": [NOTIFY]}, {"answer": "Sent."}]
    held = "NEW.kind = 'tool' AND NEW.tool_name = 'send_notification'"
    with step_inserts_held(held) as (waiting, _):
        process = start_run_agent(None, worker_env, plan=plan)
        wait_until(waiting, timeout=30, what="the held record")
        process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    ended = AgentRun.objects.get()
    assert (ended.status, ended.termination_reason) == ("cancelled", "cancelled")
    assert OutboxNotification.objects.count() == 1
