"""The console scoped to its user's teams (G22), as a member uses it: a
member holding every role in Alpha sees nothing of Bravo anywhere in the
console — lists, overview figures, header count, run page, live poll,
actions, a bulk "all matching" preview, the start form — and acts on
Alpha's runs; a viewer there sees them but is refused an action with a
403 naming the role; a team admin keeps Alpha's members and tools; the
queue dashboard, every team's jobs at once, is platform staff's."""

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client

from agents.models import Agent
from agents.versions import save_agent
from runs.models import AgentRun, ApprovalRequest, DeadLetter
from runs.models.vocabulary import ApprovalStatus, DeadLetterReason, RunStatus
from runs.runtime import enqueue, run_queued
from spend.models import TeamBudget
from teams.models import Membership
from tests.approval_requests import PLAN, TOOLS
from tests.drifting_model import request_for
from tests.helpers import fresh

pytestmark = pytest.mark.django_db

RUNS = "/admin/runs/agentrun/"


@pytest.fixture
def world(two_teams, member, approvals):
    """Alpha and Bravo, each with an agent, a run waiting for a call's
    approval and a dead-lettered run; and Amy, every role in Alpha only."""
    alpha, bravo = two_teams
    amy = member("amy", alpha)
    bob = member("bob", bravo)
    world = {"alpha_team": alpha, "bravo_team": bravo, "amy": amy}
    for key, team, who in (("alpha", alpha, amy), ("bravo", bravo, bob)):
        agent, _, _ = save_agent(
            f"agent-{key}",
            {"provider": request_for("scripted", PLAN, TOOLS)["provider"], "tools": TOOLS},
            user=who,
            create=True,
            team=team,
        )
        waiting = enqueue(
            request_for("scripted", PLAN, TOOLS, prompt=f"prompt-{key}"),
            submitted_by=who,
            team=team,
        )
        ended = enqueue(
            request_for("scripted", [{"answer": "done"}], [], prompt=f"ended-{key}"),
            submitted_by=who,
            team=team,
        )
        run_queued(waiting.pk)  # to its call's approval
        run_queued(ended.pk)
        DeadLetter.objects.create(
            run=ended, reason=DeadLetterReason.WRITE_INTERRUPTED, error_message=key
        )
        world[key] = {"agent": agent, "run": fresh(waiting), "ended": fresh(ended)}
    assert fresh(world["bravo"]["run"]).status == RunStatus.WAITING_FOR_APPROVAL
    return world


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_member_of_alpha_sees_and_acts_on_nothing_of_bravo(world, settings):
    amy = client_of(world["amy"])
    alpha, bravo = world["alpha"]["run"], world["bravo"]["run"]

    # The lists: Alpha's runs, agents and versions; no team column for
    # a member of one team; the versions' agent filter lists Alpha's only.
    page = amy.get(RUNS)
    text = page.content.decode()
    assert "prompt-alpha" in text and "prompt-bravo" not in text
    assert "team_shown" not in page.context["cl"].list_display
    agents = amy.get("/admin/agents/agent/").content.decode()
    assert "agent-alpha" in agents and "agent-bravo" not in agents
    versions = amy.get("/admin/agents/agentversion/").content.decode()
    assert "agent-alpha" in versions and "agent-bravo" not in versions
    # A live poll is the same view: the same scope.
    polled = amy.get(RUNS, headers={"X-Nrllm-Live": "1"}).content.decode()
    assert "prompt-alpha" in polled and "prompt-bravo" not in polled
    # The search, by Bravo's whole run id: nothing.
    assert list(amy.get(RUNS, {"q": str(bravo.pk)}).context["cl"].result_list) == []

    # The overview's figures and the header count: Alpha's alone.
    index = amy.get("/admin/")
    assert index.context["waiting_for_approval"] == 1
    assert index.context["pending_approvals"] == 1
    assert index.context["open_dead_letters"] == 1
    assert index.context["charts"]["outcomes"]["total"] == 2
    assert index.context["spend"] is None  # spend rows carry no team yet
    assert ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING).count() == 2

    # Bravo's run page, live or not, is a run that does not exist.
    for headers in ({}, {"X-Nrllm-Live": "1"}):
        response = amy.get(f"{RUNS}{bravo.pk}/change/", headers=headers)
        assert response.status_code == 302 and response.url == "/admin/"
    assert amy.get(f"{RUNS}{alpha.pk}/change/").status_code == 200
    # The failed write audits: none of Bravo's.
    audits = [row["run"] for row in amy.get("/admin/runs/agentrun/write-audits/").context["rows"]]
    assert world["bravo"]["ended"] not in audits
    # Bravo's dead letter: not listed, its page not found.
    letter = DeadLetter.objects.get(run=world["bravo"]["ended"])
    assert amy.get(f"/admin/runs/deadletter/{letter.pk}/change/").status_code == 302

    # Its actions and its rerun page: 404, and nothing moves.
    for action in ("requeue", "cancel", "restart", "reconcile"):
        assert amy.post(f"{RUNS}{bravo.pk}/{action}/").status_code == 404, action
    assert amy.get(f"{RUNS}{world['bravo']['ended'].pk}/rerun-from/1/").status_code == 404
    assert fresh(bravo).status == RunStatus.WAITING_FOR_APPROVAL

    # "All matching" previews Alpha's runs only; a confirmation naming
    # Bravo's run (crafted) leaves it as it was.
    preview = amy.post(
        RUNS,
        {
            "action": "cancel_selected",
            "select_across": "1",
            "index": "0",
            "_selected_action": [str(alpha.pk)],
        },
    )
    previewed = {line.run.pk for line in preview.context["lines"]}
    assert previewed == {alpha.pk, world["alpha"]["ended"].pk}
    assert "prompt-bravo" not in preview.content.decode()
    confirmed = amy.post(
        RUNS,
        {
            "action": "cancel_selected",
            "confirm": "yes",
            "_selected_action": [str(alpha.pk), str(bravo.pk)],
        },
        follow=True,
    )
    said = " ".join(str(message) for message in confirmed.context["messages"])
    assert "not_found" in said or "refused 1" in said, said
    assert fresh(alpha).status == RunStatus.CANCELLED
    assert fresh(bravo).status == RunStatus.WAITING_FOR_APPROVAL

    # The start form: Alpha's agent and team, nothing of Bravo's.
    form = amy.get("/admin/runs/agentrun/start/").context["form"]
    assert [name for name, _ in form.fields["agent"].choices] == ["", "agent-alpha"]
    assert [slug for slug, _ in form.fields["team"].choices] == ["alpha"]
    refused = amy.post(
        "/admin/runs/agentrun/start/",
        {"agent": "", "team": "bravo", "prompt": "hi", "provider": "scripted"},
    )
    assert "team" in refused.context["form"].errors
    assert not AgentRun.objects.filter(team=world["bravo_team"], prompt="hi").exists()

    # The queue dashboard holds every team's jobs: not a member's.
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    assert amy.get("/admin/django-rq/").status_code == 403


def test_a_viewer_sees_alphas_runs_but_may_not_act_on_them(world, member, admin_client):
    viewer = client_of(member("vera", world["alpha_team"], "viewer"))
    alpha = world["alpha"]["run"]

    page = viewer.get(f"{RUNS}{alpha.pk}/change/")
    assert page.status_code == 200
    assert not page.context["can_cancel"] and not page.context["can_requeue"]
    refused = viewer.post(f"{RUNS}{alpha.pk}/cancel/")
    assert refused.status_code == 403
    assert "operator role" in refused.content.decode() and "alpha" in refused.content.decode()
    # A crafted bulk action: refused, naming the role.
    crafted = viewer.post(RUNS, {"action": "cancel_selected", "_selected_action": [str(alpha.pk)]})
    assert crafted.status_code == 403 and "operator role" in crafted.content.decode()
    # Bravo's run stays a 404, before any question of roles.
    assert viewer.post(f"{RUNS}{world['bravo']['run'].pk}/cancel/").status_code == 404
    assert fresh(alpha).status == RunStatus.WAITING_FOR_APPROVAL

    # A superuser sees every team: a team column and a team filter.
    listed = admin_client.get(RUNS)
    assert "team_shown" in listed.context["cl"].list_display
    assert "prompt-alpha" in listed.content.decode() and "prompt-bravo" in listed.content.decode()


def test_a_team_admin_keeps_the_teams_members_and_tools(world, member):
    alpha, bravo = world["alpha_team"], world["bravo_team"]
    keeper = client_of(member("kim", alpha, "team_admin", "author"))
    member("carl", bravo, "viewer")

    assert keeper.get("/admin/teams/team/add/").status_code == 403
    assert keeper.get(f"/admin/teams/team/{bravo.pk}/change/").status_code == 302
    teams = keeper.get("/admin/teams/team/").context["cl"].result_list
    assert list(teams) == [alpha]

    existing = list(Membership.objects.filter(team=alpha).select_related("user"))
    data = {
        "every_tool": "",
        "tools": ["search_notes"],
        "require_approval": ["search_notes"],
        "memberships-TOTAL_FORMS": str(len(existing) + 1),
        "memberships-INITIAL_FORMS": str(len(existing)),
        "memberships-MIN_NUM_FORMS": "0",
        "memberships-MAX_NUM_FORMS": "1000",
        # The team's budget (G21) and its own webhook secret (G19), write-only.
        "spend_budget-TOTAL_FORMS": "1",
        "spend_budget-INITIAL_FORMS": "0",
        "spend_budget-MIN_NUM_FORMS": "0",
        "spend_budget-MAX_NUM_FORMS": "1",
        "spend_budget-0-period": "day",
        "spend_budget-0-max_tokens": "5000",
        "new_webhook_secret": "alphas-own-secret",
        # The cap on runs in flight is the platform's: not the team admin's to set.
        "max_running": "99",
    }
    for index, one in enumerate(existing):
        data |= {
            f"memberships-{index}-id": str(one.pk),
            f"memberships-{index}-team": str(alpha.pk),
            f"memberships-{index}-user": one.user.username,
            f"memberships-{index}-role": one.role,
        }
    new = len(existing)
    data |= {
        f"memberships-{new}-team": str(alpha.pk),
        f"memberships-{new}-user": "carl",
        f"memberships-{new}-role": "runner",
    }

    unknown = keeper.post(f"/admin/teams/team/{alpha.pk}/change/", {**data, "tools": ["nope"]})
    assert unknown.status_code == 200  # the form again, the name refused
    saved = keeper.post(f"/admin/teams/team/{alpha.pk}/change/", data)
    assert saved.status_code == 302, saved.context["errors"]
    alpha.refresh_from_db()
    assert (alpha.tools, alpha.require_approval) == (["search_notes"], ["search_notes"])
    assert alpha.webhook_secret == "alphas-own-secret" and alpha.max_running is None
    assert TeamBudget.objects.get(team=alpha).max_tokens == 5000
    page = keeper.get(f"/admin/teams/team/{alpha.pk}/change/").content.decode()
    assert "alphas-own-secret" not in page and "own secret (set; never shown)" in page
    assert Membership.objects.filter(team=alpha, user__username="carl", role="runner").exists()
    logged = LogEntry.objects.filter(object_id=str(alpha.pk)).latest("action_time")
    assert "carl" in logged.get_change_message() and "runner" in logged.get_change_message()

    # An agent of Alpha may only name the tools Alpha may use.
    form = keeper.get("/admin/agents/agent/add/").context["adminform"].form
    assert [team.slug for team in form.fields["team"].queryset] == ["alpha"]
    agent = world["alpha"]["agent"]
    page = keeper.get(f"/admin/agents/agent/{agent.pk}/change/").context["adminform"].form
    assert page.fields["team"].disabled
    assert Agent.objects.get(pk=agent.pk).team == alpha
