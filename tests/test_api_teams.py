"""The REST API is scoped to its user's teams and its token's narrowing
(G22): a member of Alpha holding every role sees and acts on Alpha's runs
and agents only — Bravo's are a 404 or absent, in lists, details, actions
and bulk "all matching" alike; a token narrowed to Alpha and read-only can
start nothing, act on nothing, read nothing of Bravo, and loses Alpha the
moment its user leaves it; a whole request by a user who may start runs in
two teams must name one."""

import io
import json
import re

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from agents.models import Agent, AgentVersion
from agents.versions import save_agent
from runs.models import AgentRun, DeadLetter
from runs.models.vocabulary import DeadLetterReason, RunStatus
from runs.runtime import enqueue
from spend.budgets import database_now
from spend.models import DailySpend
from teams.models import Membership
from tests.helpers import answer, fresh, scripted
from tools.models import ToolSetting

pytestmark = pytest.mark.django_db

DEFINITION = {"provider": {"kind": "scripted", "turns": [answer()]}, "tools": ["read_note"]}


def client_with(header: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    return client


def token_of(*args: str) -> str:
    out = io.StringIO()
    call_command("create_api_token", *args, stdout=out)
    return f"Token {out.getvalue().strip()}"


@pytest.fixture
def world(two_teams):
    """A queued run, a dead-lettered run and an agent in each team."""
    alpha, bravo = two_teams
    made = {}
    for team in (alpha, bravo):
        run = enqueue(scripted(answer(), prompt=f"{team.slug} prompt"), team=team)
        lettered = enqueue(scripted(answer(), prompt=f"{team.slug} lettered"), team=team)
        DeadLetter.objects.create(run=lettered, reason=DeadLetterReason.RETRIES_EXHAUSTED)
        save_agent(f"{team.slug}-agent", DEFINITION, create=True, team=team)
        made[team.slug] = {"run": run, "lettered": lettered}
    return alpha, bravo, made


def test_a_member_of_alpha_sees_and_acts_on_alphas_own_only(world, member, api_token):
    alpha, bravo, made = world
    ann = client_with(api_token(member("ann", alpha)))
    bravo_run, alpha_run = made["bravo"]["run"], made["alpha"]["run"]

    runs = ann.get("/api/runs/").json()["results"]
    assert {run["team"] for run in runs} == {"alpha"} and len(runs) == 2
    assert "bravo" not in str(ann.get("/api/dead-letters/").json())
    agents = ann.get("/api/agents/").json()
    assert [(agent["name"], agent["team"]) for agent in agents] == [("alpha-agent", "alpha")]
    assert ann.get("/api/write-audits/").status_code == 200

    # Bravo's objects: the same 404 as an unknown one, for every read and action.
    unknown = "0b6f1d2e-5c3a-4f8e-9d21-7a4b3c2d1e0f"
    for path, method in [
        ("/api/runs/{}/", "get"),
        ("/api/runs/{}/steps/", "get"),
        ("/api/runs/{}/webhook-deliveries/", "get"),
        ("/api/runs/{}/requeue/", "get"),
        ("/api/runs/{}/requeue/", "post"),
        ("/api/runs/{}/restart/", "post"),
        ("/api/runs/{}/cancel/", "post"),
        ("/api/runs/{}/rerun-from/1/", "get"),
        ("/api/runs/{}/rerun-from/1/", "post"),
        ("/api/write-audits/{}/reconcile/", "post"),
    ]:
        body = {"outcome": "applied", "note": "x"} if "reconcile" in path else {}
        answered = getattr(ann, method)(path.format(bravo_run.pk), body, format="json")
        missing = getattr(ann, method)(path.format(unknown), body, format="json")
        assert answered.status_code == 404, (path, method, answered.content)
        assert answered.json()["code"] == missing.json()["code"] == "not_found"
        assert answered.json()["detail"] == f"no run {bravo_run.pk}"
    for path in ("/api/agents/bravo-agent/", "/api/agents/bravo-agent/versions/"):
        assert ann.get(path).status_code == 404
    patched = ann.patch("/api/agents/bravo-agent/", {"instructions": "x"}, format="json")
    assert patched.status_code == 404
    assert fresh(bravo_run).status == RunStatus.QUEUED

    # Bulk "all matching", previewed and applied: Bravo's runs are not in it.
    cancel_queued = {"action": "cancel", "filter": {"status": "queued"}}
    preview = ann.post("/api/runs/bulk/", {**cancel_queued, "preview": True}, format="json")
    assert {one["id"] for one in preview.json()["results"]} == {
        str(made["alpha"]["run"].pk),
        str(made["alpha"]["lettered"].pk),
    }
    applied = ann.post("/api/runs/bulk/", cancel_queued, format="json").json()
    assert applied["done"] == 2 and fresh(alpha_run).status == RunStatus.CANCELLED
    by_id = ann.post(
        "/api/runs/bulk/", {"action": "cancel", "ids": [str(bravo_run.pk)]}, format="json"
    ).json()
    assert by_id["refused_by_code"] == {"not_found": 1}
    assert fresh(bravo_run).status == RunStatus.QUEUED
    assert fresh(made["bravo"]["lettered"]).status == RunStatus.QUEUED

    # Usage sums the spend of Alpha's runs only.
    for team in (alpha, bravo):
        DailySpend.objects.create(
            day=database_now().date(), submitter=0, provider="openai", model=team.slug,
            team=team, turns=1, input_tokens=10, output_tokens=5,
        )  # fmt: skip
    by_model = ann.get("/api/usage/?group_by=model").json()
    assert [(row["model"], row["tokens"]) for row in by_model] == [("alpha", 15)]


def test_a_viewer_is_told_the_role_an_action_takes(world, member, api_token):
    alpha, bravo, made = world
    member("vic", bravo)  # an operator elsewhere: the endpoint is open to him
    vic = client_with(api_token(member("vic", alpha, "viewer")))
    alpha_run = made["alpha"]["run"]
    assert vic.get(f"/api/runs/{alpha_run.pk}/").json()["team"] == "alpha"
    refused = vic.post(f"/api/runs/{alpha_run.pk}/cancel/", {}, format="json")
    assert refused.status_code == 403
    assert "operator role in team 'alpha'" in refused.json()["detail"]
    bulk = vic.post(
        "/api/runs/bulk/", {"action": "cancel", "ids": [str(alpha_run.pk)]}, format="json"
    ).json()
    assert bulk["refused_by_code"] == {"forbidden": 1}
    assert fresh(alpha_run).status == RunStatus.QUEUED


def test_agents_and_bare_runs_name_their_team_when_there_are_two(world, member):
    alpha, bravo, _ = world
    member("sam", alpha)
    sam_user = member("sam", bravo)
    sam = APIClient()
    sam.force_authenticate(sam_user)

    bare = sam.post("/api/runs/", scripted(answer()), format="json")
    assert bare.status_code == 400 and bare.json()["detail"].startswith("team:"), bare.content
    named = sam.post("/api/runs/", {**scripted(answer()), "team": "bravo"}, format="json")
    assert named.status_code == 201 and named.json()["team"] == "bravo"
    assert AgentRun.objects.get(pk=named.json()["id"]).team == bravo
    # A start by agent runs in the agent's team.
    by_agent = sam.post("/api/runs/", {"agent": "alpha-agent", "input": "hi"}, format="json")
    assert by_agent.status_code == 201 and by_agent.json()["team"] == "alpha"

    agent = {"name": "new-agent", **DEFINITION}
    assert "team" in sam.post("/api/agents/", agent, format="json").json()["errors"]
    created = sam.post("/api/agents/", {**agent, "team": "bravo"}, format="json")
    assert created.status_code == 201 and created.json()["agent"]["team"] == "bravo"
    alpha.tools = ["send_notification"]
    alpha.save()
    not_its_tool = sam.post("/api/agents/", {**agent, "name": "x", "team": "alpha"}, format="json")
    assert not_its_tool.status_code == 400 and "tools" in not_its_tool.json()["errors"]


def test_a_token_narrowed_to_alpha_and_read_only(world, member, outsider):
    alpha, bravo, made = world
    member("sam", alpha)
    sam_user = member("sam", bravo)
    with pytest.raises(CommandError, match="not a member of team 'bravo'"):
        token_of(outsider.username, "--team", "bravo")
    token = client_with(token_of("sam", "--team", "alpha", "--read-only"))
    alpha_run, bravo_run = made["alpha"]["run"], made["bravo"]["run"]

    runs = token.get("/api/runs/").json()["results"]
    assert {run["team"] for run in runs} == {"alpha"}
    assert token.get(f"/api/runs/{bravo_run.pk}/").status_code == 404
    assert token.get("/api/agents/bravo-agent/").status_code == 404
    for path, body in [
        ("/api/runs/", {**scripted(answer()), "team": "alpha"}),
        (f"/api/runs/{alpha_run.pk}/cancel/", {}),
        ("/api/runs/bulk/", {"action": "cancel", "ids": [str(alpha_run.pk)], "preview": True}),
        ("/api/agents/", {"name": "by-token", "team": "alpha", **DEFINITION}),
    ]:
        refused = token.post(path, body, format="json")
        assert refused.status_code == 403 and "read-only" in refused.json()["detail"], path
    assert fresh(alpha_run).status == RunStatus.QUEUED
    assert AgentRun.objects.count() == 4

    # Narrowed but not read-only: a bare request starts in the token's team.
    writer = client_with(token_of("sam", "--team", "alpha"))
    started = writer.post("/api/runs/", scripted(answer()), format="json")
    assert started.status_code == 201 and started.json()["team"] == "alpha"
    into_bravo = writer.post("/api/runs/", {**scripted(answer()), "team": "bravo"}, format="json")
    assert into_bravo.status_code == 400

    # Sam leaves Alpha: the token has nothing left, at its next request.
    Membership.objects.filter(user=sam_user, team=alpha).delete()
    for path in ("/api/runs/", f"/api/runs/{alpha_run.pk}/", "/api/agents/alpha-agent/"):
        answered = token.get(path)
        assert answered.status_code in (403, 404), (path, answered.content)
        assert "alpha prompt" not in answered.content.decode()


def test_the_admin_shows_and_edits_a_tokens_narrowing(two_teams, member, admin_client):
    from knox.models import AuthToken

    from teams.models import TokenScope

    alpha, bravo = two_teams
    token, _ = AuthToken.objects.create(user=member("ann", alpha))
    url = f"/admin/knox/authtoken/{token.pk}/change/"
    assert "scope-0-read_only" in admin_client.get(url).content.decode()
    form = {
        # knox's own change form: the token as it is.
        "digest": token.digest,
        "token_key": token.token_key,
        "user": token.user_id,
        "scope-TOTAL_FORMS": "1",
        "scope-INITIAL_FORMS": "0",
        "scope-MIN_NUM_FORMS": "0",
        "scope-MAX_NUM_FORMS": "1",
        "scope-0-token": token.pk,
    }
    refused = admin_client.post(url, {**form, "scope-0-team": bravo.pk})
    assert "is not a member of team bravo" in refused.content.decode()
    assert not TokenScope.objects.exists()
    saved = admin_client.post(url, {**form, "scope-0-team": alpha.pk, "scope-0-read_only": "on"})
    assert saved.status_code == 302, re.findall(r"errorlist.{0,200}", saved.content.decode())
    assert str(TokenScope.objects.get(token=token)) == "alpha, read-only"
    assert "alpha, read-only" in admin_client.get("/admin/knox/authtoken/").content.decode()


def test_a_narrowed_token_changes_nothing_of_the_deployments_and_ends_with_its_team(
    world, member, operator
):
    """Platform staff's token narrowed to Alpha keeps to Alpha's objects:
    the deployment's tool settings are not its to change, a team named in
    malformed text is a 400, and deleting Alpha deletes the token — it
    never falls back to its user's every team."""
    alpha, bravo, made = world
    staff = client_with(token_of(operator.username, "--team", "alpha"))
    switched = staff.patch("/api/tools/read_note/", {"enabled": False}, format="json")
    assert switched.status_code == 403, switched.content
    assert ToolSetting.objects.get(name="read_note").enabled
    for malformed in ("al\u0000pha", "\ud800", "x" * 200_000, 7, ["alpha"], ""):
        body = json.dumps({**scripted(answer()), "team": malformed})  # \ud800 escaped
        refused = staff.post("/api/runs/", body, content_type="application/json")
        assert refused.status_code == 400, (malformed, refused.content[:300])
        assert refused.json()["detail"].startswith("team:"), malformed
    for malformed in ("\ud800", "a\u0000b"):
        body = json.dumps({"agent": malformed, "input": "x"})
        refused = staff.post("/api/runs/", body, content_type="application/json")
        assert refused.status_code == 400 and refused.json()["detail"].startswith("agent:")

    # Its agents and runs go first (they protect it), as retention and an
    # operator would take them.
    Agent.objects.filter(team=alpha).update(latest=None)
    AgentVersion.objects.filter(agent__team=alpha).delete()
    Agent.objects.filter(team=alpha).delete()
    AgentRun.objects.filter(team=alpha).delete()
    alpha.delete()
    assert staff.get("/api/runs/").status_code == 401
    assert (
        staff.post("/api/runs/", {**scripted(answer()), "team": "bravo"}, format="json").status_code
        == 401
    )
    assert (
        not AgentRun.objects.filter(team=bravo)
        .exclude(pk__in=[r.pk for r in made["bravo"].values()])
        .exists()
    )
