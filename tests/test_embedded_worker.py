"""The embedded worker's pass (``runs.workers.embedded``), in-process: what
``manage.py embedded_worker`` executes, in which order, and that nothing
executes nested in it. Its processes on SQLite: ``test_embedded_default.py``."""

import pytest
from django.db.models import F
from django.db.models.functions import Now

from runs import transitions
from runs.approvals import actions as approval_actions
from runs.models import AgentRun, ApprovalRequest
from runs.queue.dispatch import executing_in_embedded_worker
from runs.runtime import enqueue
from runs.runtime.run_request import parse_run_request
from runs.transitions import db_time
from runs.workers.embedded import execute_due_runs
from tests.drifting_model import NOTIFY, request_for
from tests.helpers import answer, fresh, scripted
from tools.models import OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)


def queued(content: str) -> AgentRun:
    request = parse_run_request(scripted(answer(content))).as_json()
    return transitions.create_queued_run(request, "p")


def test_a_pass_executes_due_runs_oldest_first_and_leaves_a_run_not_yet_due():
    queued("newer")
    older, backing_off = queued("older"), queued("backing off")
    AgentRun.objects.filter(pk=older.pk).update(available_at=db_time(-60))
    AgentRun.objects.filter(pk=backing_off.pk).update(available_at=db_time(3600))
    with executing_in_embedded_worker():
        assert execute_due_runs(limit=10) == 2
    by_start = AgentRun.objects.filter(status="completed").order_by("started_at")
    assert list(by_start.values_list("output", flat=True)) == ["older", "newer"]
    assert AgentRun.objects.get(pk=backing_off.pk).status == "queued"


def test_a_pass_stops_at_its_batch_size():
    for index in range(3):
        queued(f"run {index}")
    with executing_in_embedded_worker():
        assert execute_due_runs(limit=2) == 2
    assert AgentRun.objects.filter(status="queued").count() == 1


def test_in_the_embedded_worker_a_retry_due_at_once_waits_for_the_next_look(settings):
    # No backoff: the retry is due at once. In the worker it is not executed
    # nested in the attempt that failed; the loop takes it as its next run.
    settings.NRLLM_RETRY_BACKOFF_SECONDS = 0
    agent_run = queued("unused")
    request = parse_run_request(
        scripted({"error": "server_error", "attempts": 1}, answer("second"))
    ).as_json()
    AgentRun.objects.filter(pk=agent_run.pk).update(request=request)
    with executing_in_embedded_worker():
        assert execute_due_runs(limit=10) == 2
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.output, agent_run.requeue_count) == (
        "completed",
        "second",
        1,
    )


def test_outside_the_embedded_worker_a_retry_waits_for_its_backoff(settings):
    settings.NRLLM_RETRY_BACKOFF_SECONDS = 30
    agent_run = enqueue(scripted({"error": "rate_limit", "attempts": 1}, answer()))
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.requeue_count) == ("queued", 1)
    assert AgentRun.objects.filter(pk=agent_run.pk, available_at__gt=Now()).exists()
    with executing_in_embedded_worker():
        assert execute_due_runs(limit=10) == 0  # not due yet
    AgentRun.objects.filter(pk=agent_run.pk).update(available_at=F("created_at"))
    with executing_in_embedded_worker():
        assert execute_due_runs(limit=10) == 1
    agent_run.refresh_from_db()
    assert agent_run.status == "completed"


def test_a_pass_leaves_a_waiting_run_alone_and_executes_it_once_approved(approvals, approver):
    # Approved where dispatch leaves runs to the loop (the worker's own
    # process): the run the decision releases is due at once, and the next
    # pass executes the approved call, once.
    agent_run = enqueue(
        request_for("scripted", [{"calls": [NOTIFY]}, {"answer": "sent"}], ["send_notification"])
    )
    assert fresh(agent_run).status == "waiting_for_approval"
    with executing_in_embedded_worker():
        assert execute_due_runs(limit=10) == 0
        approval = ApprovalRequest.objects.get(run=agent_run)
        assert approval_actions.approve(approval, approver, digest=approval.digest).ok
        assert fresh(agent_run).status == "queued"
        assert execute_due_runs(limit=10) == 1
    assert (fresh(agent_run).status, fresh(agent_run).output) == ("completed", "sent")
    (notification,) = OutboxNotification.objects.filter(run_id=agent_run.pk)
    assert notification.idempotency_key == approval.idempotency_key
