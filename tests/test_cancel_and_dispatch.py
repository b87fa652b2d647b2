"""A cancel wins over every way back into the queue (G9); the reaper acts only
on what it saw (G7); a job id is never used twice for a run, and a dispatch
that cannot reach Redis never strands a run (G4). Against real rqworkers,
PostgreSQL and Redis — one test stops and restarts a redis-server of its own
(``own_redis``)."""

import psutil
import pytest
from django.db import DatabaseError
from django.utils import timezone
from rq.job import Job

from runs import transitions
from runs.models import AgentRun, DeadLetter
from runs.models.faults import step_inserts_refused
from runs.operators import actions as operator_actions
from runs.queue.dispatch import job_id_for, run_queue
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from runs.transitions import Reaping, StaleLease
from tests.drifting_model import MODELS, SEARCH, request_for
from tests.fake_openai import error
from tests.helpers import answer, fresh, later, scripted, stored, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def failing_first_turn(model, failure_class: str, status: int, *, delay: float = 3):
    """A run whose first model call takes a while and then fails with
    ``failure_class`` (scripted) or HTTP ``status`` (drifting)."""
    plan = [{"calls": [SEARCH]}, {"answer": "Done (take {take})."}]
    if model is None:
        failure = {"error": failure_class, "attempts": 1, "delay_seconds": delay}
        return request_for("scripted", plan, ["search_notes"], scripted_before={0: failure})
    model.hold_turn(0)
    model.fail_turn(0, error(status))
    return request_for("drifting", plan, ["search_notes"])


def cancel_while_the_model_call_is_in_flight(model, agent_run, operator):
    if model is None:
        wait_until(lambda: fresh(agent_run).status == "running", what="the attempt")
    else:
        assert model.held.wait(timeout=30)
    result = operator_actions.cancel(fresh(agent_run), operator, "stop it")
    assert (result.ok, result.code) == (True, "requested")
    if model is not None:
        model.release.set()


# --- G9: a cancel wins ----------------------------------------------------------


@pytest.mark.worker
@pytest.mark.parametrize("model", MODELS, indirect=True)
@pytest.mark.parametrize(
    ("failure_class", "status"), [("rate_limit", 429), ("auth", 401)], ids=["retryable", "not"]
)
def test_a_cancel_accepted_during_a_failing_model_call_ends_the_run_cancelled(
    model, workers, operator, failure_class, status
):
    agent_run = enqueue(failing_first_turn(model, failure_class, status))
    worker = workers.start(burst=True, with_scheduler=True, NRLLM_RETRY_BACKOFF_SECONDS=1)
    cancel_while_the_model_call_is_in_flight(model, agent_run, operator)
    worker.communicate(timeout=60)
    ended = fresh(agent_run)
    # Not requeued (nor dead-lettered) first and cancelled on a later attempt:
    # the model is never called again.
    assert (ended.status, ended.termination_reason) == ("cancelled", "cancelled")
    assert (ended.lease_token, ended.requeue_count) == (1, 0)
    assert ended.failure_class == failure_class  # what the attempt ended on
    assert not DeadLetter.objects.filter(run=ended).exists()
    assert run_queue().count == 0 and run_queue().scheduled_job_registry.count == 0
    if model is not None:
        assert model.requests_by_turn[0] == 1


def stale_run(*, fence="", call=None):
    """A running run whose worker died, as the reaper sees it."""
    agent_run = transitions.create_queued_run(stored(scripted(answer())), "p")
    lease = transitions.claim(agent_run.pk, "dead-worker", 60).lease
    if fence:
        assert transitions.renew_lease(lease, 60, fence=fence, call=call)
    return fresh(agent_run), lease


def seen(agent_run) -> list[Reaping]:
    """What a reaper pass read of ``agent_run`` before deciding."""
    return [
        Reaping(
            StaleLease(
                str(agent_run.pk),
                agent_run.lease_token,
                pending_effect=agent_run.pending_effect,
                pending_call=agent_run.pending_call,
                cancel_requested=agent_run.cancel_requested_at is not None,
                requeue_count=agent_run.requeue_count,
            ),
            {"kind": "reaper", "result": {"decision": "requeued"}},
        )
    ]


def test_a_cancel_requested_after_the_reaper_looked_wins_over_its_requeue():
    agent_run, _ = stale_run()
    reapings = seen(agent_run)
    assert transitions.cancel(agent_run.pk) is transitions.CancelOutcome.REQUESTED
    assert transitions.reap_requeue(reapings, later()) == []
    assert fresh(agent_run).status == "running"
    # The pass decides again on what the run is now.
    reap_stale_runs(as_of=later())
    assert fresh(agent_run).status == "cancelled"


# --- G7: the reaper acts only on what it saw ----------------------------------


CALL = {"tool": "upsert_note", "arguments": {"slug": "s", "body": "b"}, "idempotency_key": "k"}


@pytest.mark.parametrize(
    "change",
    ["fence stamped", "audit failure marked", "fence withdrawn"],
)
def test_a_fence_that_changed_after_the_reaper_looked_is_never_cleared_by_its_requeue(change):
    if change == "fence stamped":
        agent_run, lease = stale_run()
    else:
        agent_run, lease = stale_run(fence="idempotent_write", call=CALL)
    reapings = seen(agent_run)
    run_row = AgentRun.objects.filter(pk=agent_run.pk)
    if change == "fence stamped":
        # A non-idempotent write started since (its renewal is what the
        # reaper's clock, an hour ahead, still sees as expired).
        run_row.update(pending_effect="non_idempotent_write", pending_call=CALL)
    elif change == "audit failure marked":
        assert transitions.mark_audit_failed(lease, CALL)
    else:
        assert transitions.withdraw_fence(lease, "k")
    before = fresh(agent_run)
    assert transitions.reap_requeue(reapings, later()) == []
    after = fresh(agent_run)
    assert (after.status, after.pending_effect, after.pending_call) == (
        "running",
        before.pending_effect,
        before.pending_call,
    )


def test_a_redispatch_re_checks_the_job_and_the_due_time_it_decided_on(settings):
    settings.NRLLM_REDISPATCH_AFTER_SECONDS = 60
    agent_run = transitions.create_queued_run(stored(scripted(answer())), "p")
    cutoff = later(60)
    step = {"kind": "reaper", "result": {"decision": "redispatched"}}
    # Due again later than the reaper's cutoff (a retry backing off, say).
    AgentRun.objects.filter(pk=agent_run.pk).update(available_at=later(7200))
    assert (
        transitions.note_redispatch(agent_run.pk, seen_dispatch=0, due_before=cutoff, step=step)
        is None
    )
    # Queued again since (another job) but due: not the job the reaper missed.
    AgentRun.objects.filter(pk=agent_run.pk).update(available_at=timezone.now(), dispatch_count=1)
    assert (
        transitions.note_redispatch(agent_run.pk, seen_dispatch=0, due_before=cutoff, step=step)
        is None
    )
    assert (
        transitions.note_redispatch(agent_run.pk, seen_dispatch=1, due_before=cutoff, step=step)
        == 2
    )
    assert fresh(agent_run).steps.filter(kind="reaper").count() == 1
    # A queued run with a cancel pending (requeued before retries checked
    # for one) is ended, not dispatched again.
    AgentRun.objects.filter(pk=agent_run.pk).update(
        available_at=later(-7200), cancel_requested_at=timezone.now()
    )
    assert (
        transitions.note_redispatch(agent_run.pk, seen_dispatch=2, due_before=cutoff, step=step)
        is None
    )
    assert fresh(agent_run).status == "cancelled"


# --- G4: job ids never repeat; Redis away never strands a run --------------------


@pytest.mark.worker
def test_an_operator_requeue_dispatches_a_job_under_an_id_never_used_for_the_run(
    workers, queue, operator
):
    failing = {"error": "auth", "attempts": 1}
    agent_run = enqueue(
        request_for("scripted", [{"answer": "ok"}], [], scripted_before={0: failing})
    )
    first = job_id_for(agent_run.pk, 0)
    workers.run_burst()
    assert fresh(agent_run).termination_reason == "not_retryable"
    # RQ keeps the finished job, with an expiry.
    assert queue.connection.ttl(Job.key_for(first)) > 0

    assert operator_actions.requeue(fresh(agent_run), operator, "once more").ok
    [job_id] = queue.get_job_ids()
    assert job_id == job_id_for(agent_run.pk, 1) != first
    assert queue.connection.ttl(Job.key_for(job_id)) == -1  # nothing will expire it
    workers.run_burst()
    assert fresh(agent_run).status == "completed"


@pytest.mark.worker
@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_run_whose_retry_could_not_be_dispatched_while_redis_was_down_completes(
    model, workers, own_redis, settings
):
    settings.NRLLM_REDISPATCH_AFTER_SECONDS = 1
    agent_run = enqueue(failing_first_turn(model, "rate_limit", 429))
    # The forking worker: its horse's end says the dispatch was tried.
    worker = workers.start(
        burst=True,
        with_scheduler=True,
        REDIS_URL=settings.REDIS_URL,
        NRLLM_RETRY_BACKOFF_SECONDS=1,
        NRLLM_WORKER_CLASS="runs.worker.Worker",
    )
    if model is None:
        wait_until(lambda: fresh(agent_run).status == "running", what="the attempt")
        own_redis.stop()
    else:
        assert model.held.wait(timeout=30)
        own_redis.stop()
        model.release.set()
    # The attempt fails, and its retry cannot be dispatched: once the work
    # horse is done (its dispatch tried), the run waits, queued.
    wait_until(lambda: fresh(agent_run).status != "running", timeout=30, what="the failure")
    wait_until(lambda: not psutil.Process(worker.pid).children(), timeout=30, what="the horse")
    waiting = fresh(agent_run)
    assert (waiting.status, waiting.requeue_count) == ("queued", 1), waiting.error_message
    workers.kill(worker)  # it lost its Redis

    own_redis.start()  # empty: whatever it held is gone
    # A reaper pass after the retry's due time and the redispatch threshold.
    report = reap_stale_runs(as_of=later(60))
    assert report.decisions == {str(agent_run.pk): "redispatched: no job in Redis"}
    workers.run_burst(REDIS_URL=settings.REDIS_URL)
    done = fresh(agent_run)
    assert (done.status, done.lease_token) == ("completed", 2)
    if model is not None:
        assert model.requests_by_turn[0] == 2 and model.requests_by_turn[1] == 1


# --- G11: the cancel and its operator step commit together -----------------------


def test_a_cancel_whose_operator_step_is_refused_does_not_happen(operator, api):
    agent_run = transitions.create_queued_run(stored(scripted(answer())), "p")
    with step_inserts_refused(kind="operator"):
        with pytest.raises(DatabaseError):
            operator_actions.cancel(fresh(agent_run), operator, "stop")
        response = api.post(f"/api/runs/{agent_run.pk}/cancel/", {"note": "stop"}, format="json")
        assert response.status_code == 503, response.content
    unchanged = fresh(agent_run)
    assert (unchanged.status, unchanged.cancel_requested_at) == ("queued", None)
    assert not unchanged.steps.exists()
