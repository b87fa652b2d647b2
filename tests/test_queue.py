"""The queue path: enqueue after commit, real rqworker execution, dispatch failure."""

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.db import transaction

from runs.models import AgentRun, DeadLetter
from runs.runtime import enqueue
from tests.helpers import answer, call, scripted

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.worker
def test_a_queued_run_completes_on_a_real_rqworker(workers, queue):
    agent_run = enqueue(
        scripted(call("search_notes", query="x"), answer("hello"), tools=["search_notes"])
    )
    [job] = queue.get_jobs()
    assert job.args == (str(agent_run.pk),)
    assert job.timeout == -1 and job.retries_left is None  # the run row decides, not RQ
    assert AgentRun.objects.get(pk=agent_run.pk).status == "queued"
    workers.run_burst()
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.output, agent_run.mode) == ("completed", "hello", "queued")
    assert agent_run.steps.count() == 4


@pytest.mark.worker
def test_rqs_own_line_per_job_follows_log_level(workers, queue):
    """django-rq sets RQ's worker logger from ``-v`` alone, INFO by default:
    a line or two per job. Left at its default, ``-v`` follows LOG_LEVEL,
    which quiets RQ as it quiets every other logger."""
    enqueue(scripted(answer("told")))
    told = workers.run_burst()
    enqueue(scripted(answer("quiet")))
    quiet = workers.run_burst(LOG_LEVEL="WARNING")
    assert "Successfully completed" in told
    assert "Successfully completed" not in quiet


@pytest.mark.worker
@pytest.mark.parametrize(
    ("worker_class", "forks"),
    [("runs.worker.Worker", True), ("runs.worker.SimpleWorker", False)],
)
def test_the_worker_class_and_connection_reuse_come_from_the_environment(
    workers, queue, settings, worker_class, forks
):
    settings.NRLLM_TOOLS = ["tests.tools_for_tests.ProcessProbe"]
    probe = scripted(call("process_probe"), answer(), tools=["process_probe"])
    runs = [enqueue(probe) for _ in range(3)]
    worker = workers.start(burst=True, NRLLM_WORKER_CLASS=worker_class, DATABASE_CONN_MAX_AGE=60)
    worker.communicate(timeout=60)
    seen = [AgentRun.objects.get(pk=run.pk).steps.get(kind="tool").result for run in runs]
    pids = {result["pid"] for result in seen}
    backends = {result["backend_pid"] for result in seen}
    if forks:
        # A work horse per job, each with a connection of its own.
        assert worker.pid not in pids and len(pids) == 3 and len(backends) == 3
    else:
        # Every job in the worker itself, on one kept connection.
        assert pids == {worker.pid} and len(backends) == 1


def test_the_job_is_dispatched_only_after_commit(queue):
    with transaction.atomic():
        agent_run = enqueue(scripted(answer()))
        assert queue.count == 0
    assert queue.count == 1
    assert AgentRun.objects.get(pk=agent_run.pk).status == "queued"


def test_a_rolled_back_enqueue_dispatches_nothing(queue):
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue(scripted(answer()))
        raise RuntimeError("caller failed")
    assert queue.count == 0 and AgentRun.objects.count() == 0


def test_a_dispatch_that_cannot_reach_redis_leaves_the_run_queued_for_the_reaper(settings):
    # A Redis that is not there: a closed port on this machine. The run row
    # is the state: the reaper dispatches it again once Redis is back
    # (tests/test_dispatch_recovery.py).
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    agent_run = enqueue(scripted(answer()))
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.termination_reason) == ("queued", "")
    assert not DeadLetter.objects.exists()


def test_a_dispatch_failure_no_retry_could_cure_fails_the_run_with_a_dead_letter(settings):
    settings.REDIS_URL = "nosuchscheme://127.0.0.1/0"
    agent_run = enqueue(scripted(answer()))
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.termination_reason, agent_run.error_type) == (
        "failed",
        "dispatch_failed",
        "ValueError",
    )
    [dead_letter] = DeadLetter.objects.filter(run=agent_run)
    assert dead_letter.reason == "dispatch_failed" and "scheme" in dead_letter.error_message


def test_a_worker_class_that_serves_only_its_own_queue_is_refused_at_start(settings):
    """RQ's own classes would never see a team's queue, where runs wait (G22)."""
    settings.RQ = {"WORKER_CLASS": "rq.worker.SimpleWorker"}
    with pytest.raises(SystemCheckError, match="runs.E002.*does not serve the teams' queues"):
        call_command("check")
    # A worker's start runs only the checks of what it stands on: this one among them.
    with pytest.raises(SystemCheckError, match="runs.E002.*does not serve the teams' queues"):
        call_command("rqworker", "default", burst=True, skip_checks=False)
    settings.RQ = {"WORKER_CLASS": "runs.worker.ConcurrentWorker"}
    for command in ("rqworker", "rqworker-pool"):
        with pytest.raises(CommandError, match=f"{command} not started: --worker-class rq.worker"):
            call_command(command, "default", worker_class="rq.worker.Worker")
