"""Evidence that G2–G9 hold when processes die, the database fails and Redis
loses jobs: real rqworker processes killed, stopped and cut off."""

import signal

import pytest
from django.db import connection

from runs.models import AgentRun, DeadLetter
from runs.models.faults import run_status_changes_refused, step_inserts_refused
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from tests.helpers import answer, call, fresh, later, scripted, wait_until
from tools.models import OutboxNotification

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

SHORT_LEASE = {"NRLLM_LEASE_SECONDS": 2}


def enqueue_held_webhook(http_server, tool: str):
    """A queued run whose one write is a webhook call the server holds."""
    request = call(tool, url=http_server.url("/hold"), payload={"v": 1})
    return enqueue(scripted(request, answer(), tools=[tool]))


def kill_mid_call(workers, http_server):
    """Start a worker, wait until its tool call is held at the server, SIGKILL it."""
    worker = workers.start(**SHORT_LEASE)
    assert http_server.held.wait(timeout=30), "the tool call never reached the server"
    workers.kill(worker)
    http_server.release.set()  # later calls are answered at once


def test_sigkill_during_a_read_only_tool_requeues_and_another_worker_completes(
    workers, http_server
):
    agent_run = enqueue(
        scripted(
            call("http_get", url=http_server.url("/hold")), answer("fetched"), tools=["http_get"]
        )
    )
    kill_mid_call(workers, http_server)
    assert fresh(agent_run).status == "running"

    report = reap_stale_runs(as_of=later())
    assert report.decisions[str(agent_run.pk)].startswith("requeued")
    workers.run_burst()

    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.output) == ("completed", "fetched")
    assert (agent_run.requeue_count, agent_run.lease_token) == (1, 2)
    assert [request.path for request in http_server.received] == ["/hold", "/hold"]


def test_sigkill_during_an_idempotent_write_retries_with_the_same_idempotency_key(
    workers, http_server, settings
):
    settings.NRLLM_TOOLS = ["tests.tools_for_tests.IdempotentWebhook"]
    agent_run = enqueue_held_webhook(http_server, "put_webhook")
    kill_mid_call(workers, http_server)
    assert fresh(agent_run).pending_effect == "idempotent_write"

    reap_stale_runs(as_of=later())
    workers.run_burst()

    assert fresh(agent_run).status == "completed"
    first, second = http_server.posts()
    assert first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"]
    assert (
        fresh(agent_run).steps.get(kind="tool").idempotency_key == first.headers["Idempotency-Key"]
    )


def test_sigkill_during_a_non_idempotent_write_dead_letters_it_and_never_repeats_it(
    workers, http_server, queue
):
    agent_run = enqueue_held_webhook(http_server, "post_webhook")
    kill_mid_call(workers, http_server)

    reap_stale_runs(as_of=later())
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.termination_reason) == ("failed", "write_interrupted")
    assert DeadLetter.objects.get(run=agent_run).reason == "write_interrupted"

    # More reaper passes, a stray wake-up and fresh workers change nothing.
    reap_stale_runs(as_of=later(7200))
    queue.enqueue("runs.jobs.execute_run_job", str(agent_run.pk))
    workers.run_burst()
    workers.run_burst()
    assert len(http_server.posts()) == 1
    assert fresh(agent_run).status == "failed"


def test_a_zombie_worker_resumed_after_its_run_moved_on_writes_nothing(workers):
    agent_run = enqueue(
        scripted(
            {**call("send_notification", recipient="ops", message="hi"), "delay_seconds": 3},
            answer(),
            tools=["send_notification"],
        )
    )
    zombie = workers.start(burst=True, **SHORT_LEASE)
    wait_until(lambda: fresh(agent_run).step_count >= 1, what="the zombie's request step")
    workers.signal(zombie, signal.SIGSTOP)

    reap_stale_runs(as_of=later())
    workers.run_burst()  # another worker claims, sends the notification, completes
    assert fresh(agent_run).status == "completed" and fresh(agent_run).lease_token == 2

    workers.signal(zombie, signal.SIGCONT)
    output, _ = zombie.communicate(timeout=30)
    agent_run.refresh_from_db()
    assert OutboxNotification.objects.count() == 1  # only the second worker's
    zombie_steps = agent_run.steps.filter(lease_token=1).exclude(kind="reaper")
    assert list(zombie_steps.values_list("kind", flat=True)) == ["request"]
    assert (agent_run.status, agent_run.lease_owner) == ("completed", "")
    assert b"lost" in output


def test_a_refused_audit_then_a_refused_settle_is_dead_lettered_by_the_reaper(workers, queue):
    agent_run = enqueue(
        scripted(
            call("send_notification", recipient="ops", message="hi"),
            answer(),
            tools=["send_notification"],
        )
    )
    with step_inserts_refused("send_notification"), run_status_changes_refused():
        workers.run_burst(**SHORT_LEASE)
    stranded = fresh(agent_run)
    assert (stranded.status, stranded.pending_effect) == ("running", "non_idempotent_write")

    # The database has recovered.
    reap_stale_runs(as_of=later())
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.termination_reason) == ("failed", "write_interrupted")
    reap_stale_runs(as_of=later(7200))
    queue.enqueue("runs.jobs.execute_run_job", str(agent_run.pk))
    workers.run_burst()
    assert OutboxNotification.objects.count() == 1
    assert fresh(agent_run).lease_token == 1


def test_a_connection_terminated_between_a_write_and_its_audit_is_never_retried(
    workers, http_server, queue
):
    agent_run = enqueue_held_webhook(http_server, "post_webhook")
    # Unpooled, the attempt holds its connection through the write, and the
    # audit meets the termination. (A pooled attempt gives its connection
    # back while the tool runs, and its audit goes out on a live one.)
    worker = workers.start(burst=True, DATABASE_POOL_MAX_SIZE=0, **SHORT_LEASE)
    assert http_server.held.wait(timeout=30)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert cursor.fetchone()[0] >= 1
    http_server.release.set()
    worker.communicate(timeout=30)

    reap_stale_runs(as_of=later())
    workers.run_burst()
    agent_run.refresh_from_db()
    assert agent_run.status == "failed"
    assert agent_run.termination_reason in ("not_retryable", "write_interrupted")
    assert agent_run.requeue_count == 0 and agent_run.lease_token == 1
    assert len(http_server.posts()) == 1


def test_redis_flushed_while_runs_are_queued_every_run_still_ends_once(workers, queue, settings):
    settings.NRLLM_REDISPATCH_AFTER_SECONDS = 60
    runs = [
        enqueue(
            scripted(
                call("send_notification", recipient=f"r{index}", message="m"),
                answer(),
                tools=["send_notification"],
            )
        )
        for index in range(10)
    ]
    # Redis restarted without persistence. (FLUSHDB, not FLUSHALL: the other
    # xdist worker's queue lives in another database of the same server.)
    queue.connection.flushdb()

    report = reap_stale_runs(as_of=later(120))
    assert len(report.decisions) == 10
    # A duplicate of every wake-up, as a second reaper might have sent.
    for agent_run in runs:
        queue.enqueue("runs.jobs.execute_run_job", str(agent_run.pk))
    workers.run_burst()

    assert set(AgentRun.objects.values_list("status", "lease_token")) == {("completed", 1)}
    assert OutboxNotification.objects.count() == 10


def test_a_retryable_failure_is_retried_with_backoff_by_the_scheduler(workers):
    agent_run = enqueue(scripted({"error": "server_error", "attempts": 1}, answer("second time")))
    workers.start(with_scheduler=True, NRLLM_RETRY_BACKOFF_SECONDS=1)
    wait_until(lambda: fresh(agent_run).status == "completed", timeout=40, what="the retry")
    agent_run.refresh_from_db()
    assert (agent_run.output, agent_run.requeue_count, agent_run.lease_token) == (
        "second time",
        1,
        2,
    )
    assert agent_run.failure_class == ""


def test_a_tool_is_stopped_at_its_time_limit(workers, settings):
    settings.NRLLM_TOOLS = ["tests.tools_for_tests.SlowTool"]
    agent_run = enqueue(
        scripted(call("slow_tool", seconds=30), answer("gave up"), tools=["slow_tool"])
    )
    workers.run_burst(timeout=20)
    agent_run.refresh_from_db()
    assert agent_run.status == "completed"
    assert (
        agent_run.steps.get(kind="tool").error == "tool 'slow_tool' exceeded its time limit of 1s"
    )
