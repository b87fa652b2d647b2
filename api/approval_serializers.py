"""What ``/api/approvals/`` returns and takes (G14, G24).

A request is a call that waits for someone outside the worker: an
operator's approval, a person's answer to the agent's question, or another
system's completion of a deferred call (``kind``). It is shown with what
is needed to act on it — the call (tool, effect, arguments, place,
idempotency key), the digest a decision, an edit or an answer must carry,
the run's prompt and status, and the time left — read from the request's
row and a few columns of its run, never the run's whole request or prompt.
"""

from django.core.validators import RegexValidator
from django.db.models import DurationField, ExpressionWrapper, F, OuterRef, Subquery
from django.db.models.functions import Left, Now
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.serializers import StrictSerializer, TextField
from runs.approvals.actions import MAX_NOTE_CHARS
from runs.models import ApprovalRequest
from runs.models.vocabulary import ApprovalStatus, RunStatus, WaitKind
from tools.canonical import MAX_JSON_DEPTH, nested_deeper_than

#: How much of the run's prompt a listed request shows; the whole prompt is
#: at ``GET /api/runs/{id}/``.
PROMPT_HEAD = 200
#: ``ApprovalRequest.required_by``: the tool's policy, or the run's request.
REQUIRED_BY = [("policy", "policy"), ("request", "request")]


def approvals_shown():
    """Approval requests with the annotations ``ApprovalSerializer`` reads:
    the run's status and prompt head, the decider's username, and the time
    left by the database's clock (the one expiry is measured by)."""
    return ApprovalRequest.objects.annotate(
        run_status=F("run__status"),
        # One character more than shown, to know whether it was cut.
        run_prompt_head=Left("run__prompt", PROMPT_HEAD + 1),
        decided_by_username=F("decided_by__username"),
        edited_by_username=F("edited_by__username"),
        # The edit that replaced it: at most one (an edit replaces a pending
        # request, and only once), found by the foreign key's index.
        replaced_by_id=Subquery(
            ApprovalRequest.objects.filter(replaces=OuterRef("pk")).values("pk")[:1]
        ),
        time_left=ExpressionWrapper(F("expires_at") - Now(), output_field=DurationField()),
    )


class ApprovalSerializer(serializers.ModelSerializer):
    run = serializers.UUIDField(source="run_id", read_only=True)
    kind = serializers.ChoiceField(
        choices=WaitKind.choices,
        read_only=True,
        help_text="what the call waits for: approval (an operator's decision, G14; "
        "POST approve, deny or edit), question (a person's answer to the agent's ask_person; "
        "POST answer), deferred (another system's completion at the call's signed URL)",
    )
    run_status = serializers.ChoiceField(choices=RunStatus.choices, read_only=True)
    run_prompt = serializers.SerializerMethodField(
        help_text=f"the run's prompt, cut after {PROMPT_HEAD} characters (then ending in …)"
    )
    tool_name = serializers.CharField(read_only=True)
    position = serializers.CharField(
        read_only=True, help_text="iteration.index: the call's place in the run"
    )
    digest = serializers.CharField(
        read_only=True,
        help_text="what an approve or deny must carry: it binds the decision to this call",
    )
    required_by = serializers.ChoiceField(
        choices=REQUIRED_BY,
        allow_blank=True,
        read_only=True,
        help_text="policy: the tool's approval policy; request: the run's require_approval; "
        "empty for a question or a deferred call, which need no approval",
    )
    seconds_left = serializers.SerializerMethodField(
        help_text="until a pending request expires (0 once overdue); null once it is not pending"
    )
    decided_by = serializers.CharField(
        source="decided_by_username",
        read_only=True,
        allow_null=True,
        help_text="the username of who approved or denied it",
    )
    decided_at = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="when it was decided, expired or withdrawn",
    )
    by_submitter = serializers.BooleanField(
        read_only=True, help_text="the decision was made by the user who submitted the run"
    )
    replaces = serializers.IntegerField(
        source="replaces_id",
        read_only=True,
        allow_null=True,
        help_text="an edited call: the id of the request it replaced (status replaced); "
        "null for a call as the model asked for it",
    )
    replaced_by = serializers.IntegerField(
        source="replaced_by_id",
        read_only=True,
        allow_null=True,
        help_text="a replaced request: the id of the edited call that waits in its place",
    )
    edited_by = serializers.CharField(
        source="edited_by_username",
        read_only=True,
        allow_null=True,
        help_text="an edited call: the username of who edited it (under four-eyes, "
        "NRLLM_APPROVAL_SECOND_PERSON, another approver must approve it)",
    )
    reference = serializers.CharField(
        read_only=True,
        help_text="a deferred call: what the system it was handed to calls it (a ticket's "
        "number); empty otherwise",
    )
    # Not allow_null: the schema of any JSON takes null already, and a
    # oneOf of it and null would hold null twice.
    answer = serializers.JSONField(
        read_only=True,
        help_text="a question's answer, or a deferred call's completion ({result} or "
        "{error}), as recorded; null until then",
    )
    question = serializers.SerializerMethodField(
        help_text="a question: what the agent asks; null for any other kind"
    )
    answer_schema = serializers.SerializerMethodField(
        help_text="a question: the JSON Schema its answer must fit, null when it gives none "
        "(then the answer is a non-empty string); null for any other kind"
    )

    class Meta:
        model = ApprovalRequest
        fields = [
            "id",
            "kind",
            "run",
            "run_status",
            "run_prompt",
            "tool_name",
            "effect",
            "arguments",
            "position",
            "turn_sequence",
            "idempotency_key",
            "digest",
            "required_by",
            "status",
            "requested_at",
            "expires_at",
            "seconds_left",
            "decided_by",
            "decided_at",
            "note",
            "by_submitter",
            "replaces",
            "replaced_by",
            "edited_by",
            "reference",
            "question",
            "answer_schema",
            "answer",
        ]
        read_only_fields = fields

    def get_run_prompt(self, approval) -> str:
        head = approval.run_prompt_head
        return head if len(head) <= PROMPT_HEAD else head[:PROMPT_HEAD] + "…"

    def get_seconds_left(self, approval) -> int | None:
        if approval.status != ApprovalStatus.PENDING:
            return None
        return max(0, int(approval.time_left.total_seconds()))

    def get_question(self, approval) -> str | None:
        question = _asked(approval).get("question")
        return question if isinstance(question, str) else None

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_answer_schema(self, approval) -> dict | None:
        schema = _asked(approval).get("answer_schema")
        return schema if isinstance(schema, dict) else None


def _asked(approval) -> dict:
    """A question's arguments (``ask_person``'s), or nothing for another kind."""
    if approval.kind != WaitKind.QUESTION or not isinstance(approval.arguments, dict):
        return {}
    return approval.arguments


def _digest_field() -> TextField:
    return TextField(
        validators=[
            RegexValidator(
                r"\A[0-9a-f]{64}\Z",
                "a digest is 64 lowercase hexadecimal characters, as the request shows it",
            )
        ],
        help_text="the request's digest as it was shown (a stale one is refused with 409)",
    )


class DecisionSerializer(StrictSerializer):
    """The body of an approve or deny: the digest of the call as the
    operator saw it, and why (optional)."""

    digest = _digest_field()
    note = TextField(
        max_length=MAX_NOTE_CHARS,
        required=False,
        allow_blank=True,
        help_text="why; a denial's note is passed to the model",
    )


class AnyJSONField(serializers.JSONField):
    """Any JSON value, null included, at most ``MAX_JSON_DEPTH`` levels
    deep; what it must be is the action's to say (``runs.approvals``),
    naming the place that is wrong."""

    def __init__(self, **kwargs):
        super().__init__(allow_null=True, **kwargs)

    def to_internal_value(self, data):
        if nested_deeper_than(data):
            raise serializers.ValidationError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        return super().to_internal_value(data)


class EditSerializer(StrictSerializer):
    """The body of an edit: the digest of the call as the editor saw it,
    the arguments it is to run with instead, and why (optional)."""

    digest = _digest_field()
    arguments = AnyJSONField(
        help_text="the call's arguments as edited: a JSON object the tool's parameters "
        "schema accepts (else 400 invalid_arguments, naming each field)"
    )
    note = TextField(
        max_length=MAX_NOTE_CHARS,
        required=False,
        allow_blank=True,
        help_text="why it was edited; kept with the edit",
    )


class AnswerSerializer(StrictSerializer):
    """The body of an answer: the digest of the question as it was shown,
    the answer, and a note (optional)."""

    digest = _digest_field()
    answer = AnyJSONField(
        help_text="what the model is told: JSON fitting the question's answer_schema, or a "
        "non-empty string when it gives none (else 400 invalid_answer, naming the place)"
    )
    note = TextField(
        max_length=MAX_NOTE_CHARS,
        required=False,
        allow_blank=True,
        help_text="kept with the answer, for the record",
    )


class DecisionResultSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="approved, denied, edited or answered")
    detail = serializers.CharField()
    run_status = serializers.ChoiceField(
        choices=RunStatus.choices,
        help_text="the run's status as the decision left it: waiting_for_approval "
        "while other calls of its turn wait; once the last is decided, queued (or "
        "already running, or ended, if a worker was quick)",
    )
    approval = ApprovalSerializer(help_text="the request as it stands now")


class EditResultSerializer(DecisionResultSerializer):
    approval = ApprovalSerializer(
        help_text="the request as it stands now: replaced (replaced_by names the edit)"
    )
    made = ApprovalSerializer(
        help_text="the edited call: a new request, with its own id, digest and idempotency "
        "key, pending; approve or deny it by its id and digest"
    )
