"""The contract a tool author implements.

A tool is a class with ``name``, ``description``, a JSON-Schema
``parameters``, a class attribute ``effect`` (default ``READ_ONLY``) and
``run(arguments, context)``. It returns a JSON-serialisable result, raises
``ToolError`` with a message the model may read, or, for a write that may
have taken effect without the tool being able to tell, raises
``ToolOutcomeUnknown``. A write tool may also say where an operator checks
whether a call of it took effect (``where_to_check``), for the console to
show beside a write in doubt.
"""

import hashlib
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from tools.effects import ToolEffect


class ToolError(Exception):
    """A failure the tool reports to the model; the run goes on."""


class ToolOutcomeUnknown(Exception):
    """The tool cannot tell whether its write took effect: the request may
    have reached the world (a timeout or a broken connection after it was
    sent). Raise it only then; a failure known to have changed nothing is a
    ``ToolError``.

    The runtime takes the write to be in doubt. A ``non_idempotent_write``
    stops its run, which is dead-lettered ``write_interrupted`` with the call
    standing for an operator to reconcile, and is never retried
    automatically. An ``idempotent_write`` is retried like a lost connection
    (class ``connection``), with the same idempotency key. A ``read_only``
    tool that raises it reports an ordinary tool error.
    """


@dataclass(frozen=True)
class ToolContext:
    """What the runtime tells a tool about the call it is executing."""

    run_id: str
    #: Same for every attempt at the same call (same tool, arguments and
    #: position in the run), different for any other call: send it to the
    #: outside world so a repeated write can be recognised there.
    idempotency_key: str
    #: The lease token of the attempt executing the call.
    attempt: int
    #: The call's time limit (the tool's ``timeout_seconds``), if it has one.
    timeout_seconds: float | None = None


@dataclass(frozen=True)
class WhereToCheck:
    """Where an operator checks whether a call of a write tool took effect,
    when its outcome is in doubt (G10, G13): the tool's own record of it."""

    #: In words, for an operator: where the record is and what it says,
    #: e.g. "the outbox: a notification with this idempotency key was sent".
    text: str
    #: A link to it: ``https://…`` or a path on this site (``/admin/…``);
    #: "" for none. Any other link is not shown.
    url: str = ""


def idempotency_key_for(run_id: str, position: str, tool_name: str, arguments: Any) -> str:
    """Derive the idempotency key of a call from what identifies it.

    ``position`` names the call's place in the run (iteration and index within
    the model's turn), which a re-execution from the start reproduces.
    """
    canonical_arguments = json.dumps(arguments, sort_keys=True, separators=(",", ":"))
    material = "\x1f".join([str(run_id), position, tool_name, canonical_arguments])
    return hashlib.sha256(material.encode()).hexdigest()


class Tool:
    """Base class of every tool. Subclasses set the class attributes."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    parameters: ClassVar[dict[str, Any] | None] = None
    effect: ClassVar[ToolEffect] = ToolEffect.READ_ONLY
    #: The longest a call may take. The lease is extended to cover it before
    #: the call, and the call is stopped when it runs out. None: no limit of
    #: its own, and the ordinary lease covers the call.
    timeout_seconds: ClassVar[float | None] = None

    def time_limit(self) -> float | None:
        return self.timeout_seconds

    def run(self, arguments: dict[str, Any], context: ToolContext) -> Any:
        raise NotImplementedError

    def where_to_check(self, arguments: Any, idempotency_key: str) -> WhereToCheck | None:
        """Optional, for a write tool: where an operator finds whether the
        call with ``arguments`` (as the model gave them: check their shape)
        and ``idempotency_key`` took effect. Called by the console as it
        shows a write in doubt, so quick and without side effects: build
        the text and the link, ask nothing of the world. None (the default):
        the console says to look for the call's effect where the tool
        writes."""
        return None
