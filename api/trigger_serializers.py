"""What ``/api/schedules/`` and ``/api/triggers/`` return and take (G23).

A schedule or a trigger names its agent by name and its version by number
(null: the agent's latest at each run). Input is checked by the model's own
``clean()`` (``full_clean``), as the console's forms check it: a bad cron
expression, an unknown time zone, a template naming what it may not is a
400 naming the field, and nothing is stored. The owner — whose runs they
are, whose budget pays, who may not approve them under four-eyes — is the
user who last saved it (created or changed it), never given.

A trigger's ``secret`` is shown once, in the answer to its creation; a
list or a detail never shows it.
"""

from datetime import UTC, datetime

from django.core.exceptions import NON_FIELD_ERRORS, ObjectNotUpdated
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.exceptions import NotFound

from agents.models import Agent, AgentVersion
from api.serializers import StrictSerializer, TextField
from teams import access
from tools.canonical import storable_text
from triggers import actions
from triggers.models import EventTrigger, Firing, Schedule, TriggerEvent

#: How many of a schedule's next slots its answer shows.
NEXT_FIRINGS = 5
#: How many of its last firings (a trigger's last events) a detail shows.
LAST_SHOWN = 10
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
UNSTORABLE = "contains a character that cannot be stored (NUL or a lone surrogate)"


class AgentNameField(serializers.SlugRelatedField):
    """An agent by its name, among those the queryset holds."""

    def to_internal_value(self, data):
        if isinstance(data, str) and storable_text(data) != data:
            # A NUL would reach the database as an error, not as no match.
            self.fail("does_not_exist", slug_name=self.slug_field, value=data)
        return super().to_internal_value(data)


class VersionNumberField(serializers.IntegerField):
    """An agent version by its number; null: the agent's latest at each run."""

    def to_representation(self, value):
        return value.number


def _run_status(row) -> str | None:
    """The status of a firing's or an event's run; None when it has none,
    or when retention deleted it (the row keeps its id: no constraint)."""
    run = row.run if row.run_id else None
    return run.status if run is not None else None


class FiringSerializer(serializers.ModelSerializer):
    run = serializers.UUIDField(source="run_id", read_only=True, allow_null=True)
    run_status = serializers.SerializerMethodField(
        help_text="the run's status now; null when no run was started (skipped, buffered, "
        "refused) or retention deleted it"
    )
    reason = serializers.CharField(
        read_only=True,
        allow_blank=True,
        help_text="skipped: missed or overlap; refused: the refusal, as the start said it",
    )

    class Meta:
        model = Firing
        fields = ["slot", "outcome", "reason", "covers", "backfill", "run", "run_status"]
        read_only_fields = fields

    def get_run_status(self, firing) -> str | None:
        return _run_status(firing)


class TriggerEventSerializer(serializers.ModelSerializer):
    run = serializers.UUIDField(source="run_id", read_only=True, allow_null=True)
    run_status = serializers.SerializerMethodField(help_text="null: retention deleted the run")

    class Meta:
        model = TriggerEvent
        fields = ["event_id", "received_at", "expired", "run", "run_status"]
        read_only_fields = fields

    def get_run_status(self, event) -> str | None:
        return _run_status(event)


class _StartsRunsSerializer(serializers.ModelSerializer):
    """What a schedule and a trigger share: an agent of the user's teams,
    a version of it, the owner, and the model's own validation."""

    #: The permission that lets a user create one for an agent (its team's).
    add_permission = ""
    kind = ""

    team = serializers.SlugRelatedField(
        source="agent.team",
        slug_field="slug",
        read_only=True,
        help_text="the agent's team (G22); its runs are that team's",
    )
    agent = AgentNameField(
        slug_field="name",
        queryset=Agent.objects.none(),
        help_text="the agent's name; set at creation, never changed",
    )
    version = VersionNumberField(
        required=False,
        allow_null=True,
        min_value=1,
        help_text="the agent version's number its runs start from; null: the agent's "
        "latest version at each run",
    )
    owner = serializers.SlugRelatedField(
        slug_field="username",
        read_only=True,
        help_text="who last saved it (created or changed it): its runs are submitted by "
        "them (their budget; under four-eyes they may not approve their writes)",
    )

    #: Fields ``full_clean`` leaves alone (set by ``save()``).
    not_cleaned: tuple[str, ...] = ()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        agent = self.fields["agent"]
        if self.instance is not None:
            # An agent's rows never move to another team (G22): nor do these.
            agent.read_only = True
        request = self.context.get("request")
        if request is not None and not agent.read_only:
            agent.queryset = access.scoped(
                Agent.objects.select_related("team"), request.user, self.add_permission
            )
            agent.error_messages["does_not_exist"] = (
                f"no agent named {{value}} you may add {self.kind}s for "
                f"(the author role in its team)"
            )

    def validate(self, attrs):
        writable = {name for name, field in self.fields.items() if not field.read_only}
        given = set(self.initial_data) if isinstance(self.initial_data, dict) else set()
        refused = {
            name: "read-only" if name in self.fields else "unknown field"
            for name in sorted(given - writable)
        }
        if "agent" in refused and self.instance is not None:
            refused["agent"] = f"a {self.kind}'s agent never changes: create another"
        if refused:
            raise serializers.ValidationError(refused)
        unstorable = {
            name: UNSTORABLE
            for name, value in attrs.items()
            if isinstance(value, str) and storable_text(value) != value
        }
        if unstorable:
            raise serializers.ValidationError(unstorable)
        built = self.instance or self.Meta.model()
        # Whoever saves it owns it: nobody makes their runs someone else's
        # (budget, four-eyes), and what a change makes the runs do is its
        # changer's (who must hold the runner role: full_clean checks).
        built.owner = self.context["request"].user
        number = attrs.pop("version", ...)
        for name, value in attrs.items():
            setattr(built, name, value)
        if number is None:
            built.version = None
        elif number is not ...:
            built.version = (
                AgentVersion.objects.filter(agent=built.agent, number=number)
                .select_related("agent")
                .first()
            )
            if built.version is None:
                raise serializers.ValidationError(
                    {"version": f"agent {built.agent.name} has no version {number}"}
                )
        try:
            built.full_clean(exclude=self.not_cleaned)
        except DjangoValidationError as error:
            raise serializers.ValidationError(self._by_field(error, built)) from None
        self.built = built
        return attrs

    def _by_field(self, error: DjangoValidationError, built) -> dict:
        """The model's errors by field; the one unique (agent, name) is the name's."""
        by_field = {}
        for name, errors in error.error_dict.items():
            for each in errors:
                if name == NON_FIELD_ERRORS and each.code in ("unique", "unique_together"):
                    by_field.setdefault("name", []).append(self._name_taken(built))
                else:
                    field = "non_field_errors" if name == NON_FIELD_ERRORS else name
                    by_field.setdefault(field, []).extend(each.messages)
        return by_field

    def _name_taken(self, built) -> str:
        return f"agent {built.agent.name} has a {self.kind} named {built.name} already"

    def _saved(self):
        try:
            with transaction.atomic():
                self.built.save()
        except IntegrityError:
            # The unique (agent, name): another request saved the name since
            # full_clean looked (the other constraints clean() checked).
            raise serializers.ValidationError({"name": [self._name_taken(self.built)]}) from None
        except ObjectNotUpdated:
            # Deleted by another request since it was read.
            raise NotFound(f"no {self.kind} {self.built.pk}") from None
        return self.built

    def create(self, validated_data):
        return self._saved()

    def update(self, instance, validated_data):
        return self._saved()


class ScheduleSerializer(_StartsRunsSerializer):
    """A schedule: its agent's runs at the slots of a cron expression or an
    interval, each slot at most once (G23)."""

    add_permission = "triggers.add_schedule"
    kind = "schedule"
    not_cleaned = ("active_since",)

    paused_for_run = serializers.UUIDField(
        source="paused_for_run_id",
        read_only=True,
        allow_null=True,
        help_text="the run whose write in doubt or dead letter paused it (reconcile or "
        "resolve it, then resume)",
    )
    pause_reason = serializers.CharField(
        read_only=True,
        allow_blank=True,
        help_text="why it is paused: who paused it and their note, or the run's question",
    )
    next_firing_times = serializers.SerializerMethodField(
        help_text=f"its next {NEXT_FIRINGS} slots (UTC); empty while paused"
    )
    cron = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=200,
        help_text="five fields (or six, seconds first), read in time_zone; give it or "
        "interval_seconds",
    )
    input_template = serializers.CharField(
        trim_whitespace=False,
        help_text="the run's input: ${scheduled_time}, ${scheduled_date} and ${schedule} are "
        "replaced ($${ for a literal ${)",
    )

    class Meta:
        model = Schedule
        fields = [
            "id",
            "name",
            "team",
            "agent",
            "version",
            "cron",
            "interval_seconds",
            "time_zone",
            "input_template",
            "overlap",
            "catchup_window_seconds",
            "owner",
            "timing",
            "paused_at",
            "pause_reason",
            "paused_for_run",
            "next_firing_times",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["paused_at", "timing", "created_at", "updated_at"]
        # Uniqueness is full_clean's, naming the field (not DRF's validator).
        validators = []

    @extend_schema_field(serializers.ListField(child=serializers.DateTimeField()))
    def get_next_firing_times(self, schedule) -> list[str]:
        field = serializers.DateTimeField()
        return [
            field.to_representation(slot)
            for slot in actions.next_firing_times(schedule, NEXT_FIRINGS)
        ]


class ScheduleDetailSerializer(ScheduleSerializer):
    last_firings = serializers.SerializerMethodField(
        help_text=f"its last {LAST_SHOWN} slots, newest first, with what became of each"
    )

    class Meta(ScheduleSerializer.Meta):
        fields = [*ScheduleSerializer.Meta.fields, "last_firings"]

    @extend_schema_field(FiringSerializer(many=True))
    def get_last_firings(self, schedule) -> list[dict]:
        return FiringSerializer(actions.recent_firings(schedule, LAST_SHOWN), many=True).data


class EventTriggerSerializer(_StartsRunsSerializer):
    """An event trigger: a run of its agent for each signed event POSTed to
    its URL, one per sender's event id within its window (G23)."""

    add_permission = "triggers.add_eventtrigger"
    kind = "trigger"

    url = serializers.SerializerMethodField(
        help_text="where senders POST its events (POST /api/hooks/{path}/): no credentials "
        "but the signature"
    )
    secret = serializers.CharField(
        write_only=True,
        required=False,
        max_length=200,
        help_text="the HMAC key (Standard Webhooks: whsec_ and base64); left out at creation, "
        "one is made. Shown once, in the creation's answer",
    )
    input_template = serializers.CharField(
        trim_whitespace=False,
        help_text="the run's input: ${path} placeholders name fields of the event's JSON body "
        "(${alerts.0.labels.alertname}); an event lacking one is refused 400 naming it",
    )
    event_id_template = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=500,
        trim_whitespace=False,
        help_text="the sender's event id from the body (${groupKey}/${alerts.0.startsAt}); "
        "empty: the header event_id_header names",
    )

    class Meta:
        model = EventTrigger
        fields = [
            "id",
            "name",
            "team",
            "agent",
            "version",
            "url",
            "scheme",
            "secret",
            "event_id_header",
            "event_id_template",
            "dedup_window_seconds",
            "input_template",
            "max_events_per_minute",
            "enabled",
            "owner",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["created_at", "updated_at"]
        validators = []

    def get_url(self, trigger) -> str:
        path = reverse("api-hook", args=[trigger.path])
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request is not None else path


class EventTriggerDetailSerializer(EventTriggerSerializer):
    last_events = serializers.SerializerMethodField(
        help_text=f"its last {LAST_SHOWN} events accepted, newest first, with their runs"
    )

    class Meta(EventTriggerSerializer.Meta):
        fields = [*EventTriggerSerializer.Meta.fields, "last_events"]

    @extend_schema_field(TriggerEventSerializer(many=True))
    def get_last_events(self, trigger) -> list[dict]:
        events = actions.recent_events(trigger, LAST_SHOWN)
        return TriggerEventSerializer(events, many=True).data


class EventTriggerCreatedSerializer(EventTriggerSerializer):
    """The answer to a creation: the trigger, and its secret, this once."""

    secret = serializers.CharField(
        read_only=True, help_text="the HMAC key: shown this once, keep it with the sender"
    )


class BackfillSerializer(StrictSerializer):
    """The range (start, end] to backfill, or to preview."""

    start = serializers.DateTimeField(
        help_text="the range's start, excluded, with its offset (2026-12-01T00:00:00Z)"
    )
    end = serializers.DateTimeField(help_text="the range's end, included: a past time")
    preview = serializers.BooleanField(
        default=False, help_text="true: say what it would do, start nothing"
    )

    def to_internal_value(self, data):
        if isinstance(data, dict):
            for name in ("start", "end"):
                # DRF would read a time without an offset in the server's zone:
                # a range an hour off, silently. Refused, as the preview does.
                value = data.get(name)
                if isinstance(value, str) and not _has_offset(value):
                    raise serializers.ValidationError(
                        {name: ["give the time with its offset (2026-12-01T00:00:00Z)"]}
                    )
        return super().to_internal_value(data)

    def validate_start(self, value):
        # Slots are computed from the Unix epoch on; and a date-time at the
        # calendar's edge would overflow in the schedule's time zone.
        if value < EPOCH:
            raise serializers.ValidationError("at or after 1970-01-01T00:00:00Z")
        return value


def _has_offset(text: str) -> bool:
    from django.utils.dateparse import parse_datetime

    try:
        parsed = parse_datetime(text.strip())
    except ValueError:
        return True  # not a date-time at all: DRF names the field
    return parsed is None or parsed.tzinfo is not None


class BackfillPreviewSerializer(serializers.Serializer):
    preview = serializers.BooleanField()
    slots = serializers.IntegerField(help_text="the range's slots (at most 1000)")
    already_recorded = serializers.IntegerField(
        help_text="of them, slots a firing records already (fired, skipped, refused): left alone"
    )
    runs = serializers.IntegerField(help_text="the runs it would start: one per slot not recorded")
    writes = serializers.ListField(
        child=serializers.CharField(), help_text="the agent version's tools that write"
    )
    approval_required = serializers.ListField(
        child=serializers.CharField(),
        help_text="of them, those whose calls wait for an approval",
    )
    too_many = serializers.BooleanField(
        help_text="the range holds more than 1000 slots: a backfill of it is refused"
    )


class PauseSerializer(StrictSerializer):
    """Why, recorded in the admin log (a pause's note is shown as its reason)."""

    note = TextField(max_length=2000, required=False, allow_blank=True, help_text="why")

    def validate_note(self, value):
        if storable_text(value) != value:
            raise serializers.ValidationError(UNSTORABLE)
        return value


class HookAnswerSerializer(serializers.Serializer):
    run = serializers.UUIDField(
        allow_null=True, help_text="the run the event started (or started before)"
    )
    event_id = serializers.CharField(help_text="the sender's event id, as read")
    duplicate = serializers.BooleanField(
        help_text="true: the same event id was accepted within the trigger's window, and "
        "this is its run; nothing new was started"
    )
