"""What a webhook's receiver does reaches no other run (G19, G14, G15): a
receiver that holds its answer holds none of the worker's database
connections meanwhile.

The receiver is a real local HTTP server (``tests.webhook_receiver``), the
worker a real ``rqworker`` process with the concurrent worker and a small
connection pool."""

import signal

import pytest

from runs import transitions
from runs.models import RunEvent
from runs.operators import actions as operator_actions
from runs.runtime import enqueue
from runs.vocabulary import RunStatus
from tests.drifting_model import NOTIFY, request_for
from tests.helpers import fresh, scripted, stored, wait_until
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)

ONE_CALL = [{"calls": [NOTIFY]}, {"answer": "sent"}]
#: The worker holds runs in threads, and a pool of four connections.
SMALL_POOL = {
    "NRLLM_WORKER_CLASS": "runs.worker.ConcurrentWorker",
    "NRLLM_WORKER_CONCURRENCY": 8,
    "DATABASE_POOL_MAX_SIZE": 4,
    "DATABASE_POOL_TIMEOUT_SECONDS": 2,
}


@pytest.fixture
def receiver(settings):
    receiver = Receiver()
    settings.NRLLM_HTTP_ALLOWED_HOSTS = [f"127.0.0.1:{receiver.port}"]
    receiver.start()
    yield receiver
    receiver.stop()


@pytest.mark.worker
def test_receivers_holding_their_answers_keep_no_connection_from_a_plain_run(
    receiver, settings, queue, workers, approvals, operator
):
    """Four POSTs held by the receiver — two runs' enders, an approval
    webhook after a park, and the reaper's delivery in a job of the same
    worker — with a pool of four: a plain run is claimed and completes
    while they wait. Each POST held its connection before: the plain run's
    claim found the pool empty and it stayed queued."""
    receiver.holding = 4
    worker = workers.start(
        **SMALL_POOL,
        NRLLM_RUN_WEBHOOK_TIMEOUT_SECONDS=60,
        NRLLM_APPROVAL_WEBHOOK_URL=receiver.url("/hooks/approvals"),
        NRLLM_APPROVAL_WEBHOOK_TIMEOUT_SECONDS=60,
    )
    webhook = {"webhook": receiver.url()}
    ended = [enqueue({**scripted({"content": f"done {i}"}), **webhook}) for i in range(2)]
    assert receiver.wait_held(2), "the runs' enders never posted"
    parked = enqueue(request_for("scripted", ONE_CALL, ["send_notification"]))
    assert receiver.wait_held(3), "the approval webhook never posted"
    # An event only the reaper delivers: an operator's cancel of a queued run.
    cancelled = transitions.create_queued_run(stored({**scripted({"content": "x"}), **webhook}), "")
    assert operator_actions.cancel(fresh(cancelled), operator, "not needed").ok
    queue.enqueue("runs.jobs.reap_job")
    assert receiver.wait_held(4), "the reaper never posted"

    plain = enqueue(scripted({"content": "plain"}))

    wait_until(lambda: fresh(plain).status == RunStatus.COMPLETED, timeout=60, what="the plain run")
    assert receiver.held == 4 and not receiver.release.is_set()
    assert fresh(parked).status == RunStatus.WAITING_FOR_APPROVAL
    receiver.release.set()
    # Answered at last, each attempt is recorded on a connection it gets back.
    wait_until(
        lambda: RunEvent.objects.filter(delivered_at__isnull=False).count() == 3,
        timeout=60,
        what="the held events delivered",
    )
    assert {event.run_id for event in RunEvent.objects.all()} == {
        *(run.pk for run in ended),
        cancelled.pk,
    }
    workers.signal(worker, signal.SIGTERM)
    output, _ = worker.communicate(timeout=60)
    assert b"couldn't get a connection" not in output
