"""Notifications: every call appends to the outbox, so a repeat is a duplicate."""

from urllib.parse import urlencode

from django.urls import reverse

from tools.contract import Tool, ToolContext, WhereToCheck
from tools.effects import ToolEffect
from tools.models import OutboxNotification


class SendNotification(Tool):
    name = "send_notification"
    description = "Send a notification message to a recipient."
    effect = ToolEffect.NON_IDEMPOTENT_WRITE
    parameters = {
        "type": "object",
        "properties": {
            "recipient": {"type": "string", "minLength": 1, "maxLength": 200},
            "message": {"type": "string", "minLength": 1, "maxLength": 10_000},
        },
        "required": ["recipient", "message"],
        "additionalProperties": False,
    }

    def run(self, arguments, context: ToolContext):
        notification = OutboxNotification.objects.create(
            recipient=arguments["recipient"],
            message=arguments["message"],
            run_id=context.run_id,
            idempotency_key=context.idempotency_key,
        )
        return {"notification_id": notification.pk, "recipient": notification.recipient}

    def where_to_check(self, arguments, idempotency_key):
        # The outbox's list searches a whole idempotency key (console/tools.py).
        outbox = reverse("admin:tools_outboxnotification_changelist")
        return WhereToCheck(
            "the outbox: a notification there with this idempotency key was sent "
            "(applied); none, and it was not (not_applied)",
            f"{outbox}?{urlencode({'q': idempotency_key})}",
        )
