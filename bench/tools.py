"""No-op tools for the step-overhead figures: only the runtime's cost remains."""

from tools.contract import Tool
from tools.effects import ToolEffect

_NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


class NoopRead(Tool):
    name = "noop_read"
    description = "does nothing (read-only)"
    parameters = _NO_ARGUMENTS

    def run(self, arguments, context):
        return {}


class NoopIdempotentWrite(NoopRead):
    name = "noop_idempotent_write"
    description = "does nothing (idempotent write: fence + audit)"
    effect = ToolEffect.IDEMPOTENT_WRITE


class NoopNonIdempotentWrite(NoopRead):
    name = "noop_non_idempotent_write"
    description = "does nothing (non-idempotent write: fence + audit + replay lookup)"
    effect = ToolEffect.NON_IDEMPOTENT_WRITE


def noop_job():
    """A bare RQ job, the queue figure's baseline."""
    return None
