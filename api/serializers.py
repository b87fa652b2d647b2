"""What the API returns. Everything here is read-only output; input is
checked by the runtime's own validation (``parse_run_request``) or by the
small explicit serializers below."""

from django.core.exceptions import ObjectDoesNotExist
from django.db.models import Prefetch
from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema_field
from rest_framework import serializers

from api.run_start_serializers import RunRequestSerializer
from runs.models import EFFECT_CHOICES, AgentRun, ApprovalRequest, DeadLetter, RunStep
from runs.models.selectors import is_write_in_doubt, note_writes_in_doubt
from runs.models.vocabulary import (
    ApprovalStatus,
    FailureClass,
    ReconciliationOutcome,
    Resolution,
    RunStatus,
    SubmittedVia,
    TerminationReason,
    WaitKind,
)
from spend.usage import money_text
from tools.approval_policy import ApprovalPolicy, requires_approval
from tools.approval_settings import MAX_NOTE_CHARS
from tools.effects import ToolEffect
from tools.operator_view import ToolSource, ToolView, describe_tool


class ToolSerializer(serializers.Serializer):
    """A tool as ``tools.operator_view.describe_tool`` sees it, and its
    settings row. Only ``enabled`` and ``approval`` are accepted (G1)."""

    name = serializers.CharField(read_only=True)
    description = serializers.CharField(
        read_only=True, help_text="the class's, or the MCP server's as listed (its text)"
    )
    source = serializers.ChoiceField(
        choices=[source.value for source in ToolSource],
        read_only=True,
        help_text="where the tool comes from: builtin (shipped with nrllm-ops), class (a tool "
        "class in NRLLM_TOOLS), mcp (a tool of an MCP toolset in NRLLM_TOOLS, on `server`), "
        "unknown (nothing in the running code names it)",
    )
    server = serializers.CharField(
        read_only=True, help_text="the MCP toolset's server name; empty for other tools"
    )
    effect = serializers.ChoiceField(
        choices=[effect.value for effect in ToolEffect],
        read_only=True,
        help_text="from the code; never accepted. An MCP tool its toolset does not declare, "
        "and a tool no longer registered, is non_idempotent_write, as an unknown name always is",
    )
    declared = serializers.BooleanField(
        read_only=True,
        help_text="whether code declares the effect: a tool class always does; an MCP tool "
        "when its toolset lists it (an undeclared one is non_idempotent_write)",
    )
    registered = serializers.BooleanField(
        read_only=True,
        help_text="whether the running code still registers the tool; a setting "
        "may outlive its tool's removal. A declared MCP tool is registered whether or not "
        "its server answers; an undeclared one while its server offers it",
    )
    available = serializers.BooleanField(
        read_only=True,
        help_text="whether a run can be offered the tool now; a run naming an MCP tool "
        "that is not is refused at enqueue with unavailable_reason",
    )
    unavailable_reason = serializers.CharField(
        read_only=True,
        allow_blank=True,
        help_text="why not: the server cannot be reached, does not offer it, offers it with "
        "a schema or name this runtime cannot use, or the tool is not registered; empty when "
        "available",
    )
    hints = serializers.DictField(
        child=serializers.BooleanField(),
        read_only=True,
        help_text="the MCP annotations the server stated (readOnlyHint, destructiveHint, "
        "idempotentHint, openWorldHint), as stated: shown, never trusted; empty for other "
        "tools and while the server's listing lacks the tool",
    )
    hint_contradictions = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="how the hints contradict the declared effect; not empty: flagged for an "
        "operator. The declaration wins",
    )
    parameters = serializers.JSONField(
        read_only=True, help_text="the input schema; null while an MCP tool is not listed"
    )
    enabled = serializers.BooleanField()
    approval = serializers.ChoiceField(
        choices=ApprovalPolicy.choices,
        help_text="the operators' approval setting: default (what the effect and "
        "NRLLM_APPROVAL_REQUIRED_FOR say), required, or not_required. Setting not_required "
        "where the default asks for approval needs the permission tools.relax_approval "
        "(403 relax_permission_required without it)",
    )
    approval_required = serializers.BooleanField(
        read_only=True,
        help_text="whether its calls wait for an operator's approval: the effect, "
        "NRLLM_APPROVAL_REQUIRED_FOR and approval together; a run's request may add "
        "tools (require_approval), never remove one",
    )
    note = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        max_length=MAX_NOTE_CHARS,
        help_text="why, recorded in the admin log with the change",
    )

    @staticmethod
    def describe(setting, view: ToolView | None = None) -> dict:
        """The row of ``setting``; ``view`` if the caller described the tool already."""
        view = view or describe_tool(setting.name)
        return {
            "name": setting.name,
            "description": view.description,
            "source": view.source.value,
            "server": view.server,
            # From code, through the resolver, so a removed tool fails closed
            # (G1): it is a non_idempotent_write, and its approval follows.
            "effect": view.effect.value,
            "declared": view.declared,
            "registered": view.registered,
            "available": view.available,
            "unavailable_reason": view.unavailable_reason,
            "hints": view.hints,
            "hint_contradictions": view.hint_contradictions,
            "parameters": view.parameters,
            "enabled": setting.enabled,
            "approval": setting.approval,
            "approval_required": requires_approval(view.effect, setting.approval),
        }


#: ``Prefetch`` of a run list's pending approvals, into this attribute.
PENDING_APPROVALS_ATTR = "pending_approval_rows"


def with_run_relations(runs):
    """``runs`` fetching what ``RunSerializer`` shows of their relations
    once per page (the submitter, reconciliations, pending approvals),
    not once per run."""
    pending = ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING).only(
        "id", "run_id", "kind"
    )
    return runs.select_related(
        "team",
        "submitted_by",
        "agent_version__agent",
        # What fired it (G23): each a unique run column, one row at most.
        "firing__schedule",
        "trigger_event__trigger",
    ).prefetch_related(
        "reconciliations__operator",
        Prefetch("approvals", queryset=pending.order_by("pk"), to_attr=PENDING_APPROVALS_ATTR),
    )


def _blank_or(choices, help_text: str = ""):
    """A read-only choice that may be empty: declared, because DRF drops a
    read-only model field's ``allow_blank``, and the schema would then
    refuse the empty string the field holds."""
    return serializers.ChoiceField(
        choices=choices, allow_blank=True, read_only=True, help_text=help_text
    )


class RunAgentSerializer(serializers.Serializer):
    name = serializers.CharField()
    version = serializers.IntegerField(help_text="the version's number (1, 2, …)")
    version_id = serializers.IntegerField()


class FiredByScheduleSerializer(serializers.Serializer):
    schedule = serializers.IntegerField(help_text="the schedule's id")
    schedule_name = serializers.CharField()
    slot = serializers.DateTimeField(help_text="the scheduled time it was fired for")
    backfill = serializers.BooleanField(help_text="fired by a backfill, not by the clock")


class FiredByTriggerSerializer(serializers.Serializer):
    trigger = serializers.IntegerField(help_text="the event trigger's id")
    trigger_name = serializers.CharField()
    event_id = serializers.CharField(help_text="the sender's event id")


def fired_by(run) -> dict | None:
    """What started ``run`` without a person: its schedule's slot, or its
    trigger's event; None for any other run."""
    for relation in ("firing", "trigger_event"):
        try:
            row = getattr(run, relation)
        except ObjectDoesNotExist:
            continue
        if relation == "firing":
            return FiredByScheduleSerializer(
                {
                    "schedule": row.schedule_id,
                    "schedule_name": row.schedule.name,
                    "slot": row.slot,
                    "backfill": row.backfill,
                }
            ).data
        return FiredByTriggerSerializer(
            {"trigger": row.trigger_id, "trigger_name": row.trigger.name, "event_id": row.event_id}
        ).data
    return None


class WaitingForSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="the request's id: GET /api/approvals/{id}/")
    kind = serializers.ChoiceField(choices=WaitKind.choices)


class RunSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(
        slug_field="slug",
        read_only=True,
        help_text="the team the run was started in (its agent's; G22): its slug. It never "
        "changes; the run's steps, approvals, dead letters and reruns are that team's",
    )
    write_in_doubt = serializers.SerializerMethodField()
    agent = serializers.SerializerMethodField(
        help_text="the agent version the run started from (G18); null for a run whose "
        "request was given whole"
    )
    termination_reason = _blank_or(TerminationReason.choices, "empty until the run ends")
    failure_class = _blank_or(FailureClass.choices, "empty unless it failed")
    pending_effect = _blank_or(EFFECT_CHOICES, "the write fence (G6): empty when none stands")
    submitted_by = serializers.SlugRelatedField(
        slug_field="username",
        read_only=True,
        allow_null=True,
        help_text="the user whose API token or session submitted the run; "
        "null from the command line",
    )
    submitted_via = _blank_or(
        SubmittedVia.choices, "how it was submitted; empty for a run stored before it was recorded"
    )
    pending_approvals = serializers.SerializerMethodField(
        help_text="ids of the calls a waiting_for_approval run waits for "
        "(GET /api/approvals/{id}/); empty otherwise (waiting_for also lists a question or "
        "a deferred call)"
    )
    waiting_for = serializers.SerializerMethodField(
        help_text="what a waiting run (waiting_for_approval, waiting_for_input) waits for: "
        "each pending request's id (GET /api/approvals/{id}/) and kind — approval, question "
        "(POST answer/), deferred (another system completes it); empty otherwise"
    )
    tokens = serializers.IntegerField(
        source="total_tokens",
        read_only=True,
        help_text="prompt + completion tokens of every recorded turn, over all attempts",
    )
    rerun_of = serializers.UUIDField(
        read_only=True,
        allow_null=True,
        help_text="the run this one reruns from its step rerun_from_sequence (G20); its "
        "reruns: GET /api/runs/?rerun_of={id}",
    )
    request = RunRequestSerializer(
        read_only=True,
        help_text="the whole request the run was started with, as it keeps it (a start by "
        "agent: the version's definition with the input as its prompt)",
    )
    cost = serializers.SerializerMethodField(
        help_text="what the recorded turns cost, a decimal string; null while any turn "
        "is of unknown cost (unpriced_turns: no price, or no usage reported): unknown, never 0"
    )
    fired_by = serializers.SerializerMethodField(
        help_text="the schedule and slot (GET /api/schedules/{id}/), or the event trigger and "
        "the sender's event id (GET /api/triggers/{id}/), that started it; null for a run a "
        "person or a program started"
    )

    class Meta:
        model = AgentRun
        fields = [
            "id",
            "team",
            "status",
            "termination_reason",
            "failure_class",
            "error_type",
            "error_message",
            "mode",
            "submitted_by",
            "submitted_via",
            "fired_by",
            "agent",
            "request",
            "output",
            "lease_owner",
            "lease_expires_at",
            "lease_token",
            "pending_effect",
            "requeue_count",
            "step_count",
            "tokens",
            "cost",
            "prompt_tokens",
            "cached_prompt_tokens",
            "completion_tokens",
            "unpriced_turns",
            "llm_latency_ms",
            "tokens_saved_by_replay",
            "journal_begins_after",
            "rerun_of",
            "rerun_from_sequence",
            "write_in_doubt",
            "pending_approvals",
            "waiting_for",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    @extend_schema_field(RunAgentSerializer(allow_null=True))
    def get_agent(self, run) -> dict | None:
        version = run.agent_version
        if version is None:
            return None
        return {"name": version.agent.name, "version": version.number, "version_id": version.pk}

    @extend_schema_field(
        PolymorphicProxySerializer(
            component_name="FiredBy",
            serializers=[FiredByScheduleSerializer, FiredByTriggerSerializer],
            resource_type_field_name=None,
            allow_null=True,
        )
    )
    def get_fired_by(self, run) -> dict | None:
        return fired_by(run)

    def get_cost(self, run) -> str | None:
        known = run.known_cost
        return None if known is None else money_text(known)

    def get_write_in_doubt(self, run) -> bool:
        page = self.parent
        if isinstance(page, serializers.ListSerializer) and not getattr(page, "doubt_noted", False):
            # A page of runs asks the database about its idempotent writes
            # once (runs.models.selectors), not once per run.
            note_writes_in_doubt(page.instance)
            page.doubt_noted = True
        return is_write_in_doubt(run)

    def get_pending_approvals(self, run) -> list[int]:
        return [row.pk for row in pending_requests(run) if row.kind == WaitKind.APPROVAL]

    @extend_schema_field(WaitingForSerializer(many=True))
    def get_waiting_for(self, run) -> list[dict]:
        return [{"id": row.pk, "kind": row.kind} for row in pending_requests(run)]


def pending_requests(run) -> list[ApprovalRequest]:
    """The requests a waiting run waits for, oldest first. Only a waiting
    run has pending ones (its release, expiry and cancel end them all), so
    no other run costs a query; a list prefetches them for its page
    (``PENDING_APPROVALS_ATTR``)."""
    if run.status not in RunStatus.waiting():
        return []
    prefetched = getattr(run, PENDING_APPROVALS_ATTR, None)
    if prefetched is not None:
        return prefetched
    pending = ApprovalRequest.objects.filter(run=run, status=ApprovalStatus.PENDING)
    rows = list(pending.order_by("pk").only("id", "run_id", "kind"))
    # Read once for both fields that show them.
    setattr(run, PENDING_APPROVALS_ATTR, rows)
    return rows


class StepSerializer(serializers.ModelSerializer):
    class Meta:
        model = RunStep
        fields = [
            "sequence",
            "kind",
            "tool_name",
            "effect",
            "arguments",
            "result",
            "error",
            "idempotency_key",
            "replay_of",
            "lease_token",
            "created_at",
        ]
        read_only_fields = fields


class StepPageSerializer(serializers.Serializer):
    results = StepSerializer(many=True)
    next_after = serializers.IntegerField(allow_null=True, help_text="pass as ?after= for more")


class DeadLetterSerializer(serializers.ModelSerializer):
    failure_class = _blank_or(
        FailureClass.choices,
        "empty when the failure has no class (an expired lease, an unreplayable journal)",
    )
    resolution = _blank_or(Resolution.choices, "empty while the dead letter is open")
    resolved_by = serializers.SlugRelatedField(
        slug_field="username",
        read_only=True,
        allow_null=True,
        help_text="the operator who resolved it; null while it is open",
    )

    class Meta:
        model = DeadLetter
        fields = [
            "id",
            "run",
            "reason",
            "failure_class",
            "error_type",
            "error_message",
            "created_at",
            "resolution",
            "resolved_by",
            "resolved_at",
            "resolution_note",
        ]
        read_only_fields = fields


class WriteAuditSerializer(serializers.Serializer):
    run = RunSerializer()
    tool = serializers.CharField(allow_blank=True)
    arguments = serializers.JSONField(allow_null=True)
    idempotency_key = serializers.CharField(allow_blank=True)
    effect = serializers.CharField(allow_blank=True)
    reconciliation = serializers.DictField(allow_null=True)


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know, naming them, instead of ignoring them."""

    def validate(self, attrs):
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: "unknown field" for name in unknown})
        return attrs


class TextField(serializers.CharField):
    """A string, and only a string: DRF's CharField would take 5 for "5"."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class ReconcileSerializer(StrictSerializer):
    outcome = serializers.ChoiceField(choices=ReconciliationOutcome.choices)
    note = TextField(max_length=10_000, help_text="why: mandatory")


class NoteSerializer(StrictSerializer):
    note = TextField(max_length=10_000, required=False, allow_blank=True)


class ToolPreviewSerializer(serializers.Serializer):
    name = serializers.CharField()
    effect = serializers.CharField()


class JournalSerializer(serializers.Serializer):
    last_sequence = serializers.IntegerField(help_text="a requeue resumes after this step")
    model_turns = serializers.IntegerField(help_text="recorded model turns replayed")
    tool_results = serializers.IntegerField(help_text="recorded tool outcomes replayed")
    writes = serializers.IntegerField(help_text="of them, writes that executed: not repeated")


class VerdictSerializer(serializers.Serializer):
    allowed = serializers.BooleanField()
    code = serializers.CharField(help_text="safe, status, write_in_doubt, write_applied, ...")
    reason = serializers.CharField(help_text="what the action will do, or why it is refused")
    tools = ToolPreviewSerializer(many=True, help_text="the run's tools: what may execute live")
    journal = JournalSerializer(
        allow_null=True, help_text="for a requeue that is allowed: what it replays"
    )


class ActionResultSerializer(serializers.Serializer):
    code = serializers.CharField()
    detail = serializers.CharField()


class ErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    detail = serializers.CharField()
    errors = serializers.JSONField(required=False, help_text="by field, for validation errors")
