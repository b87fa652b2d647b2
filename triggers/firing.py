"""Firing schedules (G23): each slot at most once, never over a write in
doubt, none silently lost within the catch-up window.

A pass (``fire_due_schedules``) runs beside the reaper — an RQ cron job
(``runs/cron.py``), or the embedded worker's loop — and asks each schedule
not paused what it owes:

- slots older than its catch-up window that no row records are recorded
  as skipped (``missed``), one row each (the oldest of a long downtime
  stands for the ones before it, ``covers``);
- each slot inside the window that no row records is fired, oldest first,
  each in a transaction of its own (``fire_slot``).

A firing's transaction locks the schedule's row (so the overlap policy and
the pause read what the last firing committed), asks whether one of its
runs left an open question (then it pauses the schedule and fires
nothing), applies the overlap policy, inserts the ``Firing`` row and the
run together, and commits both or neither. The row's unique (schedule,
slot) is what makes a slot fire once: a second scheduler inserting the
same slot fails on it and starts nothing; a scheduler killed before its
commit leaves no row, and the next pass fires the slot.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Subquery
from django.utils import timezone

from agents.starting import StartForbidden
from agents.starting import enqueue as start_run
from runs.models import AgentRun
from runs.models.vocabulary import RunStatus, SubmittedVia
from runs.runtime.enqueue_spend import BudgetRefused
from runs.runtime.run_request import InvalidRunRequest
from triggers import metrics
from triggers.models import (
    Firing,
    FiringOutcome,
    Overlap,
    Schedule,
    SkipReason,
    let_go_of_held_slots,
    refuse_a_submitter_who_may_not_start,
)
from triggers.questions import open_question, schedules_asked
from triggers.slots import count_between, is_slot, slots_back_from, slots_between
from triggers.templates import TemplateError, render

logger = logging.getLogger(__name__)

#: A run in flight, for the overlap policy: waiting for a person counts.
IN_FLIGHT = (RunStatus.QUEUED, RunStatus.RUNNING, *RunStatus.waiting())
#: Missed slots recorded one by one at most; older ones are counted.
MISSED_ROWS = 1000
#: Slots a pass fires for one schedule at most (the rest, next pass).
FIRED_PER_PASS = 100
#: A cron expression's slots counted when a downtime is measured, at most
#: (an interval's are counted by arithmetic).
COUNTED_AT_MOST = 100_000
_INSTANT = timedelta(microseconds=1)


@dataclass
class PassReport:
    fired: int = 0
    skipped: int = 0
    buffered: int = 0
    refused: int = 0
    paused: int = 0

    def add(self, outcome: str | None) -> None:
        if outcome is not None:
            setattr(self, outcome, getattr(self, outcome) + 1)

    def summary(self) -> str:
        return (
            f"schedules: {self.fired} fired, {self.skipped} skipped, {self.buffered} buffered, "
            f"{self.refused} refused, {self.paused} paused"
        )


def fire_due_schedules(now: datetime | None = None) -> PassReport:
    """One pass over every schedule not paused (see the module). Its cost
    is a few queries whatever the number of schedules: which have a run
    with an open question (``schedules_asked``), then each schedule with
    its last recorded slot; a schedule with nothing due, nothing held and
    nothing asked costs no more."""
    now = now or timezone.now()
    report = PassReport()
    schedules = list(_with_their_last_slots(Schedule.objects.filter(paused_at__isnull=True)))
    asked = schedules_asked() if schedules else set()
    for schedule in schedules:
        try:
            _owes(schedule, now, report, asked=schedule.pk in asked)
        except Exception:
            # One schedule's failure (its agent's start broken in a way no
            # refusal names) must not stop the others'.
            logger.exception("schedule=%s could not be fired", schedule.pk)
    return report


def fire_schedule(schedule_id: int, now: datetime, report: PassReport | None = None) -> None:
    """The pass for one schedule (``fire_due_schedules``' steps)."""
    schedules = Schedule.objects.filter(pk=schedule_id, paused_at__isnull=True)
    schedule = _with_their_last_slots(schedules).first()
    if schedule is not None:
        asked = open_question(schedule_id) is not None
        _owes(schedule, now, report if report is not None else PassReport(), asked=asked)


def _with_their_last_slots(schedules):
    clock = Firing.objects.filter(schedule=OuterRef("pk"), backfill=False)
    return schedules.annotate(
        # The (schedule, slot) unique index answers each: no scan of the rows.
        last_recorded=Subquery(clock.order_by("-slot").values("slot")[:1]),
        holds_slot=Exists(
            Firing.objects.filter(schedule=OuterRef("pk"), outcome=FiringOutcome.BUFFERED)
        ),
    )


def _owes(schedule: Schedule, now: datetime, report: PassReport, *, asked: bool) -> None:
    if asked and _pause_if_asked(schedule.pk):
        # Paused as soon as a run leaves the question, not at the next slot.
        report.paused += 1
        return
    if schedule.holds_slot:
        report.add(_start_buffered(schedule.pk))
    window_opens = now - timedelta(seconds=schedule.catchup_window_seconds)
    considered_since = max(filter(None, (schedule.active_since, schedule.last_recorded)))
    if considered_since < window_opens:
        report.skipped += _record_missed(schedule, considered_since, window_opens)
    due = slots_between(schedule, max(considered_since, window_opens), now, limit=FIRED_PER_PASS)
    if not due:
        return
    recorded = set(
        Firing.objects.filter(schedule_id=schedule.pk, slot__in=due).values_list("slot", flat=True)
    )
    for slot in due:
        if slot in recorded:
            continue
        outcome = fire_slot(schedule.pk, slot)
        report.add(outcome)
        if outcome == "paused":
            return


def _record_missed(schedule: Schedule, after: datetime, until: datetime) -> int:
    """Record the slots in (``after``, ``until``] as skipped (missed): the
    newest ``MISSED_ROWS`` a row each, the oldest of them standing for the
    ones before it (``covers``). How many rows this pass inserted."""
    kept = []
    for slot in slots_back_from(schedule, until):
        if slot <= after or len(kept) >= MISSED_ROWS:
            break
        kept.append(slot)
    if not kept:
        return 0
    kept.reverse()
    # Slots a backfill (or another pass) recorded stand: the rows go to the others.
    there = set(
        Firing.objects.filter(schedule=schedule, slot__in=kept).values_list("slot", flat=True)
    )
    older = count_between(schedule, after, kept[0] - _INSTANT, limit=COUNTED_AT_MOST)
    rows = [
        Firing(
            schedule=schedule, slot=slot, outcome=FiringOutcome.SKIPPED, reason=SkipReason.MISSED
        )
        for slot in kept
        if slot not in there
    ]
    if not rows:
        return 0
    # The oldest row inserted stands for the slots before it not kept.
    rows[0].covers = older + 1
    Firing.objects.bulk_create(rows, ignore_conflicts=True)
    missed = older + len(rows)
    metrics.skipped(schedule, SkipReason.MISSED, missed)
    logger.warning(
        "schedule=%s %d slot(s) missed up to %s: older than its catch-up window, not fired",
        schedule.pk,
        missed,
        kept[-1].isoformat(),
    )
    return len(rows)


def fire_slot(schedule_id: int, slot: datetime, *, backfilled_by=None) -> str | None:
    """Fire one slot, or record why not; the outcome (``fired``,
    ``skipped``, ``buffered``, ``refused``, ``paused``), or None when
    another scheduler recorded the slot first or the schedule is paused."""
    try:
        with transaction.atomic():
            schedule = (
                Schedule.objects.select_for_update(of=("self",))
                .select_related("agent", "version", "owner")
                .filter(pk=schedule_id)
                .first()
            )
            if schedule is None or schedule.paused_at is not None:
                return None
            # The slot was computed before the lock: a resume's fresh start,
            # or a new timing, may have committed since. Under the lock the
            # schedule is as the firing will see it.
            if backfilled_by is None and slot <= schedule.active_since:
                return None
            if not is_slot(schedule, slot):
                return None
            if Firing.objects.filter(schedule_id=schedule_id, slot=slot).exists():
                return None  # another scheduler's, committed before our lock
            if pause_for_open_question(schedule):
                return "paused"
            if backfilled_by is None and schedule.overlap != Overlap.ALLOW and _in_flight(schedule):
                return _overlapping(schedule, slot)
            firing = Firing.objects.create(
                schedule=schedule,
                slot=slot,
                outcome=FiringOutcome.FIRED,
                backfill=backfilled_by is not None,
            )
            return _start(schedule, firing, submitter=backfilled_by or schedule.owner)
    except IntegrityError:
        # The unique (schedule, slot): another scheduler fired it first.
        return None


def _overlapping(schedule: Schedule, slot: datetime) -> str:
    if (
        schedule.overlap == Overlap.BUFFER_ONE
        and not schedule.firings.filter(outcome=FiringOutcome.BUFFERED).exists()
    ):
        Firing.objects.create(schedule=schedule, slot=slot, outcome=FiringOutcome.BUFFERED)
        metrics.buffered(schedule)
        return "buffered"
    Firing.objects.create(
        schedule=schedule, slot=slot, outcome=FiringOutcome.SKIPPED, reason=SkipReason.OVERLAP
    )
    metrics.skipped(schedule, SkipReason.OVERLAP)
    return "skipped"


def _start_buffered(schedule_id: int) -> str | None:
    """Fire the slot ``buffer_one`` held, once no run is in flight."""
    with transaction.atomic():
        schedule = (
            Schedule.objects.select_for_update(of=("self",))
            .select_related("agent", "version", "owner")
            .filter(pk=schedule_id, paused_at__isnull=True)
            .first()
        )
        if schedule is None:
            return None
        if pause_for_open_question(schedule):
            return "paused"
        firing = schedule.firings.filter(outcome=FiringOutcome.BUFFERED).first()
        if firing is None or _in_flight(schedule):
            return None
        if firing.slot <= schedule.active_since or not is_slot(schedule, firing.slot):
            # Held under a timing the schedule no longer has (a change
            # committed since): no longer owed.
            let_go_of_held_slots(schedule.pk, "the timing changed")
            return None
        # The schedule's lock is held: no other scheduler is here.
        Firing.objects.filter(pk=firing.pk).update(outcome=FiringOutcome.FIRED)
        firing.outcome = FiringOutcome.FIRED
        return _start(schedule, firing, submitter=schedule.owner)


def _pause_if_asked(schedule_id: int) -> bool:
    if open_question(schedule_id) is None:
        return False  # the common case, without a lock
    with transaction.atomic():
        schedule = Schedule.objects.select_for_update().filter(pk=schedule_id).first()
        if schedule is None or schedule.paused_at is not None:
            return False
        return pause_for_open_question(schedule)


def _in_flight(schedule: Schedule) -> bool:
    return AgentRun.objects.filter(firing__schedule=schedule, status__in=IN_FLIGHT).exists()


def _start(schedule: Schedule, firing: Firing, *, submitter) -> str:
    """Start the firing's run in the caller's transaction, or record the
    refusal on the firing (nothing else stored)."""
    local = firing.slot.astimezone(ZoneInfo(schedule.time_zone))
    context = {
        "scheduled_time": local.isoformat(),
        "scheduled_date": local.date().isoformat(),
        "schedule": schedule.name,
    }
    start = {"agent": schedule.agent.name}
    if schedule.version_id is not None:
        start["version"] = schedule.version.number
    try:
        refuse_a_submitter_who_may_not_start(submitter, schedule.agent)
        start["input"] = render(schedule.input_template, context, what="schedule")
        with transaction.atomic():
            run = start_run(start, submitted_by=submitter, submitted_via=SubmittedVia.SCHEDULE)
    except (TemplateError, InvalidRunRequest, BudgetRefused, StartForbidden) as refusal:
        Firing.objects.filter(pk=firing.pk).update(
            outcome=FiringOutcome.REFUSED, reason=str(refusal)[:2000]
        )
        metrics.refused(schedule)
        logger.warning("schedule=%s slot=%s refused: %s", schedule.pk, firing.slot, refusal)
        return "refused"
    Firing.objects.filter(pk=firing.pk).update(run=run)
    metrics.fired(schedule)
    logger.info("schedule=%s slot=%s run=%s fired", schedule.pk, firing.slot.isoformat(), run.pk)
    return "fired"


def pause_for_open_question(schedule: Schedule) -> bool:
    """Pause ``schedule`` (locked by the caller) if one of its runs left
    an open question (``triggers.questions``); whether it did."""
    question = open_question(schedule.pk)
    if question is None:
        return False
    run, why = question
    Schedule.objects.filter(pk=schedule.pk, paused_at__isnull=True).update(
        paused_at=timezone.now(), pause_reason=why, paused_for_run=run.pk
    )
    let_go_of_held_slots(schedule.pk, "the schedule paused")
    schedule.paused_at = timezone.now()
    metrics.paused(schedule)
    logger.warning("schedule=%s paused itself: %s", schedule.pk, why)
    return True
