"""G4 and G5: the claim decides, the lease is renewed, a lost lease stops the worker."""

import threading

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs import transitions
from runs.models import AgentRun
from runs.runtime import enqueue, run_queued
from runs.runtime.step_ledger import UNFLUSHED_STEPS_KEPT
from runs.transitions import Lease, RecordOutcome
from runs.transitions.step_journal import COMMIT_WITHOUT_FLUSH
from tests.helpers import answer, call, scripted, stored, wait_until
from tools.models import OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)


def queued_run(request=None):
    return transitions.create_queued_run(request or scripted(answer()), "p")


def test_of_eight_concurrent_claims_exactly_one_wins():
    agent_run = queued_run()
    barrier = threading.Barrier(8)
    leases = []

    def contender(index):
        try:
            barrier.wait()
            claimed = transitions.claim(agent_run.pk, f"worker-{index}", 60)
            leases.append(claimed and claimed.lease)
        finally:
            connection.close()

    threads = [threading.Thread(target=contender, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [lease for lease in leases if lease is not None]
    assert len(leases) == 8 and len(winners) == 1
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.lease_owner, agent_run.lease_token) == (
        "running",
        winners[0].owner,
        1,
    )


def test_every_claim_grows_the_lease_token():
    agent_run = queued_run()
    first = transitions.claim(agent_run.pk, "a", 60).lease
    assert transitions.requeue_for_retry(
        first, failure_class="connection", error_type="E", error_message=""
    )
    second = transitions.claim(agent_run.pk, "b", 60).lease
    assert (first.token, second.token) == (1, 2)
    # The first attempt's lease matches nothing any more.
    assert not transitions.heartbeat(first, 60)
    step = {"kind": "llm"}
    assert transitions.record_step(first, 60, step, clear_fence=False) is RecordOutcome.LEASE_LOST
    assert transitions.record_step(second, 60, step, clear_fence=False) is RecordOutcome.PERSISTED


def _synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return cursor.fetchone()[0]


def test_a_claim_and_a_model_turns_record_skip_the_flush_only_for_their_own_commit():
    """The claim's commit and a model turn's record do not wait for the WAL
    flush (runs/transitions/step_journal.py). Inside a caller's transaction they must not
    make the caller's commit skip it."""
    lease = transitions.claim(queued_run().pk, "alone", 60).lease
    assert transitions.record_step(lease, 60, {"kind": "llm"}, clear_fence=False).persisted
    assert _synchronous_commit() == "on"
    with transaction.atomic():
        lease = transitions.claim(queued_run().pk, "inside", 60).lease
        assert _synchronous_commit() == "on"
        assert transitions.record_step(lease, 60, {"kind": "llm"}, clear_fence=False).persisted
        assert _synchronous_commit() == "on"


def test_a_stale_job_for_a_run_already_taken_does_nothing():
    agent_run = queued_run(
        scripted(call("send_notification", recipient="a", message="b"), answer())
    )
    lease = transitions.claim(agent_run.pk, "someone-else", 60).lease
    run_queued(agent_run.pk)
    agent_run.refresh_from_db()
    assert (agent_run.lease_owner, agent_run.lease_token, agent_run.step_count) == (
        lease.owner,
        1,
        1,  # the first claim's request step, and nothing from the stale job
    )
    assert OutboxNotification.objects.count() == 0


def test_a_job_that_comes_before_a_retrys_backoff_ends_claims_nothing():
    """A duplicate or stale job of a run waiting out its retry's backoff
    finds it not due (the database's clock) and does nothing; once due, the
    run is claimed and goes on (G4, G8)."""
    agent_run = queued_run(
        stored(
            scripted(
                call("send_notification", recipient="a", message="b"),
                answer(),
                tools=["send_notification"],
            )
        )
    )
    lease = transitions.claim(agent_run.pk, "w", 60).lease
    details = {"failure_class": "rate_limit", "error_type": "E", "error_message": "429"}
    assert transitions.requeue_for_retry(lease, **details, delay_seconds=300) is not None

    run_queued(agent_run.pk)

    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.lease_token, agent_run.step_count) == ("queued", 1, 1)
    assert OutboxNotification.objects.count() == 0
    AgentRun.objects.filter(pk=agent_run.pk).update(available_at=timezone.now())
    run_queued(agent_run.pk)
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.lease_token) == ("completed", 2)
    assert OutboxNotification.objects.count() == 1


def test_the_lease_is_renewed_at_every_step_boundary():
    agent_run = queued_run()
    lease = transitions.claim(agent_run.pk, "w", 1).lease
    AgentRun.objects.filter(pk=agent_run.pk).update(lease_expires_at="2000-01-01T00:00:00Z")
    assert transitions.record_step(lease, 600, {"kind": "llm"}, clear_fence=False).persisted
    agent_run.refresh_from_db()
    assert agent_run.lease_expires_at.year > 2000


@pytest.mark.worker
def test_a_worker_whose_lease_was_taken_stops_records_nothing_and_settles_nothing(workers):
    agent_run = enqueue(
        scripted(
            call("search_notes", query="x"),
            {**call("send_notification", recipient="a", message="b"), "delay_seconds": 2},
            answer(),
            tools=["search_notes", "send_notification"],
        )
    )
    worker = workers.start(burst=True)
    # request, llm, tool: the worker is now waiting on the slow second turn.
    wait_until(lambda: AgentRun.objects.get(pk=agent_run.pk).step_count >= 3, what="3 steps")
    # Another worker takes the run over (as after a reap and a re-claim).
    AgentRun.objects.filter(pk=agent_run.pk).update(
        lease_owner="thief", lease_token=2, lease_expires_at="2999-01-01T00:00:00Z"
    )
    worker.communicate(timeout=30)

    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.lease_owner, agent_run.lease_token) == (
        "running",
        "thief",
        2,
    )
    assert agent_run.step_count == 3 and agent_run.steps.count() == 3
    assert agent_run.termination_reason == "" and agent_run.finished_at is None
    assert OutboxNotification.objects.count() == 0


@pytest.mark.worker
def test_a_duplicate_rq_job_executes_nothing_twice(workers, queue):
    agent_run = enqueue(
        scripted(
            call("send_notification", recipient="a", message="b"),
            answer(),
            tools=["send_notification"],
        )
    )
    # The same wake-up delivered twice (a client retry, a re-dispatch).
    queue.enqueue("runs.jobs.execute_run_job", str(agent_run.pk))
    assert queue.count == 2
    output = workers.run_burst()
    agent_run.refresh_from_db()
    assert agent_run.status == "completed" and agent_run.lease_token == 1
    assert OutboxNotification.objects.count() == 1
    assert agent_run.steps.filter(kind="tool").count() == 1
    assert "not claimable" in output


def test_lease_identity_is_owner_and_token():
    agent_run = queued_run()
    lease = transitions.claim(agent_run.pk, "w", 60).lease
    assert not transitions.heartbeat(Lease(lease.run_id, "other", lease.token), 60)
    assert not transitions.heartbeat(Lease(lease.run_id, lease.owner, lease.token + 1), 60)
    assert transitions.heartbeat(lease, 60)


def test_a_run_of_reads_waits_for_the_flush_at_least_every_32_steps():
    """Model turns and reads do not wait for the WAL flush, and the attempt
    keeps them to write again should a server crash lose them: at most
    ``UNFLUSHED_STEPS_KEPT``, so a long run of reads waits now and then."""
    reads = [call("search_notes", query=str(index)) for index in range(40)]
    agent_run = queued_run(scripted(*reads, answer(), tools=["search_notes"], max_iterations=50))
    with CaptureQueriesContext(connection) as queries:
        run_queued(agent_run.pk)
    assert AgentRun.objects.get(pk=agent_run.pk).status == "completed"
    records = [query["sql"] for query in queries if "INSERT INTO runs_runstep" in query["sql"]]
    waiting = [index for index, sql in enumerate(records) if COMMIT_WITHOUT_FLUSH not in sql]
    assert len(records) == 82  # the claim, 40 turns and their reads, the answer
    assert waiting[-1] == len(records) - 1  # the settle
    # The claim's and 32 more go unflushed; the next record waits, and so on.
    assert UNFLUSHED_STEPS_KEPT == 32
    assert waiting == [33, 66, 81], waiting
