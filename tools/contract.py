"""The contract a tool author implements.

A tool is a class with ``name``, ``description``, a JSON-Schema
``parameters``, a class attribute ``effect`` (default ``READ_ONLY``) and
``run(arguments, context)``. It returns a JSON-serialisable result, raises
``ToolError`` with a message the model may read, or, for a write that may
have taken effect without the tool being able to tell, raises
``ToolOutcomeUnknown``. A write tool may also say where an operator checks
whether a call of it took effect (``where_to_check``), for the console to
show beside a write in doubt.

A tool may hand its call to another system instead of finishing it
(``deferred = True``, G24): its ``run`` passes ``context.completion_url``
on (in a ticket it opens, say) and returns ``Deferred``; the run waits
until that system POSTs the call's result to the URL. The effect still
rules: a ``non_idempotent_write`` not completed by its deadline is in
doubt, never retried; a read or an idempotent write is run again with the
same key (and the same URL).
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
    #: For a deferred tool: where the system the call is handed to POSTs
    #: its result (signed, bound to the call's key; the same for every
    #: attempt at the call). "" for any other tool.
    completion_url: str = ""


@dataclass(frozen=True)
class Deferred:
    """What a deferred tool's ``run`` returns once it has handed the call on:
    the run waits for the completion (G24). ``reference``: what the other
    system calls it (a ticket's number), shown to operators."""

    reference: str = ""


@dataclass(frozen=True)
class Question:
    """What the built-in ``ask_person`` returns: the run waits for a person's
    answer, checked against ``answer_schema`` (a JSON Schema) when given."""

    text: str
    answer_schema: dict | None = None


#: What a tool's ``run`` returns to make its run wait for someone outside
#: the worker instead of finishing the call.
WAITING_RESULTS = (Deferred, Question)


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
    #: The tool hands its calls to another system that completes them
    #: (``Deferred``), and the longest it waits for a completion (None:
    #: ``NRLLM_COMPLETION_TIMEOUT_SECONDS``).
    deferred: ClassVar[bool] = False
    completion_timeout_seconds: ClassVar[float | None] = None

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
