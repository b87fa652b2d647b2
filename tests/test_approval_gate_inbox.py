"""The approvals inbox scoped to teams (G22 over G14): it lists the calls of
its viewer's teams only; for a visible call the viewer may not decide, or
may deny but not approve, the row says why in the gate's words instead of
the button; a crafted POST for another team's call is answered as one for
no call, and one the gate refuses for a visible call is a 403 page naming
the condition — the call still waits. In-process runs (a run waits right
after ``enqueue``), the Django test client, real PostgreSQL."""

import html
import threading

import psycopg
import pytest
from django.contrib.admin.models import LogEntry
from django.core.cache import cache
from django.db import connection
from django.test import Client

from runs.approvals.actions import approve
from runs.models import ApprovalRequest
from runs.models.vocabulary import ApprovalStatus, RunStatus
from runs.runtime import enqueue
from teams.models import Team
from tests.approval_requests import pending
from tests.drifting_model import NOTIFY, request_for
from tests.helpers import fresh, wait_until
from tools.models import OutboxNotification

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals")]

INBOX = "/admin/runs/agentrun/approvals/"
TOOLS = ["search_notes", "send_notification"]
ONE_CALL = [{"calls": [NOTIFY]}, {"answer": "sent"}]


@pytest.fixture(autouse=True)
def fresh_throttle():
    cache.clear()


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def waiting_in(team, prompt):
    agent_run = enqueue(request_for("scripted", ONE_CALL, TOOLS, prompt=prompt), team=team)
    (request,) = pending(agent_run)
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    return agent_run, request


def the_call(page: str, request) -> str:
    """The inbox's block of one call (up to the next call or the end)."""
    start = page.index(f'id="approval-{request.pk}"')
    end = page.find('class="approval-call"', start)
    return page[start : end if end != -1 else len(page)]


def post(client, request, decision):
    return client.post(
        f"{INBOX}{request.pk}/decide/", {"decision": decision, "digest": request.digest}
    )


def still_waits(agent_run, request) -> None:
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.PENDING
    assert OutboxNotification.objects.count() == 0
    assert LogEntry.objects.count() == 0


def test_the_inbox_lists_its_viewers_teams_and_says_why_a_call_cannot_be_decided(two_teams, member):
    alpha, bravo = two_teams
    alpha_run, alpha_call = waiting_in(alpha, "ALPHA-CANARY announce")
    bravo_run, bravo_call = waiting_in(bravo, "BRAVO-CANARY announce")
    viewer = member("vera", alpha, "viewer")
    approver_only = member("april", alpha, "approver")
    full = member("fred", alpha, "runner", "approver")

    pages = {user.username: browser(user).get(INBOX) for user in (viewer, approver_only, full)}
    for response in pages.values():
        assert response.status_code == 200
        page = response.content.decode()
        assert "ALPHA-CANARY" in page and "BRAVO-CANARY" not in page
        assert f"approval-{bravo_call.pk}" not in page
        assert "Waiting for a decision (1)" in page

    looker = html.unescape(the_call(pages["vera"].content.decode(), alpha_call))
    assert "You may look but not decide: you are an approver in no team" in looker
    assert "deny-button" not in looker and "approve-button" not in looker
    denier = html.unescape(the_call(pages["april"].content.decode(), alpha_call))
    assert "you are not a runner in team 'alpha'" in denier
    assert "deny-button" in denier and "approve-button" not in denier
    deciding = the_call(pages["fred"].content.decode(), alpha_call)
    assert "deny-button" in deciding and "approve-button" in deciding

    # The tool taken from the team: its runner-approver may deny, not approve.
    Team.objects.filter(pk=alpha.pk).update(tools=["search_notes"])
    page = html.unescape(browser(full).get(INBOX).content.decode())
    call = the_call(page, alpha_call)
    assert "team 'alpha' may not use the tool 'send_notification' now" in call
    assert "approve-button" not in call
    still_waits(alpha_run, alpha_call)
    still_waits(bravo_run, bravo_call)


def test_a_crafted_decision_is_refused_by_the_gate_and_another_teams_call_is_not_found(
    two_teams, member
):
    alpha, bravo = two_teams
    agent_run, request = waiting_in(alpha, "announce")
    approver_only = browser(member("april", alpha, "approver"))
    bravo_all = browser(member("bruno", bravo))

    refused = post(approver_only, request, "approve")
    assert refused.status_code == 403
    assert "you are not a runner in team 'alpha'" in html.unescape(refused.content.decode())
    still_waits(agent_run, request)

    for decision in ("approve", "deny"):
        # Another team's call is answered as no call at all: nothing tells it exists.
        unknown = bravo_all.post(
            f"{INBOX}999999/decide/", {"decision": decision, "digest": request.digest}
        )
        other = post(bravo_all, request, decision)
        assert (other.status_code, other["Location"]) == (unknown.status_code, unknown["Location"])
        followed = bravo_all.get(other["Location"]).content.decode()
        assert "There is no such approval request." in followed
        assert str(agent_run.pk) not in followed
    still_waits(agent_run, request)

    # Deny needs only the approver role in the run's team.
    denied = post(approver_only, request, "deny")
    assert denied.status_code == 302
    assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.DENIED
    assert OutboxNotification.objects.count() == 0


def test_a_tool_taken_from_the_team_while_an_approval_is_judged_is_seen(two_teams, member):
    """A team admin takes the tool away while an approval of its call is on
    its way: the approval, judged again under the team's lock, waits for
    the admin's commit and is then refused; the call still waits."""
    alpha, _ = two_teams
    amy = member("amy", alpha, "approver", "runner")
    agent_run, request = waiting_in(alpha, "notify on a team about to lose the tool")
    admin_session = psycopg.connect(_database_url(), autocommit=False)
    try:
        # The team admin's save, not yet committed: the tool is gone from it.
        admin_session.execute(
            "UPDATE teams_team SET tools = %s WHERE id = %s", ['["search_notes"]', alpha.pk]
        )
        decided = {}

        def approving_it():
            try:
                call = ApprovalRequest.objects.get(pk=request.pk)
                decided["result"] = approve(call, amy, digest=request.digest)
            finally:
                connection.close()  # the thread's own

        approving = threading.Thread(target=approving_it)
        approving.start()
        wait_until(
            lambda: _waiting_on_a_lock() >= 1 or not approving.is_alive(),
            what="the approval to wait for the team's row",
        )
        assert approving.is_alive(), decided  # it waited: judged under the lock
        admin_session.commit()
        approving.join(timeout=30)
    finally:
        admin_session.close()
    assert decided["result"].code == "tool_not_in_team", decided
    still_waits(agent_run, request)


def _waiting_on_a_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


def _database_url() -> str:
    settings = connection.settings_dict
    return (
        f"postgresql://{settings['USER']}:{settings['PASSWORD']}@{settings['HOST']}:"
        f"{settings['PORT']}/{settings['NAME']}"
    )
