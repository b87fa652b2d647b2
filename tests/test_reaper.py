"""G7: the reaper requeues what is safe, dead-letters the rest, and never races a live worker."""

import io
import threading
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models import F
from django.utils import timezone
from rq.job import JobStatus

from runs import transitions
from runs.models import AgentRun, DeadLetter, RunStep
from runs.queue.dispatch import dispatch, executing_in_embedded_worker, job_id_for, run_queue
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from runs.transitions import Reaping, StaleLease
from runs.workers.embedded import execute_due_runs
from tests.helpers import answer, later, scripted, stored

pytestmark = pytest.mark.django_db(transaction=True)


def stale_run(*, fence="", requeue_count=0, cancel=False):
    """A running run whose worker died: its lease is ours to back-date."""
    agent_run = transitions.create_queued_run(stored(scripted(answer())), "p")
    AgentRun.objects.filter(pk=agent_run.pk).update(requeue_count=requeue_count)
    lease = transitions.claim(agent_run.pk, "dead-worker", 60).lease
    if fence:
        assert transitions.renew_lease(lease, 60, fence=fence)
    if cancel:
        transitions.cancel(agent_run.pk)
    return AgentRun.objects.get(pk=agent_run.pk)


def reaper_steps(agent_run):
    return list(agent_run.steps.filter(kind="reaper").values_list("result", flat=True))


def test_a_stale_run_that_is_safe_is_requeued_and_dispatched(queue):
    agent_run = stale_run()
    report = reap_stale_runs(as_of=later())
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.lease_owner, agent_run.lease_expires_at) == (
        "queued",
        "",
        None,
    )
    assert (agent_run.requeue_count, agent_run.pending_effect) == (1, "")
    assert report.decisions == {str(agent_run.pk): "requeued: lease expired; safe to run again"}
    [step] = reaper_steps(agent_run)
    assert step["decision"] == "requeued" and step["stale_lease_owner"] == "dead-worker"
    assert queue.fetch_job(job_id_for(agent_run.pk, 1)) is not None


def test_an_idempotent_write_fence_is_requeued(queue):
    agent_run = stale_run(fence="idempotent_write")
    reap_stale_runs(as_of=later())
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.pending_effect) == ("queued", "")


@pytest.mark.parametrize("requeue_count", [0, 3])
def test_a_non_idempotent_fence_is_dead_lettered_whatever_the_budget(queue, requeue_count):
    agent_run = stale_run(fence="non_idempotent_write", requeue_count=requeue_count)
    reap_stale_runs(as_of=later())
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.termination_reason) == ("failed", "write_interrupted")
    assert agent_run.pending_effect == "non_idempotent_write"  # the write stays in doubt
    assert DeadLetter.objects.get(run=agent_run).reason == "write_interrupted"
    assert queue.count == 0


def test_a_spent_budget_is_dead_lettered_retries_exhausted(queue, settings):
    settings.NRLLM_MAX_REQUEUES = 2
    agent_run = stale_run(requeue_count=2)
    reap_stale_runs(as_of=later())
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.termination_reason) == ("failed", "retries_exhausted")
    assert agent_run.requeue_count == 2 and queue.count == 0


def test_a_stale_run_with_a_cancel_requested_ends_cancelled(queue):
    agent_run = stale_run(cancel=True)
    reap_stale_runs(as_of=later())
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.termination_reason) == ("cancelled", "cancelled")


def test_a_live_lease_is_left_alone():
    agent_run = stale_run()
    report = reap_stale_runs()  # the database's own clock: the lease has 60s left
    assert report.decisions == {} and AgentRun.objects.get(pk=agent_run.pk).status == "running"
    reap_stale_runs(as_of=later(30))
    assert AgentRun.objects.get(pk=agent_run.pk).status == "running"


def test_a_worker_that_renewed_after_the_reaper_looked_keeps_its_run():
    agent_run = stale_run()
    seen = StaleLease(str(agent_run.pk), agent_run.lease_token)
    as_of = later(120)  # the reaper saw the lease (60s) as expired...
    lease = transitions.Lease(str(agent_run.pk), "dead-worker", agent_run.lease_token)
    assert transitions.heartbeat(lease, 600)  # ...and the slow worker renewed in between.
    reaping = [Reaping(seen, {"kind": "reaper", "result": {"decision": "x"}})]
    assert transitions.reap_requeue(reaping, as_of) == []
    assert transitions.reap_dead_letter(reaping, as_of, reason="write_interrupted") == []
    assert transitions.reap_cancelled(reaping, as_of) == []
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.lease_owner, agent_run.step_count) == (
        "running",
        "dead-worker",
        1,  # the claim's request step only: no reaper step
    )


def test_two_reapers_at_once_reap_each_run_once_and_a_second_pass_changes_nothing(queue):
    runs = [stale_run() for _ in range(12)] + [
        stale_run(fence="non_idempotent_write") for _ in range(4)
    ]
    as_of = later()
    barrier = threading.Barrier(2)
    reports = []

    def reaper():
        try:
            barrier.wait()
            reports.append(reap_stale_runs(as_of=as_of))
        finally:
            connection.close()

    threads = [threading.Thread(target=reaper) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    decided = [run_id for report in reports for run_id in report.decisions]
    assert sorted(decided) == sorted(str(run.pk) for run in runs)  # each once, by one reaper
    assert RunStep.objects.filter(kind="reaper").count() == 16
    assert DeadLetter.objects.count() == 4
    assert set(AgentRun.objects.values_list("requeue_count", flat=True)) == {0, 1}
    assert reap_stale_runs(as_of=as_of).decisions == {}
    assert RunStep.objects.filter(kind="reaper").count() == 16


def test_a_queued_run_whose_job_was_lost_is_dispatched_again(queue, settings):
    settings.NRLLM_REDISPATCH_AFTER_SECONDS = 60
    agent_run = transitions.create_queued_run(
        stored(scripted(answer())), "p"
    )  # no job ever dispatched
    assert reap_stale_runs(as_of=later(30)).decisions == {}  # not yet past the threshold
    report = reap_stale_runs(as_of=later(120))
    assert report.decisions == {str(agent_run.pk): "redispatched: no job in Redis"}
    # A new job, under a new id: the lost one's is never used again.
    assert queue.fetch_job(job_id_for(agent_run.pk, 1)).get_status() == "queued"
    # Its job is live now: the next pass leaves it alone.
    assert reap_stale_runs(as_of=later(240)).decisions == {}
    assert reaper_steps(AgentRun.objects.get(pk=agent_run.pk))[0]["decision"] == "redispatched"


def test_without_redis_the_reaper_leaves_a_stranded_queued_run_to_the_embedded_worker(settings):
    # No job to lose without Redis: no "redispatched" step, no reordering.
    agent_run = transitions.create_queued_run(stored(scripted(answer("late"))), "p")
    assert reap_stale_runs(as_of=later()).decisions == {}
    assert reaper_steps(agent_run) == []
    with executing_in_embedded_worker():
        assert execute_due_runs(limit=10) == 1
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.output) == ("completed", "late")


def test_reap_stale_runs_command(queue):
    stale_run()
    out = io.StringIO()
    call_command("reap_stale_runs", "--as-of", later().isoformat(), stdout=out)
    assert "reaper pass: requeued 1, dead_lettered 0" in out.getvalue()
    with pytest.raises(CommandError, match="--as-of 'noon' is not an ISO 8601 date-time"):
        call_command("reap_stale_runs", "--as-of", "noon")
    with pytest.raises(CommandError, match="needs a time zone"):
        call_command("reap_stale_runs", "--as-of", "2026-01-01T00:00:00")
    with pytest.raises(CommandError, match="--loop needs a positive number"):
        call_command("reap_stale_runs", "--loop", "0")


def test_the_reaper_and_the_schedules_are_registered_with_rqs_cron_scheduler():
    from django_rq.cron import DjangoCronScheduler

    scheduler = DjangoCronScheduler()
    scheduler.load_config_from_file("runs.cron")
    intervals = {job.func.__name__: job.interval for job in scheduler.get_jobs()}
    assert intervals == {"reap_job": 10, "fire_schedules_job": 5}


def test_a_job_taken_off_the_queue_by_a_worker_that_died_is_dispatched_again(queue, settings):
    settings.NRLLM_REDISPATCH_AFTER_SECONDS = 60
    agent_run = enqueue(scripted(answer()))
    job_id = job_id_for(agent_run.pk, 0)
    # What a worker SIGKILLed right after dequeuing leaves: the job hash still
    # says "queued", but no queue holds its id any more.
    assert queue.connection.lrem(queue.key, 0, job_id) == 1
    assert queue.fetch_job(job_id).get_status() == "queued"
    report = reap_stale_runs(as_of=later(120))
    assert report.decisions == {str(agent_run.pk): "redispatched: no job in Redis"}
    assert queue.get_job_ids() == [job_id_for(agent_run.pk, 1)]


def test_a_job_deep_in_a_backlog_is_found_and_left_alone(queue, settings):
    """The reaper looks for each job from the queue's head: one behind
    thousands of others is still found, and its run not dispatched twice."""
    settings.NRLLM_REDISPATCH_AFTER_SECONDS = 60
    queue.connection.rpush(queue.key, *[f"ahead-{i}" for i in range(5000)])
    agent_run = enqueue(scripted(answer()))
    assert reap_stale_runs(as_of=later(120)).decisions == {}
    assert queue.get_job_ids().count(job_id_for(agent_run.pk, 0)) == 1


def test_a_job_waiting_in_the_scheduled_registry_is_live_until_long_overdue(queue, settings):
    """A job RQ's scheduler will enqueue when due is live; one due long ago
    is not: no worker runs ``--with-scheduler``, and it would never wake one."""
    settings.NRLLM_REDISPATCH_AFTER_SECONDS = 60
    agent_run = transitions.create_queued_run(stored(scripted(answer())), "p")
    job_id = job_id_for(agent_run.pk, 0)
    dispatch(agent_run.pk, dispatch_count=0, delay_seconds=30)
    assert reap_stale_runs(as_of=later(120)).decisions == {}
    # The same job, due 90 seconds ago and still waiting for a scheduler
    # (delayed jobs wait on the deployment's queue, whose scheduler runs).
    scheduled = run_queue().scheduled_job_registry
    scheduled.schedule(run_queue().fetch_job(job_id), timezone.now() - timedelta(seconds=90))
    report = reap_stale_runs(as_of=later(240))
    assert report.decisions == {str(agent_run.pk): "redispatched: no job in Redis"}
    assert job_id_for(agent_run.pk, 1) in queue.get_job_ids()


def test_a_job_lost_from_the_scheduled_registry_is_dispatched_again(queue, settings):
    settings.NRLLM_REDISPATCH_AFTER_SECONDS = 60
    agent_run = transitions.create_queued_run(stored(scripted(answer())), "p")
    dispatch(agent_run.pk, dispatch_count=0, delay_seconds=30)
    run_queue().scheduled_job_registry.remove(job_id_for(agent_run.pk, 0))
    report = reap_stale_runs(as_of=later(120))
    assert report.decisions == {str(agent_run.pk): "redispatched: no job in Redis"}


@pytest.mark.parametrize(
    ("started_seconds_ago", "redispatched"), [(5, False), (600, True)], ids=["recent", "long-ago"]
)
def test_a_started_job_is_live_only_while_its_worker_may_still_be_claiming(
    queue, settings, started_seconds_ago, redispatched
):
    settings.NRLLM_REDISPATCH_AFTER_SECONDS = 60
    agent_run = enqueue(scripted(answer()))
    job = queue.fetch_job(job_id_for(agent_run.pk, 0))
    # What a worker leaves when it took the job and died before its claim.
    queue.connection.lrem(queue.key, 0, job.id)
    job.started_at = timezone.now() - timedelta(seconds=started_seconds_ago)
    job.set_status(JobStatus.STARTED)
    job.save()
    report = reap_stale_runs(as_of=later(120))
    assert (str(agent_run.pk) in report.decisions) is redispatched


def test_a_group_reap_checks_each_runs_own_token():
    """Runs with the same decision are reaped in one UPDATE, still guarded run by
    run: one re-claimed meanwhile (a new token, its lease as expired) is left alone."""
    reclaimed, stale = stale_run(), stale_run()
    seen = [
        Reaping(
            StaleLease(str(run.pk), run.lease_token, requeue_count=run.requeue_count),
            {"kind": "reaper", "result": {"decision": "requeued", "n": i}},
        )
        for i, run in enumerate((reclaimed, stale))
    ]
    AgentRun.objects.filter(pk=reclaimed.pk).update(lease_token=F("lease_token") + 1)
    assert transitions.reap_requeue(seen, later(120)) == [(str(stale.pk), 1)]
    reclaimed.refresh_from_db()
    stale.refresh_from_db()
    assert (reclaimed.status, stale.status) == ("running", "queued")
    assert stale.steps.get(kind="reaper").result["n"] == 1
    assert not reclaimed.steps.filter(kind="reaper").exists()
