"""Deferred tools for the tests (G24), registered through ``NRLLM_TOOLS``
(``DEFERRED_TOOLS``): each hand-off is an ``OutboxNotification`` row — to
``ticket-desk`` — whose message is the completion URL, so a test in another
process than the worker finds it and completes the call."""

from tools.contract import Deferred, Tool
from tools.effects import ToolEffect
from tools.models import OutboxNotification

DEFERRED_TOOLS = ["tests.deferred_tools.OpenTicket", "tests.deferred_tools.LookUpTicket"]
#: Who a hand-off's row is addressed to.
DESK = "ticket-desk"

_TICKET = {
    "type": "object",
    "properties": {"title": {"type": "string", "minLength": 1}},
    "required": ["title"],
    "additionalProperties": False,
}


class OpenTicket(Tool):
    """Opens a ticket for a person to work on; their tracker completes the
    call with what they did. Opening one twice opens two: not idempotent."""

    name = "open_ticket"
    description = "Open a ticket; its result is what the person who worked it reports."
    effect = ToolEffect.NON_IDEMPOTENT_WRITE
    parameters = _TICKET
    deferred = True

    def run(self, arguments, context):
        row = OutboxNotification.objects.create(
            recipient=DESK,
            message=context.completion_url,
            run_id=context.run_id,
            idempotency_key=context.idempotency_key,
        )
        return Deferred(reference=f"TICKET-{row.pk}")


class LookUpTicket(OpenTicket):
    """Asks the desk to look something up: a read, run again after its deadline."""

    name = "look_up_ticket"
    description = "Ask the ticket desk to look something up."
    effect = ToolEffect.READ_ONLY


def hand_offs(run_id=None) -> list[OutboxNotification]:
    """The hand-offs made, oldest first."""
    rows = OutboxNotification.objects.filter(recipient=DESK).order_by("created_at", "pk")
    return list(rows if run_id is None else rows.filter(run_id=run_id))
