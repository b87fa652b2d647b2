"""A schedule fires once per slot, never over a write in doubt (G23).

The slots of one schedule are decided against a real PostgreSQL: the
catch-up window and the overlap policies by passes given their clock
(``fire_schedule(id, now)``), as the reaper takes an ``as_of``; exactly
once under racing and dying schedulers by real ``rqcron`` and ``rqworker``
processes; the pause over a write in doubt with the scripted provider and
with a model that words each answer differently."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.admin.models import LogEntry
from django.utils import timezone

from agents.versions import save_agent
from runs.models import AgentRun
from runs.models.vocabulary import RunStatus, SubmittedVia
from runs.operators import actions as operator_actions
from runs.runtime import run_queued
from teams.models import DEFAULT_TEAM_ID, Team
from tests.drifting_model import MODELS, plan_prompt
from tests.helpers import answer, call, fresh, inserts_held, wait_until
from triggers import actions
from triggers.firing import fire_schedule
from triggers.models import Firing, FiringOutcome, Schedule
from triggers.slots import next_slots

pytestmark = pytest.mark.django_db(transaction=True)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def scripted_agent(name="nightly", *turns, tools=()):
    agent, _, _ = save_agent(
        name,
        {
            "provider": {"kind": "scripted", "turns": list(turns) or [answer("digest done")]},
            "tools": list(tools),
        },
        create=True,
        team=Team.objects.get(pk=DEFAULT_TEAM_ID),
    )
    return agent


def schedule_of(agent, owner, **fields) -> Schedule:
    fields = {
        "name": "every-2s",
        "interval_seconds": 2,
        "input_template": "digest for ${scheduled_time}",
        "overlap": "allow",
        **fields,
    }
    schedule = Schedule(agent=agent, owner=owner, **fields)
    schedule.full_clean()
    schedule.save()
    return schedule


def aligned(seconds: int = 2) -> datetime:
    """Now, on a slot of an interval of ``seconds``."""
    now = int((timezone.now() - EPOCH).total_seconds())
    return EPOCH + timedelta(seconds=now - now % seconds)


def since(schedule: Schedule, moment: datetime) -> None:
    """Consider the schedule's slots from ``moment`` (as a schedule created then)."""
    Schedule.objects.filter(pk=schedule.pk).update(active_since=moment)


def outcomes(schedule: Schedule) -> list[tuple]:
    return list(
        schedule.firings.order_by("slot").values_list("slot", "outcome", "reason", "covers")
    )


def test_a_downtime_of_ten_slots_inside_a_window_of_five_fires_five_and_records_five(operator):
    schedule = schedule_of(scripted_agent(), operator, catchup_window_seconds=10)
    now = aligned()
    since(schedule, now - timedelta(seconds=20))  # down since: 10 slots owed

    fire_schedule(schedule.pk, now)

    slots = [now - timedelta(seconds=2 * back) for back in range(9, -1, -1)]
    assert outcomes(schedule) == [(slot, "skipped", "missed", 1) for slot in slots[:5]] + [
        (slot, "fired", "", 1) for slot in slots[5:]
    ]
    runs = AgentRun.objects.filter(firing__schedule=schedule).order_by("firing__slot")
    assert [run.status for run in runs] == ["completed"] * 5
    assert {(run.submitted_by_id, run.submitted_via) for run in runs} == {
        (operator.pk, SubmittedVia.SCHEDULE)
    }
    # Its input carries the slot it was fired for, in the schedule's zone.
    assert runs[0].prompt == f"digest for {slots[5].isoformat()}"

    # Passes again, or by another scheduler: nothing owed, nothing more.
    fire_schedule(schedule.pk, now)
    fire_schedule(schedule.pk, now + timedelta(seconds=1))
    assert schedule.firings.count() == 10 and runs.count() == 5

    # A downtime longer than the rows kept one by one: the oldest row kept
    # stands for the slots before it.
    from triggers import firing

    later = now + timedelta(seconds=2 * (firing.MISSED_ROWS + 20))
    fire_schedule(schedule.pk, later)
    missed = schedule.firings.filter(slot__gt=now, reason="missed")
    assert missed.count() == firing.MISSED_ROWS
    assert sum(missed.values_list("covers", flat=True)) == firing.MISSED_ROWS + 15


@pytest.mark.parametrize("overlap", ["skip", "buffer_one"])
def test_skip_and_buffer_one_hold_while_the_last_run_is_in_flight(queue, operator, overlap):
    """The run stays queued (no worker) over three slots: in flight."""
    schedule = schedule_of(scripted_agent(), operator, overlap=overlap)
    now = aligned()
    since(schedule, now - timedelta(seconds=1))

    for seconds in (0, 2, 4, 6):
        fire_schedule(schedule.pk, now + timedelta(seconds=seconds))

    first = AgentRun.objects.get(firing__schedule=schedule)
    held = ["skipped"] * 3 if overlap == "skip" else ["buffered", "skipped", "skipped"]
    assert [row[1] for row in outcomes(schedule)] == ["fired", *held]
    assert set(schedule.firings.filter(outcome="skipped").values_list("reason", flat=True)) == {
        "overlap"
    }

    run_queued(first.pk)  # the slow run ends
    assert fresh(first).status == RunStatus.COMPLETED
    fire_schedule(schedule.pk, now + timedelta(seconds=7))  # no new slot

    fired = schedule.firings.filter(outcome="fired").order_by("slot")
    if overlap == "skip":
        assert fired.count() == 1
    else:
        # The buffered slot fires once the run in flight ended, and only it.
        assert [firing.slot for firing in fired] == [now, now + timedelta(seconds=2)]
        assert fired.last().run.status == RunStatus.QUEUED


@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_run_that_leaves_a_write_in_doubt_pauses_its_schedule_until_reconciled(
    model, operator, settings
):
    settings.NRLLM_TOOLS = ["tests.tools_for_tests.UnsureWrite"]
    plan = [
        {"calls": [{"name": "unsure_write", "arguments": {"text": "page on-call (take {take})"}}]},
        {"answer": "Paged (take {take})."},
    ]
    if model is None:
        agent = scripted_agent(
            "pager",
            call("unsure_write", text="page on-call"),
            answer("Paged."),
            tools=["unsure_write"],
        )
        template = "page for ${scheduled_time}"
    else:
        agent, _, _ = save_agent(
            "pager",
            {"provider": {"kind": "openai", "model": "drifting"}, "tools": ["unsure_write"]},
            create=True,
        )
        template = plan_prompt("page for ${scheduled_time}", plan)
    schedule = schedule_of(agent, operator, input_template=template)
    now = aligned()
    since(schedule, now - timedelta(seconds=1))

    fire_schedule(schedule.pk, now)  # its run ends with the write in doubt
    [in_doubt] = AgentRun.objects.filter(firing__schedule=schedule)
    assert (fresh(in_doubt).status, fresh(in_doubt).termination_reason) == (
        "failed",
        "write_interrupted",
    )
    fire_schedule(schedule.pk, now + timedelta(seconds=2))
    fire_schedule(schedule.pk, now + timedelta(seconds=4))

    schedule.refresh_from_db()
    assert schedule.paused_at is not None and schedule.paused_for_run_id == in_doubt.pk
    assert f"run {in_doubt.pk} left a write in doubt" in schedule.pause_reason
    assert schedule.firings.count() == 1  # nothing fired over it

    refused = actions.resume(schedule, operator, "try again")
    assert (refused.ok, refused.code) == (False, "open_question")
    assert operator_actions.reconcile(fresh(in_doubt), operator, "applied", "paged once").ok
    assert actions.resume(schedule, operator, "reconciled").ok
    assert LogEntry.objects.filter(object_id=str(schedule.pk)).count() == 1

    # It fires again from the resume on; the slots it slept through stay unfired.
    resumed_at = Schedule.objects.get(pk=schedule.pk).active_since
    fire_schedule(schedule.pk, resumed_at + timedelta(seconds=2))
    assert schedule.firings.filter(outcome="fired").count() == 2
    assert not schedule.firings.filter(slot__gt=now, slot__lte=resumed_at).exists()
    if model is not None:
        assert model.requests_by_turn[0] >= 2  # each run's model words it anew


def test_a_dst_change_fires_as_debians_cron_does(operator):
    """Europe/Berlin: 2026-03-29 02:00 → 03:00, 2026-10-25 03:00 → 02:00."""
    berlin = ZoneInfo("Europe/Berlin")
    daily = Schedule(agent=scripted_agent(), cron="30 2 * * *", time_zone="Europe/Berlin")

    def local(slots):
        return [slot.astimezone(berlin).isoformat() for slot in slots]

    # Forward: the skipped 02:30 fires at the first instant after the change.
    assert local(next_slots(daily, datetime(2026, 3, 28, 12, tzinfo=berlin), 2)) == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]
    # Back: the repeated 02:30 fires once, at its first occurrence; asked
    # from the second pass of the hour, the next is the next day's.
    assert local(next_slots(daily, datetime(2026, 10, 24, 12, tzinfo=berlin), 2)) == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]
    second_pass = datetime(2026, 10, 25, 2, 5, fold=1, tzinfo=berlin)
    assert local(next_slots(daily, second_pass, 1)) == ["2026-10-26T02:30:00+01:00"]
    # A frequent expression fires in both passes of the repeated hour: each
    # pass's 02:20 is an instant, and a slot of its own, fired once.
    schedule = schedule_of(
        daily.agent,
        operator,
        name="every-20-minutes",
        cron="*/20 * * * *",
        interval_seconds=None,
        time_zone="Europe/Berlin",
        catchup_window_seconds=24 * 3600,
    )
    since(schedule, datetime(2026, 10, 25, 1, 50, tzinfo=berlin))
    fire_schedule(schedule.pk, datetime(2026, 10, 25, 3, 0, tzinfo=berlin))
    fired = [slot for slot, outcome, _, _ in outcomes(schedule) if outcome == "fired"]
    assert local(fired) == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:20:00+02:00",
        "2026-10-25T02:40:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T02:20:00+01:00",
        "2026-10-25T02:40:00+01:00",
        "2026-10-25T03:00:00+01:00",
    ]


@pytest.mark.worker
@pytest.mark.slow
def test_each_slot_fires_once_with_two_schedulers_racing_and_one_killed_mid_firing(
    workers, operator
):
    """Two ``rqcron`` processes enqueue the schedules' pass every second,
    two workers run the passes; then a firing is held inside its
    transaction (a trigger on the firing's INSERT waits on a lock the test
    holds), its workers are SIGKILLed, and new ones take over. Every slot
    from the first to the last has exactly one row, every row a run: none
    fired twice, none left without one."""
    schedule = schedule_of(scripted_agent(), operator, catchup_window_seconds=60)
    env = {"NRLLM_SCHEDULE_INTERVAL_SECONDS": "1", "NRLLM_REAPER_INTERVAL_SECONDS": "60"}
    for _ in range(2):
        workers.start_command("rqcron", "runs.cron", **env)
    first = [workers.start(**env), workers.start(**env)]
    fired = Firing.objects.filter(schedule=schedule, outcome=FiringOutcome.FIRED)
    wait_until(lambda: fired.count() >= 3, timeout=60, what="three slots fired")

    with inserts_held(Firing, "NEW.outcome = 'fired'") as (waiting, end_the_wait):
        wait_until(lambda: waiting(), timeout=30, what="a firing held mid-transaction")
        for worker in first:
            workers.kill(worker)
        end_the_wait()  # as the server does once it notices its client died
        killed_at = timezone.now()
    [workers.start(**env) for _ in range(2)]
    wait_until(
        lambda: fired.filter(slot__gt=killed_at + timedelta(seconds=4)).exists(),
        timeout=60,
        what="slots fired after the kill",
    )
    workers.stop_all()

    rows = list(schedule.firings.order_by("slot"))
    slots = [row.slot for row in rows]
    assert slots == [slots[0] + timedelta(seconds=2 * n) for n in range(len(slots))]
    assert {row.outcome for row in rows} == {"fired"} and all(row.run_id for row in rows)
    runs = AgentRun.objects.filter(submitted_via=SubmittedVia.SCHEDULE)
    assert runs.count() == len(rows) == len({row.run_id for row in rows})


@pytest.mark.worker
@pytest.mark.slow
def test_skip_and_buffer_one_never_overlap_a_slow_run_on_real_workers(workers, operator):
    """Runs of 3 s on a schedule every second, fired by ``rqcron`` and run
    by a worker with slots to spare: under ``skip`` and ``buffer_one`` no
    run of a schedule is created before the one before it ended, and
    ``buffer_one`` fires a slot held while one ran."""
    agent = scripted_agent("slow-digest", {"content": "done", "delay_seconds": 3})
    skip = schedule_of(agent, operator, name="skip", interval_seconds=1, overlap="skip")
    buffer = schedule_of(agent, operator, name="buffer", interval_seconds=1, overlap="buffer_one")
    env = {"NRLLM_SCHEDULE_INTERVAL_SECONDS": "1", "NRLLM_REAPER_INTERVAL_SECONDS": "60"}
    workers.start_command("rqcron", "runs.cron", **env)
    workers.start(**env)
    ended = AgentRun.objects.filter(status=RunStatus.COMPLETED)
    wait_until(
        lambda: all(ended.filter(firing__schedule=each).count() >= 2 for each in (skip, buffer)),
        timeout=90,
        what="two runs of each schedule ended",
    )
    workers.stop_all()

    for schedule in (skip, buffer):
        runs = list(AgentRun.objects.filter(firing__schedule=schedule).order_by("created_at"))
        for before, after in zip(runs, runs[1:], strict=False):
            assert before.finished_at is not None and after.created_at >= before.finished_at
        assert schedule.firings.filter(outcome="skipped", reason="overlap").exists()
    # The slot after the first run came while it ran, was held, and fired
    # once it ended: buffer_one's second run is for a slot before that end.
    first, second = AgentRun.objects.filter(firing__schedule=buffer).order_by("created_at")[:2]
    assert second.firing.slot < first.finished_at <= second.created_at


def test_a_pause_stands_against_a_stale_save_and_slots_from_before_a_resume_never_fire(
    queue, operator
):
    """A form or a PATCH read the schedule before a pause committed: its
    save changes the definition and leaves the pause. A slot a pass
    computed before a resume, or a slot ``buffer_one`` held before a pause,
    does not fire after it."""
    schedule = schedule_of(scripted_agent(), operator, overlap="buffer_one")
    now = aligned()
    since(schedule, now - timedelta(seconds=1))
    fire_schedule(schedule.pk, now)  # fired; its run stays queued
    fire_schedule(schedule.pk, now + timedelta(seconds=2))  # held: buffered
    stale = Schedule.objects.get(pk=schedule.pk)

    assert actions.pause(schedule, operator, "maintenance").ok
    stale.input_template = "changed while paused: ${scheduled_time}"
    stale.save()
    saved = Schedule.objects.get(pk=schedule.pk)
    assert saved.paused_at is not None and saved.input_template.startswith("changed")
    assert [row[1:3] for row in outcomes(schedule)][1] == (
        "skipped",
        "overlap: held, then the schedule paused",
    )

    assert actions.resume(saved, operator, "done").ok
    since(schedule, now + timedelta(seconds=10))  # as if it resumed then
    run_queued(AgentRun.objects.get(firing__schedule=schedule).pk)
    from triggers.firing import fire_slot

    asleep = now + timedelta(seconds=6)  # a pass computed it before the resume
    assert fire_slot(schedule.pk, asleep) is None
    assert fire_slot(schedule.pk, asleep + timedelta(seconds=1)) is None  # not a slot
    assert schedule.firings.filter(outcome="fired").count() == 1


def test_a_pass_over_idle_schedules_costs_the_same_few_queries_however_many(operator):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from triggers.firing import fire_due_schedules

    agent = scripted_agent()

    def queries_of_a_pass(count: int) -> int:
        for n in range(Schedule.objects.count(), count):
            schedule_of(
                agent, operator, name=f"yearly-{n}", cron="0 0 1 1 *", interval_seconds=None
            )
        with CaptureQueriesContext(connection) as captured:
            fire_due_schedules()
        return len(captured)

    assert queries_of_a_pass(5) == queries_of_a_pass(40) <= 4


def test_a_slot_held_under_an_old_timing_is_let_go_when_the_timing_changes(queue, operator):
    schedule = schedule_of(scripted_agent(), operator, overlap="buffer_one")
    now = aligned()
    since(schedule, now - timedelta(seconds=1))
    fire_schedule(schedule.pk, now)
    fire_schedule(schedule.pk, now + timedelta(seconds=2))  # held
    retimed = Schedule.objects.get(pk=schedule.pk)
    retimed.interval_seconds = 3600
    retimed.save()
    run_queued(AgentRun.objects.get(firing__schedule=schedule).pk)
    fire_schedule(schedule.pk, now + timedelta(seconds=3))
    assert [row[1:3] for row in outcomes(schedule)] == [
        ("fired", ""),
        ("skipped", "overlap: held, then the timing changed"),
    ]
