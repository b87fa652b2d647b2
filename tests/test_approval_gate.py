"""G14 bound to the approver's right to write (G22), through the API, with
real rqworker processes and both the scripted and the drifting model: a
run of team Alpha parks on a write; an approver who is not a runner there,
one whose team may not use the tool, and a member of another team are
refused (403 naming which condition failed, or 404) and the call still
waits; once the team may use the tool again, a runner and approver of Alpha
approves and the write executes exactly once."""

import pytest
from django.core.cache import cache

from runs.models import ApprovalRequest
from runs.models.vocabulary import ApprovalStatus, RunStatus
from runs.runtime import enqueue
from teams.models import Team
from tests.approval_requests import client_with, decide, listed
from tests.drifting_model import NOTIFY, SEARCH, request_for
from tests.helpers import fresh
from tools.models import OutboxNotification

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals")]

TOOLS = ["search_notes", "send_notification"]
PLAN = [{"calls": [SEARCH]}, {"calls": [NOTIFY]}, {"answer": "sent (take {take})"}]


@pytest.fixture(autouse=True)
def fresh_throttle():
    cache.clear()


def still_waits(agent_run, request) -> None:
    """Nothing of a refused decision happened: the call is pending, the run
    waits for it, no write ran."""
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.PENDING
    assert OutboxNotification.objects.count() == 0


def refused(client, request, action="approve"):
    """The (status, code, detail) of a decision's answer."""
    response = decide(client, request, action)
    body = response.json()
    return response.status_code, body.get("code"), body.get("detail", "")


@pytest.mark.worker
@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_only_a_runner_and_approver_of_the_team_may_release_its_write_and_it_runs_once(
    model, queue, workers, two_teams, member, api_token
):
    alpha, bravo = two_teams
    client_of = {
        name: client_with(api_token(member(name, team, *roles)))
        for name, team, roles in [
            ("approver_only", alpha, ("approver",)),
            ("runner_only", alpha, ("runner",)),
            ("looks_in_alpha", alpha, ("viewer",)),
            ("full", alpha, ("runner", "approver")),
            ("bravo_all", bravo, ()),
        ]
    }
    # Approver in Bravo and only viewer in Alpha: sees the call, may not decide it.
    member("looks_in_alpha", bravo, "approver")
    agent_run = enqueue(
        request_for("scripted" if model is None else "drifting", PLAN, TOOLS), team=alpha
    )
    workers.run_burst()
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    (request,) = ApprovalRequest.objects.filter(run=agent_run)

    # (i) Not a runner, or not an approver, in the run's team: 403 naming it.
    status, code, detail = refused(client_of["approver_only"], request)
    assert (status, code) == (403, "not_runner")
    assert "not a runner in team 'alpha'" in detail
    status, code, detail = refused(client_of["looks_in_alpha"], request)
    assert (status, code) == (403, "not_approver")
    assert "not an approver in team 'alpha'" in detail
    assert refused(client_of["looks_in_alpha"], request, "deny")[:2] == (403, "not_approver")
    # Approver in no team at all: the endpoint itself is closed to them.
    assert refused(client_of["runner_only"], request)[0] == 403
    still_waits(agent_run, request)

    # (ii) The team may no longer use the tool: even its runner-approver
    # may not release the write, and is told so.
    Team.objects.filter(pk=alpha.pk).update(tools=["search_notes"])
    status, code, detail = refused(client_of["full"], request)
    assert (status, code) == (403, "tool_not_in_team")
    assert "'send_notification'" in detail and "team 'alpha'" in detail
    still_waits(agent_run, request)

    # (iii) Another team's call: not listed, and a 404 as an unknown one.
    bravo_client = client_of["bravo_all"]
    assert bravo_client.get(f"/api/approvals/{request.pk}/").status_code == 404
    for action in ("approve", "deny"):
        status, code, _ = refused(bravo_client, request, action)
        assert status == 404, code
    assert listed(bravo_client, "?status=pending") == []
    assert [row["id"] for row in listed(client_of["approver_only"], "?status=pending")] == [
        request.pk
    ]
    still_waits(agent_run, request)

    # (iv) The tool given back: the runner-approver releases the write.
    Team.objects.filter(pk=alpha.pk).update(tools=None)
    response = decide(client_of["full"], request, note="mine to make")
    assert response.status_code == 200, response.content
    assert response.json()["approval"]["decided_by"] == "full"
    workers.run_burst()

    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    (notification,) = OutboxNotification.objects.all()
    assert notification.idempotency_key == request.idempotency_key
    assert notification.message == request.arguments["message"]
    again = decide(client_of["full"], request)
    assert (again.status_code, again.json()["code"]) == (409, "already_decided")
    assert OutboxNotification.objects.count() == 1
    if model is not None:
        # The write executed is the one approved: the model was not asked again.
        assert model.requests_by_turn[1] == 1, model.requests_by_turn
