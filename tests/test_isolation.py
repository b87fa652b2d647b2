"""A team sees and acts on its own (G22), proved from the URL
configuration: every route of the site — the API's, the console's pages
and every model admin's — is asked by a member of Alpha holding every role
there, once with a GET and once with a POST, naming Bravo's objects
wherever the route takes one. Bravo's objects are a 404 or absent; nothing
of Bravo shows in any answer (canary strings planted in its prompt, its
agent, its member's name, its notes); and afterwards nothing of Bravo has
changed: no run moved, no call decided, no letter dismissed, no log entry
names its objects, and no run was started in it.

A route is matched by its name to what it takes (``OBJECT_OF_PARAMETER``
and the model admins' registry) and to what it is (``DEPLOYMENT_WIDE``):
a route this test cannot place fails it, so a new endpoint is scoped, or
said to be the deployment's, before it lands."""

import json
import re
import uuid
from datetime import UTC, date, datetime, timedelta

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import DatabaseError, transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient
from standardwebhooks.webhooks import Webhook

from agents.models import Agent
from agents.versions import save_agent
from runs.approvals.completions import signature_for
from runs.models import AgentRun, ApprovalRequest, DeadLetter, RunStep, WriteReconciliation
from runs.models.vocabulary import ApprovalStatus, DeadLetterReason, RunStatus
from runs.runtime import enqueue
from spend.models import DailySpend, TeamBudget
from teams.models import Team
from tests.approval_requests import PLAN, TOOLS
from tests.drifting_model import request_for
from tests.helpers import fresh
from triggers.models import EventTrigger, Firing, FiringOutcome, Schedule, TriggerEvent

pytestmark = pytest.mark.django_db(transaction=True)

CANARY = "zqcanary"
#: Routes of the deployment as a whole, no team's: what they show is the
#: same for everyone who may open them (or they are refused to a member).
DEPLOYMENT_WIDE = {
    None,  # the front page, probes, metrics and the admin's catch-all
    "admin:index",
    "admin:login",
    "admin:logout",
    "admin:password_change",
    "admin:password_change_done",
    "admin:jsi18n",
    "admin:app_list",
    "admin:autocomplete",
    "admin:view_on_site",
    # Users are the deployment's: only a global permission reaches them.
    "admin:auth_user_password_change",
    "api-root",
    "api-schema",
    "api-docs",
    "api-providers",
    "api-tools",
    "api-tool",
}
#: A route's parameter, by name, and the object of Bravo's it is given.
OBJECT_OF_PARAMETER = {
    "run_id": "run",
    "approval_id": "approval",
    "sequence": "sequence",
    "name": "agent",
    "number": "version_number",
    # The console's backfill page (``/admin/triggers/schedule/<id>/backfill/``).
    "schedule_id": "schedule",
    "trigger_id": "trigger",
    # A trigger's hook: reached without login, its signature the credential.
    "path": "hook_path",
    # A deferred call's completion URL, as for a hook: the signature, made
    # for the call's key, is the credential (G24).
    "key": "completion_key",
    "signature": "completion_signature",
}
#: The API's routes with ``pk``: whose pk it is.
API_PK = {
    "api-run": "run",
    "api-run-steps": "run",
    "api-run-cancel": "run",
    "api-run-requeue": "run",
    "api-run-restart": "run",
    "api-run-rerun-from": "run",
    "api-run-webhook-deliveries": "run",
    "api-approval": "approval",
    "api-approval-approve": "approval",
    "api-approval-deny": "approval",
    "api-approval-edit": "approval",
    "api-approval-answer": "question",
    "api-write-audit-reconcile": "run",
    "api-schedule": "schedule",
    "api-schedule-pause": "schedule",
    "api-schedule-resume": "schedule",
    "api-schedule-backfill": "schedule",
    "api-trigger": "trigger",
}
#: Routes whose parameter names one team's object, by any converter.
TEAM_OBJECT_PARAMETER = re.compile(r"<(?:\w+:)?(?:schedule_id|trigger_id)>")


def asking_plan(words: str) -> list[dict]:
    """A run's plan that asks a person a question (naming ``words``) and waits."""
    question = {"question": f"which host, {words}?"}
    return [{"calls": [{"name": "ask_person", "arguments": question}]}, {"answer": "asked"}]


def named_routes(patterns=None, prefix="", namespace=""):
    """(name, route) of every route of the URL configuration."""
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(pattern, URLResolver):
            inner = namespace + (f"{pattern.namespace}:" if pattern.namespace else "")
            yield from named_routes(pattern.url_patterns, prefix + str(pattern.pattern), inner)
        elif isinstance(pattern, URLPattern):
            name = f"{namespace}{pattern.name}" if pattern.name else None
            yield name, prefix + str(pattern.pattern)


def model_admin_of(name: str | None):
    """The model admin whose route ``name`` is (``admin:runs_agentrun_change``)."""
    match = re.fullmatch(r"admin:(\w+?)_(\w+)_(changelist|add|history|delete|change)", name or "")
    if not match:
        return None, None
    for model, model_admin in admin.site._registry.items():
        if (model._meta.app_label, model._meta.model_name) == match.group(1, 2):
            return model, model_admin
    return None, None


@pytest.fixture
def bravo_world(member, approvals, django_capture_on_commit_callbacks):
    """Alpha and Bravo, each with an agent, a run waiting for a write's
    approval, a run waiting for the answer to its agent's question, a dead
    letter and a reconciled write, a schedule that fired the run that
    ended, an event trigger whose event started the waiting run; Bravo's
    full of canaries."""
    alpha = Team.objects.create(name="Alpha", slug="alpha")
    bravo = Team.objects.create(name=f"Bravo {CANARY}", slug=f"bravo-{CANARY}")
    amy = member("amy", alpha)
    bob = member(f"bob_{CANARY}", bravo)
    world = {"alpha_team": alpha, "bravo_team": bravo, "amy": amy}
    for key, team, who, words in (
        ("alpha", alpha, amy, "alpha-visible"),
        ("bravo", bravo, bob, CANARY),
    ):
        agent, _, _ = save_agent(
            f"agent-{words}",
            {"provider": request_for("scripted", PLAN, TOOLS)["provider"], "tools": TOOLS},
            description=words,
            user=who,
            create=True,
            team=team,
        )
        with django_capture_on_commit_callbacks(execute=True):
            waiting = enqueue(
                request_for("scripted", PLAN, TOOLS, prompt=f"prompt {words}"),
                submitted_by=who,
                team=team,
            )
        approval = ApprovalRequest.objects.get(run=waiting, status=ApprovalStatus.PENDING)
        with django_capture_on_commit_callbacks(execute=True):
            asking = enqueue(
                request_for("scripted", asking_plan(words), ["ask_person"]),
                submitted_by=who,
                team=team,
            )
        question = ApprovalRequest.objects.get(run=asking, status=ApprovalStatus.PENDING)
        with django_capture_on_commit_callbacks(execute=True):
            ended = enqueue(
                request_for("scripted", [{"answer": f"output {words}"}], []),
                submitted_by=who,
                team=team,
            )
        DeadLetter.objects.create(
            run=ended, reason=DeadLetterReason.WRITE_INTERRUPTED, error_message=words
        )
        WriteReconciliation.objects.create(
            run=ended, lease_token=1, outcome="landed", note=words, operator=who
        )
        # What a priced turn of the team's leaves (its model named by the canary).
        DailySpend.objects.create(
            day=date.today(), submitter=who.pk, provider="scripted", model=words, team=team, turns=1
        )
        TeamBudget.objects.create(team=team, period="day", max_tokens=1000, note=words)
        schedule = Schedule.objects.create(
            name=f"schedule-{words}",
            agent=agent,
            cron="0 7 * * *",
            input_template=f"report {words} for ${{scheduled_date}}",
            owner=who,
        )
        Firing.objects.create(
            schedule=schedule,
            slot=datetime(2026, 1, 5, 7, tzinfo=UTC),
            outcome=FiringOutcome.FIRED,
            run=ended,
        )
        Firing.objects.create(
            schedule=schedule,
            slot=datetime(2026, 1, 6, 7, tzinfo=UTC),
            outcome=FiringOutcome.REFUSED,
            reason=f"refused {words}",
        )
        trigger = EventTrigger.objects.create(
            name=f"trigger-{words}",
            agent=agent,
            input_template=f"alert {words}: ${{status}}",
            owner=who,
        )
        TriggerEvent.objects.create(trigger=trigger, event_id=f"event-{words}", run=waiting)
        world[key] = {
            "agent": agent,
            "run": fresh(waiting),
            "approval": approval,
            "question": question,
            "schedule": schedule,
            "trigger": trigger,
        }
    return world


def sample(parameter: str, converter: str, objects: dict, pk_of: str | None) -> str:
    """A value for a route's parameter: Bravo's object where it names one."""
    if parameter == "pk" and pk_of:
        return str(objects[pk_of].pk)
    kind = OBJECT_OF_PARAMETER.get(parameter)
    if kind in ("schedule", "trigger"):
        return str(objects[kind].pk)
    if kind == "hook_path":
        return objects["trigger"].path
    if kind == "completion_key":
        return objects["approval"].idempotency_key
    if kind == "completion_signature":
        return signature_for(objects["approval"].idempotency_key)
    if kind == "run":
        return str(objects["run"].pk)
    if kind == "approval":
        return str(objects["approval"].pk)
    if kind == "agent":
        return objects["agent"].name
    if kind in ("sequence", "version_number"):
        return "1"
    return {"int": "1", "uuid": str(objects["run"].pk)}.get(converter, "1")


def concrete(route: str, objects: dict, pk_of: str | None, object_id: str | None) -> str:
    def fill(match):
        converter, parameter = match[1] or "str", match[2]
        if parameter == "object_id" and object_id is not None:
            return object_id
        return sample(parameter, converter, objects, pk_of)

    route = re.sub(r"<(?:(\w+):)?(\w+)>", fill, route)
    route = re.sub(
        r"\(\?P<\w+>([^)]*)\)",
        lambda match: first if re.fullmatch(r"\w+", first := match[1].split("|")[0]) else "x",
        route,
    )
    return "/" + route.replace("^", "").replace("$", "")


def bravo_object_id(model, world) -> str | None:
    """The id of one of Bravo's objects of ``model`` (None: no team owns it)."""
    if getattr(model, "TEAM_FIELD", None) is None:
        return None
    bravo = world["bravo_team"]
    instance = (
        model.objects.filter(**{model.TEAM_FIELD: bravo}).order_by("pk").first()
        if model.TEAM_FIELD != "id"
        else bravo
    )
    assert instance is not None, f"the world holds no {model.__name__} of Bravo's: add one"
    return str(instance.pk)


def bravo_as_it_stands(world) -> dict:
    bravo = world["bravo_team"]
    runs = AgentRun.objects.filter(team=bravo)
    return {
        "runs": sorted(runs.values_list("id", "status", "step_count", "requeue_count")),
        "steps": RunStep.objects.filter(run__team=bravo).count(),
        "approvals": sorted(
            ApprovalRequest.objects.filter(run__team=bravo).values_list("id", "status")
        ),
        "letters": sorted(
            DeadLetter.objects.filter(run__team=bravo).values_list("id", "resolution")
        ),
        "reconciliations": WriteReconciliation.objects.filter(run__team=bravo).count(),
        "agents": sorted(Agent.objects.filter(team=bravo).values_list("id", "name", "latest")),
        "team": Team.objects.filter(pk=bravo.pk).values("name", "tools", "require_approval").get(),
        "schedules": sorted(
            Schedule.objects.filter(agent__team=bravo).values_list(
                "id", "name", "cron", "input_template", "owner", "paused_at", "updated_at"
            )
        ),
        "firings": sorted(
            Firing.objects.filter(schedule__agent__team=bravo).values_list(
                "id", "slot", "outcome", "run"
            )
        ),
        "triggers": sorted(
            EventTrigger.objects.filter(agent__team=bravo).values_list(
                "id", "name", "secret", "enabled", "owner", "updated_at"
            )
        ),
        "events": sorted(
            TriggerEvent.objects.filter(trigger__agent__team=bravo).values_list(
                "id", "event_id", "expired", "run"
            )
        ),
    }


def bravo_log_entries(world) -> int:
    bravo = world["bravo_team"]
    ids_by_model = {
        AgentRun: [
            str(pk) for pk in AgentRun.objects.filter(team=bravo).values_list("pk", flat=True)
        ],
        Agent: [str(pk) for pk in Agent.objects.filter(team=bravo).values_list("pk", flat=True)],
        Team: [str(bravo.pk)],
        **{
            model: [
                str(pk)
                for pk in model.objects.filter(**{model.TEAM_FIELD: bravo}).values_list(
                    "pk", flat=True
                )
            ]
            for model in (Schedule, Firing, EventTrigger, TriggerEvent)
        },
    }
    return sum(
        LogEntry.objects.filter(
            content_type=ContentType.objects.get_for_model(model), object_id__in=ids
        ).count()
        for model, ids in ids_by_model.items()
    )


#: What a POST may carry, whatever the route: Bravo's ids in every field a
#: form or an endpoint of the site reads them from, and a decision for each.
def post_bodies(world, model_admin, changelist: bool) -> list[dict]:
    bravo = world["bravo"]
    ids = [str(bravo["run"].pk), str(bravo["approval"].pk)]
    common = {
        "confirm": "yes",
        "note": "isolation",
        "digest": bravo["approval"].digest,
        # An edit's arguments, an answer, a completion's result.
        "arguments": {"recipient": "bravo", "message": "edited by Alpha"},
        "answer": "answered by Alpha",
        "result": "completed by Alpha",
        "outcome": "landed",
        "decision": "approve",
        "_selected_action": ids,
        "agent": bravo["agent"].name,
        "input": "start in Bravo",
        "prompt": "start in Bravo",
        "team": world["bravo_team"].slug,
    }
    # A list's actions, each on the selection and on "all matching"; any
    # other route reads the fields it knows from one body.
    actions = list(getattr(model_admin, "actions", None) or []) if changelist else []
    if not actions:
        return [{**common, "action": "requeue"}]
    return [{**common, "action": name} for name in actions] + [
        {**common, "action": name, "select_across": "1", "index": "0"} for name in actions
    ]


class Ghost:
    """Objects of nobody's: ids no row has, for the answer a missing object gets."""

    def __init__(self, model):
        self.pk = (
            uuid.uuid4()
            if model is not None and model._meta.pk.get_internal_type() == ("UUIDField")
            else 987654321
        )
        self.name = "no-such-agent"
        self.path = "no-such-hook"
        self.idempotency_key = "0" * 64
        self.digest = "0" * 64


def ghost_objects(model) -> dict:
    run = Ghost(AgentRun)
    return {
        "run": run,
        "approval": Ghost(None),
        "question": Ghost(None),
        "agent": Ghost(None),
        "schedule": Ghost(None),
        "trigger": Ghost(None),
        "object": Ghost(model),
    }


def test_a_member_of_alpha_reaches_nothing_of_bravo_through_any_route(bravo_world, api_token):
    world = bravo_world
    amy = world["amy"]
    console = Client(raise_request_exception=False)
    api = APIClient(raise_request_exception=False)
    api.credentials(HTTP_AUTHORIZATION=api_token(amy))
    bravo = world["bravo"]
    before, logged_before = bravo_as_it_stands(world), bravo_log_entries(world)
    echoes = sorted({bravo["agent"].name, world["bravo_team"].slug}, key=len, reverse=True)

    def ask(method, path, body):
        console.force_login(amy)  # again: the walk posts to the logout route too
        client = api if path.startswith("/api/") else console
        if method == "get":
            return client.get(path)
        if client is api:
            return client.post(path, body, format="json")
        return client.post(path, body)

    unplaced, leaks, wrong = [], [], []
    visited = 0
    for name, route in named_routes():
        model, model_admin = model_admin_of(name)
        object_route = "<path:object_id>" in route or "<uuid:run_id>" in route
        object_route = object_route or "<int:approval_id>" in route or (name in API_PK)
        object_route = object_route or "<str:name>" in route and name and name.startswith("api-ag")
        object_route = object_route or bool(TEAM_OBJECT_PARAMETER.search(route))
        if (
            name not in DEPLOYMENT_WIDE
            and model is None
            and not object_route
            and not (name or "").startswith(("api-", "admin:runs_", "django_rq:"))
        ):
            unplaced.append((name, route))
            continue
        object_id = bravo_object_id(model, world) if model is not None else None
        if model is not None and "<path:object_id>" in route and object_id is None:
            object_route = False  # the deployment's object: the sample "1"
        object_route = object_route and name not in DEPLOYMENT_WIDE
        path = concrete(route, bravo, API_PK.get(name), object_id)
        ghost = ghost_objects(model)
        ghost_path = concrete(route, ghost, API_PK.get(name), str(ghost["object"].pk))
        for method, bodies in (
            ("get", [None]),
            ("post", post_bodies(world, model_admin, (name or "").endswith("_changelist"))),
        ):
            for body in bodies:
                visited += 1
                response = ask(method, path, body)
                content = (getattr(response, "content", b"") or b"").decode(errors="replace")
                location = response.get("Location", "")
                # What the request named itself may be said back ("no agent
                # named …"): only what it did not send is a leak.
                for sent in echoes:
                    content, location = content.replace(sent, ""), location.replace(sent, "")
                if CANARY in content.lower() or CANARY in location:
                    leaks.append((method, path, response.status_code, body and body["action"]))
                if response.status_code >= 500:
                    wrong.append((method, path, response.status_code))
                elif object_route:
                    # Bravo's object answers as a missing one does: the same
                    # status, the same place to go (404, the admin's "does
                    # not exist" redirect, a 403 given whatever the id).
                    missing = ask(method, ghost_path, body)
                    said = (response.status_code, _masked(location, path, bravo))
                    said_of_missing = (
                        missing.status_code,
                        _masked(missing.get("Location", ""), ghost_path, ghost),
                    )
                    if said != said_of_missing:
                        wrong.append((method, path, said, said_of_missing))

    assert not unplaced, f"routes this test cannot place (scope them, or list them): {unplaced}"
    assert visited > 250
    assert not leaks, f"Bravo's canaries reached a member of Alpha: {leaks}"
    assert not wrong, f"Bravo's objects answered otherwise than missing ones: {wrong}"
    assert bravo_as_it_stands(world) == before
    assert bravo_log_entries(world) == logged_before
    # And the scope is not everything refused: Alpha's own run is listed.
    listed = api.get("/api/runs/").json()["results"]
    assert str(world["alpha"]["run"].pk) in {run["id"] for run in listed}
    assert fresh(bravo["run"]).status == RunStatus.WAITING_FOR_APPROVAL
    # Nor by what fired them: Bravo's schedule and trigger filter nothing in.
    for name in ("schedule", "trigger"):
        listed = api.get(f"/api/runs/?{name}={bravo[name].pk}")
        assert (listed.status_code, listed.json()["results"]) == (200, [])
    alphas = api.get(f"/api/runs/?trigger={world['alpha']['trigger'].pk}").json()["results"]
    assert [run["id"] for run in alphas] == [str(world["alpha"]["run"].pk)]


def test_an_event_signed_with_another_teams_secret_is_refused_and_stores_nothing(bravo_world):
    """A trigger's hook takes no login: its secret is the credential. Amy
    holds Alpha's trigger's secret; Bravo's hook refuses what it signs (401,
    nothing stored), and Alpha's own takes the same delivery."""
    world = bravo_world
    alpha, bravo = world["alpha"]["trigger"], world["bravo"]["trigger"]
    before, logged_before = bravo_as_it_stands(world), bravo_log_entries(world)
    body = json.dumps({"status": "firing"}).encode()
    sent_at = datetime.now(UTC)

    def deliver(trigger, message_id, at=sent_at):
        headers = {
            "webhook-id": message_id,
            "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": Webhook(alpha.secret).sign(message_id, at, body),
        }
        return Client().post(
            f"/api/hooks/{trigger.path}/", body, content_type="application/json", headers=headers
        )

    refused = deliver(bravo, "msg-1")
    assert (refused.status_code, refused.json()["code"]) == (401, "not_authenticated")
    stale = deliver(alpha, "msg-2", at=sent_at - timedelta(minutes=10))
    assert stale.status_code == 401
    assert bravo_as_it_stands(world) == before
    assert bravo_log_entries(world) == logged_before
    assert TriggerEvent.objects.filter(event_id__startswith="msg-").count() == 0

    accepted = deliver(alpha, "msg-3")
    assert accepted.status_code == 202, accepted.content
    assert AgentRun.objects.get(pk=accepted.json()["run"]).team == world["alpha_team"]


def _masked(location: str, path: str, objects: dict) -> str:
    """``location`` with the ids the request named (in ``path``) as one word."""
    for value in path.strip("/").split("/"):
        if value.isdigit() or re.fullmatch(r"[0-9a-f-]{36}", value):
            location = location.replace(value, "<id>")
    return location.replace(objects["agent"].name, "<id>")


def test_a_rows_team_never_changes(two_teams, member):
    """The database refuses to move an agent or a run to another team,
    whatever statement tries (a trigger; SQLite's in test_run_webhooks)."""
    alpha, bravo = two_teams
    amy = member("amy", alpha)
    agent, _, _ = save_agent(
        "alphas",
        {"provider": request_for("scripted", PLAN, TOOLS)["provider"], "tools": TOOLS},
        user=amy,
        create=True,
        team=alpha,
    )
    run = enqueue(request_for("scripted", PLAN, TOOLS), submitted_by=amy, team=alpha)
    for model, pk in ((Agent, agent.pk), (AgentRun, run.pk)):
        with pytest.raises(DatabaseError, match="never changes"), transaction.atomic():
            model.objects.filter(pk=pk).update(team=bravo)
        assert model.objects.get(pk=pk).team_id == alpha.pk
    # The same team again is no change, and any other column still is one.
    assert Agent.objects.filter(pk=agent.pk).update(team=alpha, description="kept") == 1
