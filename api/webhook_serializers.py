"""What ``GET /api/runs/{id}/webhook-deliveries/`` returns (G19): each
run-ended event of the run and where its delivery stands. The webhook's
URL is shown as its origin only: its path or query may hold the
receiver's token."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from runs.approvals.webhook_url import origin
from runs.models.run_events import EVENT_TYPES, RunEvent

DELIVERY_STATES = [
    ("pending", "pending: due again at next_attempt_at"),
    ("delivered", "delivered: a 2xx answer came"),
    ("gave_up", "gave_up: no attempt is left"),
]


class WebhookDeliverySerializer(serializers.ModelSerializer):
    event_id = serializers.UUIDField(source="pk", read_only=True)
    event = serializers.ChoiceField(source="event_type", choices=EVENT_TYPES, read_only=True)
    dead_lettered = serializers.BooleanField(
        read_only=True, help_text="run.failed only: the run was dead-lettered"
    )
    delivery = serializers.ChoiceField(source="state", choices=DELIVERY_STATES, read_only=True)
    attempts = serializers.IntegerField(read_only=True, help_text="POSTs tried so far")
    last_status = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="the last answer's HTTP status; null: none came"
    )
    last_error = serializers.CharField(
        read_only=True, help_text="why the last attempt failed; empty once delivered"
    )
    next_attempt_at = serializers.SerializerMethodField(
        help_text="when it is tried again; null once delivered or given up"
    )
    target = serializers.SerializerMethodField(
        help_text="where it is posted: the URL's origin (its path and query are not shown)"
    )

    class Meta:
        model = RunEvent
        fields = [
            "event_id",
            "event",
            "occurred_at",
            "dead_lettered",
            "delivery",
            "attempts",
            "last_attempt_at",
            "last_status",
            "last_error",
            "next_attempt_at",
            "delivered_at",
            "gave_up_at",
            "target",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_next_attempt_at(self, event) -> str | None:
        if event.state != "pending":
            return None
        return serializers.DateTimeField().to_representation(event.next_attempt_at)

    def get_target(self, event) -> str:
        return origin(event.url)
