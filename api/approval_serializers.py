"""What ``/api/approvals/`` returns and takes (G14).

An approval request is shown with what an operator needs to decide it —
the call (tool, effect, arguments, place, idempotency key), the digest a
decision must carry, the run's prompt and status, and the time left — read
from the request's row and a few columns of its run, never the run's
whole request or prompt.
"""

from django.core.validators import RegexValidator
from django.db.models import DurationField, ExpressionWrapper, F
from django.db.models.functions import Left, Now
from rest_framework import serializers

from api.serializers import StrictSerializer, TextField
from runs.approvals.actions import MAX_NOTE_CHARS
from runs.models import ApprovalRequest
from runs.models.vocabulary import ApprovalStatus, RunStatus

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
        time_left=ExpressionWrapper(F("expires_at") - Now(), output_field=DurationField()),
    )


class ApprovalSerializer(serializers.ModelSerializer):
    run = serializers.UUIDField(source="run_id", read_only=True)
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
        read_only=True,
        help_text="policy: the tool's approval policy; request: the run's require_approval",
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

    class Meta:
        model = ApprovalRequest
        fields = [
            "id",
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
        ]
        read_only_fields = fields

    def get_run_prompt(self, approval) -> str:
        head = approval.run_prompt_head
        return head if len(head) <= PROMPT_HEAD else head[:PROMPT_HEAD] + "…"

    def get_seconds_left(self, approval) -> int | None:
        if approval.status != ApprovalStatus.PENDING:
            return None
        return max(0, int(approval.time_left.total_seconds()))


class DecisionSerializer(StrictSerializer):
    """The body of an approve or deny: the digest of the call as the
    operator saw it, and why (optional)."""

    digest = TextField(
        validators=[
            RegexValidator(
                r"\A[0-9a-f]{64}\Z",
                "a digest is 64 lowercase hexadecimal characters, as the request shows it",
            )
        ],
        help_text="the request's digest as it was shown (a stale one is refused with 409)",
    )
    note = TextField(
        max_length=MAX_NOTE_CHARS,
        required=False,
        allow_blank=True,
        help_text="why; a denial's note is passed to the model",
    )


class DecisionResultSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="approved or denied")
    detail = serializers.CharField()
    run_status = serializers.ChoiceField(
        choices=RunStatus.choices,
        help_text="the run's status as the decision left it: waiting_for_approval "
        "while other calls of its turn wait; once the last is decided, queued (or "
        "already running, or ended, if a worker was quick)",
    )
    approval = ApprovalSerializer(help_text="the request as it stands now")
