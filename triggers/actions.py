"""What people do to schedules — pause, resume, backfill — for the console
and the API alike. Each is recorded in the admin log (who, when, why).

Resuming is refused while one of the schedule's runs has an open question
(a write in doubt not reconciled, a dead letter not resolved): the
schedule would only pause itself again, and G23 says it never fires over
one. A resume starts the schedule afresh: the slots it slept through are
not fired (``active_since``), nor recorded.

A backfill fires every slot of a range that no row records, oldest first,
whatever the overlap policy (the operator asked for these runs), each as
a firing does (G23: one row per slot). Its runs are submitted by the
person who asked for it, who needs the runner role in the agent's team,
and whose budget pays; ``backfill_preview`` says what it would do first.
"""

from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.conf import settings
from django.contrib.admin.models import CHANGE, LogEntry
from django.db import transaction
from django.utils import timezone

from runs.models.vocabulary import ActionResult
from runs.runtime.json_text import shown
from tools.effects import ToolEffect
from tools.registry import effect_for
from triggers import firing
from triggers.models import Firing, Schedule, let_go_of_held_slots, may_start
from triggers.questions import open_question
from triggers.slots import next_slots, slots_between

#: Slots one backfill may fire at most: it starts them in the request.
BACKFILL_MAX_SLOTS = 1000
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)


def _log(user, schedule: Schedule, message: str) -> None:
    LogEntry.objects.log_actions(
        user.pk, [schedule], CHANGE, change_message=message, single_object=True
    )


def pause(schedule: Schedule, user, note: str = "") -> ActionResult:
    with transaction.atomic():
        paused = Schedule.objects.filter(pk=schedule.pk, paused_at__isnull=True).update(
            paused_at=timezone.now(),
            pause_reason=f"paused by {user.get_username()}" + (f": {note}" if note else ""),
            paused_for_run=None,
        )
        if not paused:
            return ActionResult(False, "already_paused", f"schedule {schedule} is paused already")
        let_go_of_held_slots(schedule.pk, "the schedule paused")
        _log(user, schedule, f"Paused the schedule. {note}".strip())
    return ActionResult(True, "paused", f"schedule {schedule} paused")


def resume(schedule: Schedule, user, note: str = "") -> ActionResult:
    question = open_question(schedule.pk)
    if question is not None:
        return ActionResult(False, "open_question", f"not resumed: {question[1]}")
    with transaction.atomic():
        resumed = Schedule.objects.filter(pk=schedule.pk, paused_at__isnull=False).update(
            paused_at=None, pause_reason="", paused_for_run=None, active_since=timezone.now()
        )
        if not resumed:
            return ActionResult(False, "not_paused", f"schedule {schedule} is not paused")
        _log(user, schedule, f"Resumed the schedule. {note}".strip())
    return ActionResult(True, "resumed", f"schedule {schedule} resumed")


@dataclass
class BackfillPreview:
    """What a backfill of (``start``, ``end``] would do."""

    slots: list[datetime]
    #: Slots that a row records already (fired, skipped, refused): left alone.
    already: list[datetime]
    #: The agent version's tools that write, and those of them that wait
    #: for approval before they run.
    writes: list[str] = field(default_factory=list)
    approval_required: list[str] = field(default_factory=list)
    too_many: bool = False

    @property
    def runs(self) -> int:
        return len(self.slots) - len(self.already)


class BackfillRefused(ValueError):
    """Why a backfill is refused, naming the field (``start``, ``end``)."""


def backfill_preview(schedule: Schedule, start: datetime, end: datetime) -> BackfillPreview:
    if start.tzinfo is None or end.tzinfo is None:
        raise BackfillRefused("start: give a time with its offset (2026-12-01T00:00:00Z)")
    if end <= start:
        raise BackfillRefused("end: the range's end is after its start")
    if end > timezone.now():
        raise BackfillRefused("end: a backfill fires slots that are past, not future ones")
    if start < EARLIEST:
        raise BackfillRefused("start: at or after 1970-01-01T00:00:00Z")
    try:
        slots = slots_between(schedule, start, end, limit=BACKFILL_MAX_SLOTS + 1)
    except OverflowError:
        raise BackfillRefused("start: a time a schedule's slots can be computed from") from None
    too_many = len(slots) > BACKFILL_MAX_SLOTS
    slots = slots[:BACKFILL_MAX_SLOTS]
    already = sorted(
        Firing.objects.filter(schedule=schedule, slot__in=slots).values_list("slot", flat=True)
    )
    version = schedule.version or schedule.agent.latest
    tools = list(version.tools) if version else []
    writes = [name for name in tools if effect_for(name) != ToolEffect.READ_ONLY]
    asked = set(version.require_approval if version else []) | set(
        schedule.agent.team.require_approval or []
    )
    return BackfillPreview(
        slots=slots,
        already=already,
        writes=writes,
        approval_required=[name for name in writes if name in asked or _by_policy(name)],
        too_many=too_many,
    )


def _by_policy(name: str) -> bool:
    """Whether the deployment's policy makes ``name`` wait (as the gate reads it)."""
    policy = settings.NRLLM_APPROVAL_REQUIRED_FOR
    effect = effect_for(name)
    if policy == "write":
        return effect != ToolEffect.READ_ONLY
    return policy == "non_idempotent_write" and effect == ToolEffect.NON_IDEMPOTENT_WRITE


def backfill(schedule: Schedule, start: datetime, end: datetime, user) -> ActionResult:
    """Fire the range's unrecorded slots (see the module); refuses a range
    of more than ``BACKFILL_MAX_SLOTS`` slots, a paused schedule, and a
    user who may not start runs of its agent."""
    preview = backfill_preview(schedule, start, end)
    if preview.too_many:
        return ActionResult(
            False,
            "too_many",
            f"the range holds more than {BACKFILL_MAX_SLOTS} slots: backfill a shorter one",
        )
    if not may_start(user, schedule.agent):
        return ActionResult(
            False,
            "forbidden",
            f"a backfill starts runs: it takes the runner role in team "
            f"{shown(schedule.agent.team.slug)}",
        )
    schedule.refresh_from_db(fields=["paused_at", "pause_reason"])
    if schedule.paused_at is not None:
        return ActionResult(False, "paused", f"schedule {schedule} is paused: resume it first")
    # Logged first, once: a backfill cut short (a request timed out) leaves
    # its runs, each with its slot's row, and this entry says who began it;
    # what each slot became is its firing's.
    _log(
        user,
        schedule,
        f"Backfilling {start.isoformat()} to {end.isoformat()}: "
        f"{preview.runs} slot(s) not recorded yet.",
    )
    already = set(preview.already)
    outcomes = [
        firing.fire_slot(schedule.pk, slot, backfilled_by=user)
        for slot in preview.slots
        if slot not in already
    ]
    fired = outcomes.count("fired")
    refused = outcomes.count("refused")
    if "paused" in outcomes:
        return ActionResult(
            False, "paused", f"{fired} run(s) started, then the schedule paused itself"
        )
    return ActionResult(
        True,
        "backfilled",
        f"{fired} run(s) started, {refused} refused, {len(preview.already)} slot(s) skipped "
        "(already recorded)",
    )


def recent_firings(schedule: Schedule, count: int = 10):
    """The last firings with their runs (the schedule's page)."""
    return schedule.firings.select_related("run").order_by("-slot")[:count]


def recent_events(trigger, count: int = 20):
    """The last events accepted, with their runs (the trigger's page)."""
    return trigger.events.select_related("run").order_by("-received_at")[:count]


def next_firing_times(schedule: Schedule, count: int = 5) -> list[datetime]:
    """The next slots of a schedule not paused (none while it is)."""
    if schedule.paused_at is not None:
        return []
    return next_slots(schedule, timezone.now(), count)
