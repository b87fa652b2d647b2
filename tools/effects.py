"""What a tool does to the world (G1).

The effect is a property of the tool's code: there is no column, setting or
form field that stores or changes it.
"""

import enum


class ToolEffect(enum.StrEnum):
    READ_ONLY = "read_only"
    IDEMPOTENT_WRITE = "idempotent_write"
    NON_IDEMPOTENT_WRITE = "non_idempotent_write"

    @property
    def is_write(self) -> bool:
        """A write must leave an audit record or the run fails (G2)."""
        return self is not ToolEffect.READ_ONLY

    @property
    def is_retry_safe(self) -> bool:
        """Whether running the call again after an interruption is harmless."""
        return self is not ToolEffect.NON_IDEMPOTENT_WRITE
