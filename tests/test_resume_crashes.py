"""G5 and G12 through real rqworkers and the drifting model: a crash inside
a resumed attempt — before its resume step is durable, or in its first live
model call — and a zombie worker whose lease was taken while it waited on the
model. The write the first attempt recorded never runs again, no recorded
turn is asked for again, and nothing a zombie does reaches the journal."""

import contextlib
import signal
from datetime import timedelta

import psutil
import pytest
from django.utils import timezone

from runs.models import AgentRun
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from tests.drifting_model import openai_request
from tests.helpers import step_inserts_held, wait_until
from tools.models import OutboxNotification

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

NOTIFY = {"name": "send_notification", "arguments": {"recipient": "ops", "message": "t{take}"}}
NOTIFY_TOO = {
    "name": "send_notification",
    "arguments": {"recipient": "ops2", "message": "t{take}"},
}


def later():
    return timezone.now() + timedelta(hours=1)


@pytest.mark.parametrize("where", ["before the resume step", "after the resume step"])
def test_a_crash_inside_a_resumed_attempt_repeats_nothing(where, drifting_model, workers):
    plan = [{"calls": [NOTIFY]}, {"answer": "done {take}"}]
    drifting_model.hold_turn(1)
    agent_run = enqueue(openai_request("ship", plan, ["send_notification"]))
    first = workers.start(NRLLM_LEASE_SECONDS=2)
    assert drifting_model.held.wait(timeout=30)
    workers.kill(first)
    drifting_model.release.set()
    assert reap_stale_runs(as_of=later()).decisions[str(agent_run.pk)].startswith("requeued")

    drifting_model.release.clear()
    drifting_model.held.clear()
    with contextlib.ExitStack() as stack:
        if where == "before the resume step":
            waiting, end_the_wait = stack.enter_context(step_inserts_held("NEW.kind = 'resume'"))
        else:
            drifting_model.hold_turn(1)
        second = workers.start(NRLLM_LEASE_SECONDS=2)
        if where == "before the resume step":
            wait_until(waiting, timeout=30, what="the resume step waiting")
        else:
            assert drifting_model.held.wait(timeout=30)
        workers.kill(second)
        if where == "before the resume step":
            end_the_wait()
    drifting_model.release.set()
    assert reap_stale_runs(as_of=later()).decisions[str(agent_run.pk)].startswith("requeued")
    workers.run_burst()

    agent_run = AgentRun.objects.get(pk=agent_run.pk)
    assert agent_run.status == "completed", agent_run.termination_reason
    assert OutboxNotification.objects.count() == 1
    assert drifting_model.requests_by_turn[0] == 1, drifting_model.requests_by_turn
    # A resume step lost with its attempt is not counted: tokens are saved once per resume.
    expected = 1 if where == "before the resume step" else 2
    assert agent_run.steps.filter(kind="resume").count() == expected
    assert agent_run.tokens_saved_by_replay == 18 * expected


def test_a_zombie_whose_lease_was_taken_adds_nothing_after_the_resumed_attempt(
    drifting_model, workers
):
    plan = [{"calls": [NOTIFY]}, {"calls": [NOTIFY_TOO]}, {"answer": "done {take}"}]
    drifting_model.hold_turn(1)
    agent_run = enqueue(openai_request("ship", plan, ["send_notification"]))
    # The forking worker, busy with its one run: a concurrent one has slots
    # free and would take the requeued run itself, the zombie no zombie.
    zombie = workers.start(NRLLM_LEASE_SECONDS=2, NRLLM_WORKER_CLASS="runs.worker.Worker")
    assert drifting_model.held.wait(timeout=30)
    # The zombie is alive, blocked in the model call for turn 1.
    report = reap_stale_runs(as_of=later())
    assert report.decisions[str(agent_run.pk)].startswith("requeued"), report.decisions
    workers.run_burst()  # another worker resumes: turn 1 is asked again (not held now)
    agent_run.refresh_from_db()
    assert agent_run.status == "completed"
    last = agent_run.step_count
    drifting_model.release.set()  # the zombie's model call returns now
    wait_until(lambda: drifting_model.requests_by_turn[1] == 2, what="both turn-1 requests")
    # What the zombie would do with its answer, it has tried: its work horse,
    # the attempt's process, has ended.
    wait_until(
        lambda: not psutil.Process(zombie.pid).children(),
        timeout=30,
        what="the zombie's work horse to end",
    )
    workers.signal(zombie, signal.SIGTERM)
    agent_run.refresh_from_db()
    assert agent_run.status == "completed"
    assert agent_run.step_count == last, "the zombie recorded a step after the run ended"
    assert OutboxNotification.objects.filter(recipient="ops").count() == 1
    assert OutboxNotification.objects.filter(recipient="ops2").count() == 1
    assert drifting_model.requests_by_turn[0] == 1
