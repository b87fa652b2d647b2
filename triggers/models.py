"""Schedules and event triggers, and what each firing left (G23).

A ``Schedule`` starts runs of its agent at the slots of a cron expression
or an interval; each slot it considered is one ``Firing`` row, unique by
(schedule, slot): fired (with its run), held for later (``buffered``),
skipped (and why) or refused (the start was refused, and why). The unique
row, not a lock, is what makes a slot fire at most once: two schedulers
racing, or one killed mid-firing, insert it in the transaction that inserts
the run, or not at all.

An ``EventTrigger`` starts a run for each signed event another system POSTs
to it; each accepted event is one ``TriggerEvent``, unique by (trigger,
sender's event id) while it is within the trigger's window: a sender that
sends it again gets the same run back.

Both belong to their agent's team (G22), and their runs are submitted by
their ``owner``: the owner's budget pays, and four-eyes keeps the owner from
approving their own schedule's or trigger's writes.
"""

import base64
import secrets

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

from agents.models import Agent, AgentVersion
from runs.models import AgentRun
from teams import access
from triggers.slots import check_timing
from triggers.templates import TemplateError, check_template

#: A trigger's least dedup window, and least secret.
MIN_WINDOW = 60
MIN_KEY_BYTES = 16
#: What a schedule's input template may name.
SCHEDULE_PLACEHOLDERS = ("scheduled_time", "scheduled_date", "schedule")
START_RUNS = "runs.add_agentrun"


def may_start(user, agent) -> bool:
    """Whether ``user`` may submit runs of ``agent``: an active user with
    the runner role in its team (what an owner and a backfiller need)."""
    return user.is_active and access.may(user, START_RUNS, agent.team_id)


def refuse_a_submitter_who_may_not_start(submitter, agent) -> None:
    """``StartForbidden`` naming the submitter when ``submitter`` (an owner,
    or who asked for a backfill) no longer holds the runner role in the
    agent's team, or is no active user: their runs are not started (G23)."""
    if may_start(submitter, agent):
        return
    from agents.starting import StartForbidden

    raise StartForbidden(
        f"{submitter.get_username()} may no longer start runs of agent {agent.name}: "
        f"the runner role in team {agent.team.slug!r} is needed"
    )


def _check_start(model) -> None:
    """What a schedule and a trigger share: the version is the agent's,
    and the owner may start its runs (the runner role in its team)."""
    if model.version_id is not None and model.version.agent_id != model.agent_id:
        raise ValidationError({"version": "a version of the schedule's own agent"})
    if model.owner_id is not None and model.agent_id is not None:
        if not may_start(model.owner, model.agent):
            raise ValidationError(
                {
                    "owner": f"{model.owner.get_username()} may not start runs of this agent, "
                    f"and whoever saves it owns its runs: the runner role in team "
                    f"{model.agent.team.slug!r} is needed"
                }
            )


class Overlap(models.TextChoices):
    """What a slot does while the schedule's last run is in flight
    (queued, running or waiting for a person). None cancels a run."""

    SKIP = "skip", "skip: do not fire while the last run is in flight"
    BUFFER_ONE = "buffer_one", "buffer one: fire once after it ends, skip the rest"
    ALLOW = "allow", "allow: fire beside it"


class FiringOutcome(models.TextChoices):
    FIRED = "fired"  # its run was started (``run``)
    BUFFERED = "buffered"  # held until the run in flight ends (buffer_one)
    SKIPPED = "skipped"  # not fired: ``reason`` says why
    REFUSED = "refused"  # the start was refused (``reason``: the refusal)


class SkipReason(models.TextChoices):
    MISSED = "missed", "missed: older than the catch-up window when the scheduler came to it"
    OVERLAP = "overlap", "overlap: the last run was still in flight"


class Schedule(models.Model):
    TEAM_FIELD = "agent__team"

    name = models.SlugField(max_length=100)
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="schedules")
    #: Pinned; empty: the agent's latest version at each firing.
    version = models.ForeignKey(
        AgentVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    #: A cron expression (five fields, read by cronsim) or ``interval_seconds``.
    cron = models.CharField(max_length=200, blank=True)
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    #: The IANA time zone the cron expression is read in.
    time_zone = models.CharField(max_length=64, default="UTC")
    #: The run's input; ``${scheduled_time}``, ``${scheduled_date}`` and
    #: ``${schedule}`` are replaced (``triggers.templates``).
    input_template = models.TextField()
    overlap = models.CharField(max_length=16, choices=Overlap.choices, default=Overlap.SKIP)
    #: After downtime, a missed slot at most this old fires; an older one is
    #: recorded as skipped (``missed``).
    catchup_window_seconds = models.PositiveIntegerField(default=3600)
    #: Who its runs are submitted by (their budget, four-eyes).
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    #: Slots before it are never considered: its creation, its last resume,
    #: or the last change of its timing.
    active_since = models.DateTimeField(editable=False)
    paused_at = models.DateTimeField(null=True, blank=True)
    #: Why it is paused: an operator's note, or what paused it by itself.
    pause_reason = models.TextField(blank=True)
    #: The run whose write in doubt (or dead letter) paused it.
    paused_for_run = models.ForeignKey(
        AgentRun,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["agent__name", "name"]
        permissions = [("pause_schedule", "Can pause and resume a schedule")]
        constraints = [
            models.UniqueConstraint(fields=["agent", "name"], name="schedule_name_unique"),
            models.CheckConstraint(
                condition=(Q(cron="") & Q(interval_seconds__gte=1))
                | (~Q(cron="") & Q(interval_seconds__isnull=True)),
                name="schedule_cron_or_interval",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent.name}/{self.name}"

    def save(self, *args, **kwargs):
        """A new schedule, or one whose timing changed, considers slots from
        now on: it never fires the past of a timing it did not have.

        Saving an existing schedule writes its definition only, never its
        state (``paused_at``, ``pause_reason``, ``paused_for_run``,
        ``active_since`` but for a new timing): a form or a PATCH read the
        row before a pause, or a resume's fresh start, committed, and
        writing the row back whole would undo it. A slot held for
        ``buffer_one`` is let go when the policy changes (recorded as
        skipped), so it cannot fire long after its time."""
        if self._state.adding:
            self.active_since = self.active_since or timezone.now()
            return super().save(*args, **kwargs)
        before = (
            Schedule.objects.filter(pk=self.pk)
            .values("cron", "interval_seconds", "time_zone", "overlap")
            .first()
        )
        given = kwargs.pop("update_fields", None)
        fields = set(DEFINITION_FIELDS if given is None else given)
        if not fields:
            return None  # as Django's save(update_fields=[]): nothing
        fields.add("updated_at")
        retimed = before is not None and (
            before["cron"],
            before["interval_seconds"],
            before["time_zone"],
        ) != (self.cron, self.interval_seconds, self.time_zone)
        if retimed:
            self.active_since = timezone.now()
            fields.add("active_since")
        super().save(*args, update_fields=sorted(fields), **kwargs)
        if retimed:
            let_go_of_held_slots(self.pk, "the timing changed")
        elif before and before["overlap"] != self.overlap:
            let_go_of_held_slots(self.pk, "the overlap policy changed")

    def clean(self) -> None:
        check_timing(self.cron, self.interval_seconds, self.time_zone)
        try:
            named = check_template(self.input_template)
        except TemplateError as error:
            raise ValidationError({"input_template": str(error)}) from None
        unknown = sorted(set(named) - set(SCHEDULE_PLACEHOLDERS))
        if unknown:
            raise ValidationError(
                {
                    "input_template": f"a schedule's template may name "
                    f"{', '.join('${' + name + '}' for name in SCHEDULE_PLACEHOLDERS)}; "
                    f"not {', '.join('${' + name + '}' for name in unknown)}"
                }
            )
        if self.catchup_window_seconds is not None and self.catchup_window_seconds < 1:
            raise ValidationError({"catchup_window_seconds": "at least 1 second"})
        _check_start(self)

    @property
    def timing(self) -> str:
        if self.cron:
            return f"{self.cron} ({self.time_zone})"
        return f"every {self.interval_seconds} s"


#: What a change of a schedule writes (``Schedule.save``): never its state.
DEFINITION_FIELDS = (
    "name",
    "version",
    "cron",
    "interval_seconds",
    "time_zone",
    "input_template",
    "overlap",
    "catchup_window_seconds",
    "owner",
)


def let_go_of_held_slots(schedule_id, why: str) -> None:
    """Record the slot ``buffer_one`` held as skipped (``why``): after a
    pause, a resume or a change of policy it is no longer owed."""
    Firing.objects.filter(schedule_id=schedule_id, outcome=FiringOutcome.BUFFERED).update(
        outcome=FiringOutcome.SKIPPED, reason=f"{SkipReason.OVERLAP}: held, then {why}"
    )


class Firing(models.Model):
    TEAM_FIELD = "schedule__agent__team"

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="firings")
    #: The scheduled time (UTC), whatever time it was fired at.
    slot = models.DateTimeField()
    outcome = models.CharField(max_length=16, choices=FiringOutcome.choices)
    #: Skipped: a ``SkipReason``; refused: the refusal, as the start said it.
    reason = models.TextField(blank=True)
    #: How many slots the row stands for: 1, or, for the oldest of a long
    #: downtime's missed slots, those older ones not recorded one by one.
    covers = models.PositiveIntegerField(default=1)
    #: Its run outlives retention as a name (no database constraint), as a
    #: reconciliation's does: a slot once fired stays fired.
    run = models.OneToOneField(
        AgentRun,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="firing",
    )
    #: Fired by a backfill, not by the clock.
    backfill = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["schedule", "-slot"]
        constraints = [
            # G23: one row per slot, whatever schedulers race or die.
            models.UniqueConstraint(fields=["schedule", "slot"], name="firing_one_per_slot"),
        ]

    def __str__(self) -> str:
        return f"{self.schedule} at {self.slot:%Y-%m-%d %H:%M:%S}"


class SignatureScheme(models.TextChoices):
    STANDARD_WEBHOOKS = (
        "standard_webhooks",
        "Standard Webhooks: webhook-id, webhook-timestamp, webhook-signature",
    )
    GITHUB = "github", "GitHub: X-Hub-Signature-256 (sha256=, hex), no timestamp"


def new_trigger_path() -> str:
    return secrets.token_urlsafe(18)


def new_trigger_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


class EventTrigger(models.Model):
    TEAM_FIELD = "agent__team"

    name = models.SlugField(max_length=100)
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="event_triggers")
    version = models.ForeignKey(
        AgentVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    #: The unguessable part of its URL, ``/hooks/<path>/``.
    path = models.CharField(max_length=40, unique=True, default=new_trigger_path, editable=False)
    scheme = models.CharField(
        max_length=20, choices=SignatureScheme.choices, default=SignatureScheme.STANDARD_WEBHOOKS
    )
    #: The HMAC key: ``whsec_`` and base64 (Standard Webhooks), the text as
    #: it is for GitHub.
    secret = models.CharField(max_length=200, default=new_trigger_secret)
    #: Where the sender's event id is: a header (``webhook-id``,
    #: ``X-GitHub-Delivery``), or a template of the body's fields
    #: (``${groupKey}/${alerts.0.startsAt}``) when ``event_id_template`` is set.
    event_id_header = models.CharField(max_length=100, blank=True, default="webhook-id")
    event_id_template = models.CharField(max_length=500, blank=True)
    #: An event id seen within it is the same event: its run is answered.
    dedup_window_seconds = models.PositiveIntegerField(default=7 * 24 * 3600)
    input_template = models.TextField()
    max_events_per_minute = models.PositiveIntegerField(default=60)
    enabled = models.BooleanField(default=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["agent__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["agent", "name"], name="event_trigger_name_unique"),
            models.CheckConstraint(
                condition=~Q(event_id_header="") | ~Q(event_id_template=""),
                name="event_trigger_has_event_id",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent.name}/{self.name}"

    def clean(self) -> None:
        for name in ("input_template", "event_id_template"):
            try:
                check_template(getattr(self, name))
            except TemplateError as error:
                raise ValidationError({name: str(error)}) from None
        if not self.event_id_header and not self.event_id_template:
            raise ValidationError(
                {
                    "event_id_header": "name the header that carries the sender's event id, "
                    "or give an event id template"
                }
            )
        if self.dedup_window_seconds is not None and self.dedup_window_seconds < MIN_WINDOW:
            raise ValidationError(
                {
                    "dedup_window_seconds": f"at least {MIN_WINDOW} s: shorter, a sender's retry "
                    "would start a second run"
                }
            )
        if self.max_events_per_minute is not None and self.max_events_per_minute < 1:
            raise ValidationError({"max_events_per_minute": "at least 1 (disable it instead)"})
        from triggers.signatures import key_bytes

        try:
            key = key_bytes(self.scheme, self.secret)
        except ValueError as error:
            raise ValidationError({"secret": str(error)}) from None
        if len(key) < MIN_KEY_BYTES:
            raise ValidationError(
                {"secret": f"at least {MIN_KEY_BYTES} bytes of key: a shorter one can be guessed"}
            )
        _check_start(self)


class TriggerEvent(models.Model):
    """One event accepted: its run, or why its start was refused."""

    TEAM_FIELD = "trigger__agent__team"

    trigger = models.ForeignKey(EventTrigger, on_delete=models.CASCADE, related_name="events")
    event_id = models.CharField(max_length=500)
    received_at = models.DateTimeField(auto_now_add=True)
    #: Set once the window has passed and the same id came again: the id
    #: then belongs to the newer event.
    expired = models.BooleanField(default=False)
    run = models.OneToOneField(
        AgentRun,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="trigger_event",
    )

    class Meta:
        ordering = ["trigger", "-received_at"]
        constraints = [
            # G23: one run per sender's event id, however often it is sent.
            models.UniqueConstraint(
                fields=["trigger", "event_id"],
                condition=Q(expired=False),
                name="trigger_event_once",
            ),
        ]
        indexes = [models.Index(fields=["trigger", "received_at"], name="trigger_event_recent_idx")]

    def __str__(self) -> str:
        return f"{self.trigger} event {self.event_id}"
