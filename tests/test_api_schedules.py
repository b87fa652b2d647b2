"""``/api/schedules/`` and ``/api/triggers/`` (G23): bad input is a 400
naming the field, storing nothing; a schedule is created, paused and
resumed (each an admin log entry), backfilled after a preview of what the
backfill would do; the runs list is filtered by the schedule and the
trigger that started its runs, each run saying which; another team's
schedule is a 404 everywhere."""

import json
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.utils import timezone
from rest_framework.test import APIClient
from standardwebhooks.webhooks import Webhook

from agents.versions import save_agent
from runs.models import AgentRun
from teams.roles import Role
from tests.approval_requests import PLAN, TOOLS
from tests.drifting_model import request_for
from triggers.models import EventTrigger, Firing, Schedule

pytestmark = pytest.mark.django_db(transaction=True)

DEFINITION = {"provider": request_for("scripted", PLAN, TOOLS)["provider"], "tools": TOOLS}


@pytest.fixture
def alpha(two_teams, member, api_token):
    """Amy, every role in Alpha, with a token; Alpha's agent, Bravo's agent
    and a schedule of Bravo's."""
    alpha, bravo = two_teams
    amy = member("amy", alpha)
    bob = member("bob", bravo)
    save_agent("reporter", DEFINITION, user=amy, create=True, team=alpha)
    bravos, _, _ = save_agent("bravos", DEFINITION, user=bob, create=True, team=bravo)
    theirs = Schedule.objects.create(
        name="nightly", agent=bravos, cron="0 2 * * *", input_template="report", owner=bob
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=api_token(amy))
    return {"api": client, "amy": amy, "team": alpha, "bravos": theirs}


def schedule_body(**fields) -> dict:
    return {
        "name": "daily-report",
        "agent": "reporter",
        "cron": "0 7 * * 1-5",
        "time_zone": "Europe/Berlin",
        "input_template": "The report for ${scheduled_date} (${schedule})",
        **fields,
    }


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"cron": "0 25 * * *"}, "cron"),
        ({"time_zone": "Europe/Atlantis"}, "time_zone"),
        ({"input_template": "for ${scheduled_day}"}, "input_template"),
        ({"cron": "", "interval_seconds": None}, "cron"),
        ({"version": 2**40}, "version"),
        ({"agent": "bravos"}, "agent"),
        ({"paused_at": "2026-01-01T00:00:00Z"}, "paused_at"),
        ({"owner": "bob"}, "owner"),
        ({"colour": "red"}, "colour"),
        ({"input_template": "ok \ud800"}, "input_template"),
    ],
)
def test_a_bad_schedule_is_a_400_naming_the_field_and_stores_nothing(alpha, fields, named):
    logged = LogEntry.objects.count()
    # As JSON escapes it: a lone surrogate is no UTF-8.
    body = json.dumps(schedule_body(**fields))
    response = alpha["api"].post("/api/schedules/", body, content_type="application/json")

    assert response.status_code == 400, response.content
    assert named in response.json()["errors"], response.json()
    assert Schedule.objects.filter(agent__team=alpha["team"]).count() == 0
    assert LogEntry.objects.count() == logged


def test_a_schedule_is_created_paused_and_resumed_each_in_the_admin_log(alpha):
    api = alpha["api"]
    created = api.post("/api/schedules/", schedule_body(), format="json")
    assert created.status_code == 201, created.content
    schedule = created.json()
    assert (schedule["owner"], schedule["team"], schedule["version"]) == ("amy", "alpha", None)
    assert len(schedule["next_firing_times"]) == 5 and schedule["last_firings"] == []
    # 07:00 in Berlin is 05:00 or 06:00 UTC, never 07:00.
    assert {slot[11:16] for slot in schedule["next_firing_times"]} <= {"05:00", "06:00"}
    again = api.post("/api/schedules/", schedule_body(), format="json")
    assert again.status_code == 400 and "already" in again.json()["errors"]["name"][0]
    url = f"/api/schedules/{schedule['id']}/"
    renamed = api.patch(url, {"name": "report", "version": 1}, format="json")
    assert (renamed.status_code, renamed.json()["version"]) == (200, 1), renamed.content
    moved = api.patch(url, {"agent": "bravos"}, format="json")
    assert moved.status_code == 400 and "never changes" in moved.json()["errors"]["agent"][0]

    paused = api.post(f"{url}pause/", {"note": "holiday"}, format="json")
    assert (paused.status_code, paused.json()["code"]) == (200, "paused")
    shown = api.get(url).json()
    assert shown["pause_reason"] == "paused by amy: holiday"
    assert shown["paused_at"] and shown["next_firing_times"] == []
    twice = api.post(f"{url}pause/", {}, format="json")
    assert (twice.status_code, twice.json()["code"]) == (409, "already_paused")
    resumed = api.post(f"{url}resume/", {"note": "back"}, format="json")
    assert (resumed.status_code, resumed.json()["code"]) == (200, "resumed")
    assert api.get(url).json()["paused_at"] is None

    messages = list(
        LogEntry.objects.filter(object_id=str(schedule["id"]))
        .order_by("pk")
        .values_list("change_message", flat=True)
    )
    assert messages[2:] == ["Paused the schedule. holiday", "Resumed the schedule. back"]
    assert api.delete(url).status_code == 204
    assert not Schedule.objects.filter(pk=schedule["id"]).exists()


def test_a_backfill_is_previewed_then_fires_each_slot_once_and_the_runs_say_so(alpha, approvals):
    """Three hourly slots in the range: the preview counts them and names
    the write that waits for approval; the backfill starts three runs,
    submitted by who asked; a second preview finds them recorded. The
    runs list filtered by the schedule lists them, and by the trigger the
    one run an event started."""
    api = alpha["api"]
    schedule = api.post(
        "/api/schedules/",
        schedule_body(cron="", interval_seconds=3600, time_zone="UTC"),
        format="json",
    ).json()
    url = f"/api/schedules/{schedule['id']}/backfill/"
    now = timezone.now()
    window = {"start": (now - timedelta(hours=3)).isoformat(), "end": now.isoformat()}

    preview = api.post(url, {**window, "preview": True}, format="json")
    assert preview.status_code == 200, preview.content
    assert preview.json() == {
        "preview": True,
        "slots": 3,
        "already_recorded": 0,
        "runs": 3,
        "writes": ["send_notification"],
        "approval_required": ["send_notification"],
        "too_many": False,
    }
    assert AgentRun.objects.count() == 0
    naive = api.post(url, {**window, "start": "2026-01-01T00:00:00"}, format="json")
    assert naive.status_code == 400 and "offset" in naive.json()["errors"]["start"][0]

    done = api.post(url, window, format="json")
    assert (done.status_code, done.json()["code"]) == (200, "backfilled"), done.content
    assert api.post(url, {**window, "preview": True}, format="json").json()["runs"] == 0
    assert api.post(url, window, format="json").json()["detail"].startswith("0 run(s) started")

    fired = api.get(f"/api/runs/?schedule={schedule['id']}").json()["results"]
    slots = sorted(Firing.objects.values_list("slot", flat=True))
    assert [run["fired_by"] for run in reversed(fired)] == [
        {
            "schedule": schedule["id"],
            "schedule_name": "daily-report",
            "slot": slot.isoformat().replace("+00:00", "Z"),
            "backfill": True,
        }
        for slot in slots
    ]
    assert {(run["submitted_by"], run["submitted_via"]) for run in fired} == {("amy", "schedule")}

    trigger = api.post(
        "/api/triggers/",
        {"name": "alerts", "agent": "reporter", "input_template": "Alert: ${status}"},
        format="json",
    ).json()
    secret = trigger.pop("secret")
    assert "secret" not in api.get(f"/api/triggers/{trigger['id']}/").json()
    body = json.dumps({"status": "firing"}).encode()
    signed = Webhook(secret).sign("msg-1", timezone.now(), body)
    sent = APIClient().post(
        trigger["url"].removeprefix("http://testserver"),
        body,
        content_type="application/json",
        headers={
            "webhook-id": "msg-1",
            "webhook-timestamp": str(int(timezone.now().timestamp())),
            "webhook-signature": signed,
        },
    )
    assert sent.status_code == 202, sent.content
    started = api.get(f"/api/runs/?trigger={trigger['id']}").json()["results"]
    assert [(run["id"], run["fired_by"]) for run in started] == [
        (
            sent.json()["run"],
            {"trigger": trigger["id"], "trigger_name": "alerts", "event_id": "msg-1"},
        )
    ]
    assert api.get(f"/api/runs/{started[0]['id']}/").json()["fired_by"]["event_id"] == "msg-1"
    for bad in ("?schedule=x", "?trigger=-1", "?schedule=99999999999999999999"):
        refused = api.get(f"/api/runs/{bad}")
        assert refused.status_code == 400 and bad[1:].split("=")[0] in refused.json()["detail"]


def test_another_teams_schedule_is_a_404_and_a_role_short_is_a_403_naming_it(
    alpha, member, api_token
):
    api, theirs = alpha["api"], alpha["bravos"]
    url = f"/api/schedules/{theirs.pk}/"
    assert api.get("/api/schedules/").json() == []
    answers = [
        api.get(url),
        api.patch(url, {"cron": "* * * * *"}, format="json"),
        api.delete(url),
        api.post(f"{url}pause/", {}, format="json"),
        api.post(f"{url}resume/", {}, format="json"),
        api.post(
            f"{url}backfill/",
            {"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"},
            format="json",
        ),
    ]
    assert [answer.status_code for answer in answers] == [404] * 6
    assert {answer.json()["detail"] for answer in answers} == {f"no schedule {theirs.pk}"}
    assert Schedule.objects.get(pk=theirs.pk).cron == "0 2 * * *"
    assert api.get(f"/api/triggers/{EventTrigger.objects.count() + 99}/").status_code == 404

    # A viewer in Alpha sees Alpha's schedule, and may not pause it: told which role.
    created = api.post("/api/schedules/", schedule_body(), format="json").json()
    viewer = APIClient()
    viewer.credentials(HTTP_AUTHORIZATION=api_token(member("vera", alpha["team"], Role.VIEWER)))
    assert [each["id"] for each in viewer.get("/api/schedules/").json()] == [created["id"]]
    refused = viewer.post(f"/api/schedules/{created['id']}/pause/", {}, format="json")
    assert refused.status_code == 403 and "the operator role" in refused.json()["detail"]


def test_whoever_saves_a_schedule_or_trigger_owns_its_runs_and_must_be_a_runner(
    alpha, member, api_token
):
    """An author who is no runner may not make a schedule's runs someone
    else's by changing it; a runner who changes it owns its runs from then
    on (their budget; under four-eyes they may not approve them)."""
    created = alpha["api"].post("/api/schedules/", schedule_body(), format="json").json()
    url = f"/api/schedules/{created['id']}/"

    def client(user):
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=api_token(user))
        return api

    carl = client(member("carl", alpha["team"], Role.AUTHOR, Role.APPROVER))
    refused = carl.patch(url, {"input_template": "carl says"}, format="json")
    assert refused.status_code == 400, refused.json()
    assert refused.json()["detail"].startswith("owner: carl may not start runs")
    assert Schedule.objects.get(pk=created["id"]).input_template.startswith("The report")

    dana = client(member("dana", alpha["team"], Role.AUTHOR, Role.RUNNER))
    changed = dana.patch(url, {"input_template": "dana's report"}, format="json")
    assert changed.status_code == 200 and changed.json()["owner"] == "dana"
    trigger = carl.post(
        "/api/triggers/",
        {"name": "carls", "agent": "reporter", "input_template": "x"},
        format="json",
    )
    assert trigger.status_code == 400 and "carl may not start runs" in trigger.json()["detail"]
