"""Calls waiting for approval, for the API's tests: a run that waits right
after ``enqueue`` (in-process, with the ``approvals`` fixture), and the
checks that a refused decision changed nothing."""

from rest_framework.test import APIClient

from runs.models import AgentRun, ApprovalRequest
from runs.models.vocabulary import ApprovalStatus, RunStatus
from runs.runtime import enqueue
from tests.drifting_model import NOTIFY, SEARCH, request_for
from tests.helpers import fresh
from tools.models import OutboxNotification

TOOLS = ["search_notes", "send_notification"]
#: A read, then a turn that reads and notifies at once, then the answer.
PLAN = [{"calls": [SEARCH]}, {"calls": [SEARCH, NOTIFY]}, {"answer": "sent (take {take})"}]


def client_with(header: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    return client


def waiting(model="scripted", plan=PLAN, **extra) -> tuple[AgentRun, ApprovalRequest]:
    """A run that waits for the approval of one call, and that call's request."""
    agent_run = enqueue(request_for(model, plan, TOOLS, **extra))
    (request,) = pending(agent_run)
    return fresh(agent_run), request


def pending(agent_run) -> list[ApprovalRequest]:
    return list(ApprovalRequest.objects.filter(run=agent_run, status=ApprovalStatus.PENDING))


def decide(client, request, action="approve", **body):
    body = {"digest": request.digest, **body}
    return client.post(f"/api/approvals/{request.pk}/{action}/", body, format="json")


def listed(client, query="") -> list[dict]:
    """The first page of ``GET /api/approvals/{query}``."""
    response = client.get(f"/api/approvals/{query}")
    assert response.status_code == 200, response.content[:300]
    return response.json()["results"]


def unchanged(agent_run, request) -> None:
    """Nothing of the decision happened: the run waits as it did, its
    request is pending, no write ran."""
    now = fresh(agent_run)
    assert (now.status, now.step_count) == (RunStatus.WAITING_FOR_APPROVAL, agent_run.step_count)
    assert pending(agent_run) == [request]
    assert OutboxNotification.objects.count() == 0
