"""Schedules and event triggers in the console (G23, G22): an author adds
a schedule (its owner: whoever saves it), an operator pauses and
resumes it — each a log entry — and a resume is refused while a run of it
has a write in doubt, the page saying why; a backfill previews, then
starts one run per slot no firing records, and the run's page says which
schedule fired it for which slot (a trigger's run: which trigger, which
event id). Another team's schedule or trigger is missing, on every page
of it; a trigger's secret is shown to its owner only."""

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.utils import timezone

from agents.versions import save_agent
from runs.models import AgentRun
from runs.models.vocabulary import RunStatus, SubmittedVia
from runs.runtime import enqueue
from teams.roles import Role
from tests.helpers import answer, scripted
from tools.effects import ToolEffect
from triggers.firing import fire_due_schedules
from triggers.models import EventTrigger, Firing, FiringOutcome, Schedule, TriggerEvent

pytestmark = pytest.mark.django_db

SCHEDULES = "/admin/triggers/schedule/"
TRIGGERS = "/admin/triggers/eventtrigger/"


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def agent_of(team, user, name):
    agent, _, _ = save_agent(
        name,
        {
            "provider": {"kind": "scripted", "turns": [{"content": "done"}]},
            "tools": ["search_notes", "send_notification"],
            "require_approval": ["send_notification"],
        },
        user=user,
        create=True,
        team=team,
    )
    return agent


def hourly(agent, owner, name="hourly") -> Schedule:
    return Schedule.objects.create(
        name=name,
        agent=agent,
        interval_seconds=3600,
        input_template="Look at ${scheduled_time}",
        owner=owner,
    )


def schedule_form(agent, **changes) -> dict:
    return {
        "name": "nightly",
        "agent": agent.pk,
        "version": "",
        "cron": "0 7 * * 1-5",
        "interval_seconds": "",
        "time_zone": "Europe/Berlin",
        "overlap": "skip",
        "catchup_window_seconds": "3600",
        "input_template": "Summarise ${scheduled_date}",
        **changes,
    }


@pytest.fixture
def alpha(two_teams, member):
    """Alpha's author and operator (every role), its viewer, its agent;
    Bravo's agent, schedule and trigger."""
    alpha_team, bravo_team = two_teams
    olga = member("olga", alpha_team)
    bob = member("bob", bravo_team)
    bravo_agent = agent_of(bravo_team, bob, "bravo-agent")
    return {
        "team": alpha_team,
        "olga": olga,
        "viewer": member("vic", alpha_team, Role.VIEWER),
        "agent": (agent := agent_of(alpha_team, olga, "alpha-agent")),
        "schedule": hourly(agent, olga, "olgas-hourly"),
        "bravo_schedule": hourly(bravo_agent, bob, "bravo-hourly"),
        "bravo_trigger": EventTrigger.objects.create(
            name="bravo-alerts", agent=bravo_agent, input_template="${x}", owner=bob
        ),
    }


def test_an_operator_pauses_and_resumes_a_schedule_each_a_log_entry(alpha):
    olga = client_of(alpha["olga"])
    add_page = olga.get(f"{SCHEDULES}add/").content.decode()
    assert "alpha-agent" in add_page and "bravo-agent" not in add_page  # G22
    # Another team's agent is no choice; the owner is whoever saves it.
    refused = olga.post(f"{SCHEDULES}add/", schedule_form(alpha["bravo_schedule"].agent))
    assert "agent" in refused.context["adminform"].form.errors
    added = olga.post(f"{SCHEDULES}add/", schedule_form(alpha["agent"]))
    assert added.status_code == 302, added.context["adminform"].form.errors
    schedule = Schedule.objects.get(name="nightly")
    assert schedule.owner == alpha["olga"] and schedule.paused_at is None

    # A viewer sees the page, without the buttons, and may not pause.
    viewer = client_of(alpha["viewer"])
    seen = viewer.get(f"{SCHEDULES}{schedule.pk}/change/")
    assert seen.status_code == 200 and b"pause-button" not in seen.content
    assert viewer.post(f"{SCHEDULES}{schedule.pk}/pause/").status_code == 403

    page = olga.get(f"{SCHEDULES}{schedule.pk}/change/").content.decode()
    assert 'id="pause-button"' in page and "CET" in page  # next firings, on Berlin's clock
    olga.post(f"{SCHEDULES}{schedule.pk}/pause/", {"note": "release freeze"})
    schedule.refresh_from_db()
    assert schedule.paused_at is not None
    assert schedule.pause_reason == "paused by olga: release freeze"
    page = olga.get(f"{SCHEDULES}{schedule.pk}/change/").content.decode()
    assert "paused by olga: release freeze" in page and 'id="resume-button"' in page
    # Changing it keeps it paused (only the form's fields are written).
    changed = olga.post(
        f"{SCHEDULES}{schedule.pk}/change/",
        schedule_form(alpha["agent"], input_template="Sum up ${scheduled_date}"),
    )
    assert changed.status_code == 302, changed.context["adminform"].form.errors
    schedule.refresh_from_db()
    assert (schedule.input_template, schedule.pause_reason) == (
        "Sum up ${scheduled_date}",
        "paused by olga: release freeze",
    )

    olga.post(f"{SCHEDULES}{schedule.pk}/resume/")
    schedule.refresh_from_db()
    assert schedule.paused_at is None
    logged = LogEntry.objects.filter(object_id=str(schedule.pk)).order_by("pk")
    said = [entry.change_message for entry in logged]
    assert [words for words in said if words.startswith(("Paused", "Resumed"))] == [
        "Paused the schedule. release freeze",
        "Resumed the schedule.",
    ]


def test_resume_is_refused_while_a_run_of_the_schedule_has_a_write_in_doubt(alpha):
    schedule = hourly(alpha["agent"], alpha["olga"])
    run = enqueue(scripted(answer()), submitted_by=alpha["olga"], team=alpha["team"])
    # The run ended on a non-idempotent write whose outcome was never recorded.
    AgentRun.objects.filter(pk=run.pk).update(
        status=RunStatus.FAILED,
        pending_effect=ToolEffect.NON_IDEMPOTENT_WRITE,
        finished_at=timezone.now(),
    )
    Firing.objects.create(
        schedule=schedule, slot=timezone.now(), outcome=FiringOutcome.FIRED, run=run
    )
    fire_due_schedules()  # the scheduler's pass: the schedule pauses itself
    schedule.refresh_from_db()
    assert schedule.paused_at is not None and schedule.paused_for_run_id == run.pk
    olga = client_of(alpha["olga"])

    answered = olga.post(f"{SCHEDULES}{schedule.pk}/resume/", follow=True)
    said = [(message.level_tag, message.message) for message in answered.context["messages"]]
    assert said == [
        ("error", f"Not resumed: run {run.pk} left a write in doubt: reconcile it, then resume.")
    ]
    schedule.refresh_from_db()
    assert schedule.paused_at is not None
    # The page says why it is paused, and links the run.
    assert f"/admin/runs/agentrun/{run.pk}/change/" in answered.content.decode()
    assert not LogEntry.objects.filter(change_message__startswith="Resumed").exists()


def test_a_backfill_previews_then_fires_each_unrecorded_slot_and_the_run_says_so(alpha):
    schedule = hourly(alpha["agent"], alpha["olga"])
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    start, end = hour - timedelta(hours=5), hour - timedelta(hours=1)
    recorded = hour - timedelta(hours=3)
    Firing.objects.create(schedule=schedule, slot=recorded, outcome=FiringOutcome.SKIPPED)
    olga = client_of(alpha["olga"])
    url = f"{SCHEDULES}{schedule.pk}/backfill/"
    # Naive times are read on the schedule's clock (UTC here); bad ones named.
    bad = olga.post(url, {"start": "yesterday", "end": end.isoformat()})
    assert "start" in bad.context["form"].errors
    future = olga.post(url, {"start": start.isoformat(), "end": "2999-01-01 00:00"})
    assert "end" in future.context["form"].errors
    range_ = {"start": start.strftime("%Y-%m-%d %H:%M"), "end": end.strftime("%Y-%m-%d %H:%M")}

    preview = olga.post(url, range_)
    shown = preview.context["preview"]
    assert (shown["runs"], shown["slots"], shown["already_count"]) == (3, 4, 1)
    assert [(write["name"], write["waits"]) for write in shown["writes"]] == [
        ("send_notification", True)
    ]
    assert AgentRun.objects.count() == 0  # a preview starts nothing

    done = olga.post(url, {"start": shown["start"], "end": shown["end"], "confirm": "yes"})
    assert done.status_code == 302 and done["Location"] == f"{SCHEDULES}{schedule.pk}/change/"
    fired = Firing.objects.filter(schedule=schedule, backfill=True).order_by("slot")
    assert [firing.slot for firing in fired] == [
        hour - timedelta(hours=4),
        hour - timedelta(hours=2),
        hour - timedelta(hours=1),
    ]
    assert AgentRun.objects.filter(submitted_via=SubmittedVia.SCHEDULE).count() == 3
    assert LogEntry.objects.filter(change_message__startswith="Backfilling").count() == 1

    page = olga.get(f"/admin/runs/agentrun/{fired[0].run_id}/change/").content.decode()
    slot = (hour - timedelta(hours=4)).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f"/admin/triggers/schedule/{schedule.pk}/change/" in page
    assert "fired by" in page and slot in page and "a backfill, by olga" in page

    # A trigger's run names the trigger and the sender's event id.
    trigger = EventTrigger.objects.create(
        name="alerts", agent=alpha["agent"], input_template="${x}", owner=alpha["olga"]
    )
    run_id = fired[1].run_id
    Firing.objects.filter(pk=fired[1].pk).update(run=None)
    AgentRun.objects.filter(pk=run_id).update(submitted_via=SubmittedVia.TRIGGER)
    TriggerEvent.objects.create(trigger=trigger, event_id="evt-42", run_id=run_id)
    page = olga.get(f"/admin/runs/agentrun/{run_id}/change/").content.decode()
    assert "started by" in page and "evt-42" in page and f"{TRIGGERS}{trigger.pk}/change/" in page


def test_another_teams_schedule_and_trigger_are_missing_and_a_secret_is_the_changers(alpha):
    olga = client_of(alpha["olga"])
    bravo = alpha["bravo_schedule"]
    missing = 987654321
    for page in ("change/", "backfill/", "pause/"):
        theirs = olga.post(f"{SCHEDULES}{bravo.pk}/{page}")
        nobodys = olga.post(f"{SCHEDULES}{missing}/{page}")
        assert theirs.status_code == nobodys.status_code != 200, page
        assert theirs.get("Location", "").replace(str(bravo.pk), "<id>") == nobodys.get(
            "Location", ""
        ).replace(str(missing), "<id>")
    assert b"bravo-hourly" not in olga.get(SCHEDULES).content
    bravo.refresh_from_db()
    assert bravo.paused_at is None
    trigger = alpha["bravo_trigger"]
    answered = olga.get(f"{TRIGGERS}{trigger.pk}/change/", follow=True)
    assert answered.redirect_chain == [("/admin/", 302)]  # "… doesn't exist"
    assert trigger.secret.encode() not in answered.content

    # Alpha's own trigger: its secret and URL to its owner, not to its viewer.
    own = EventTrigger.objects.create(
        name="alerts", agent=alpha["agent"], input_template="${x}", owner=alpha["olga"]
    )
    page = olga.get(f"{TRIGGERS}{own.pk}/change/").content.decode()
    assert own.secret in page and f"http://testserver/api/hooks/{own.path}/" in page
    seen = client_of(alpha["viewer"]).get(f"{TRIGGERS}{own.pk}/change/").content.decode()
    assert own.secret not in seen and "shown to its owner only" in seen


def test_an_author_who_is_no_runner_is_told_saving_makes_them_the_owner(alpha, member):
    """Whoever saves a schedule owns its runs: an author without the runner
    role is refused on the form, naming the role, and nothing is stored."""
    ada = client_of(member("ada", alpha["team"], Role.AUTHOR))
    for page in (f"{SCHEDULES}add/", f"{SCHEDULES}{alpha['schedule'].pk}/change/"):
        answer = ada.post(page, schedule_form(alpha["agent"], name="adas"))
        assert answer.status_code == 200
        errors = answer.context["adminform"].form.non_field_errors()
        assert "ada may not start runs of this agent" in errors[0] and "runner role" in errors[0]
    assert not Schedule.objects.filter(name="adas").exists()
    assert Schedule.objects.get(pk=alpha["schedule"].pk).owner == alpha["olga"]
