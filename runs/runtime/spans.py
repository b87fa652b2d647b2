"""The spans of an attempt (docs/observability.md#traces): the attempt, each
model call it makes (a GenAI ``chat`` span) and each tool call it executes
(``execute_tool``), with what this runtime adds to the GenAI semantic
conventions: the run, the lease token, a tool's effect and idempotency key,
and how the attempt ended.

What an attempt replays from its journal (G12) was done by an earlier one:
it gets no span, and the attempt's span says how much it replayed. A call
never executed (denied, malformed, not offered) has no span either.

With traces off (``ground.tracing.tracer`` None) each helper is that
one check and returns ``NOT_TRACED``, a shared no-op: nothing of
OpenTelemetry is imported, nothing is allocated.

With traces on, no helper raises, whatever the run hands it: a span is a
record of the run, never a part of it. They run inside the runtime's own
``try`` blocks (a tool's span inside ``_execute_call``'s, the attempt's
``ended`` just before its settle), where an exception of theirs would take
the place of the run's own, and change how the run ends. What fails in
them (an exception whose ``str()`` raises, say) is logged and left out of
the span; the span still ends, and stops being the current one.
"""

import logging
import traceback
from enum import StrEnum

from ground import tracing
from runs.providers.failures import classify
from spend.prices import Usage

logger = logging.getLogger(__name__)


class AttemptEnd(StrEnum):
    """How an attempt ended (``nrllm.attempt.outcome``)."""

    #: The final answer's record settled the run (``cancelled`` instead if a
    #: cancel won that record: the run's status says).
    COMPLETED = "completed"
    MAX_ITERATIONS = "max_iterations"
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    WAITING_FOR_INPUT = "waiting_for_input"
    CANCELLED = "cancelled"
    #: The run was no longer this attempt's: it settled nothing (G5).
    LEASE_LOST = "lease_lost"
    JOURNAL_UNREPLAYABLE = "journal_unreplayable"
    #: Retried, dead-lettered or failed, as ``failed_attempts`` decided.
    FAILED = "failed"
    #: Its caller stopped it (an interactive run's Ctrl-C).
    INTERRUPTED = "interrupted"


#: Ends that are no failure of the attempt: their span's status stays unset.
_FINE_ENDS = frozenset(
    str(end)
    for end in (
        AttemptEnd.COMPLETED,
        AttemptEnd.WAITING_FOR_APPROVAL,
        AttemptEnd.WAITING_FOR_INPUT,
        AttemptEnd.CANCELLED,
    )
)


class _NotTraced:
    """What every helper returns with traces off: each method does nothing."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None

    def returned(self, turn):
        return turn

    def replayed(self, journal) -> None:
        pass

    def ended(self, outcome: str, error: BaseException | None = None) -> None:
        pass


NOT_TRACED = _NotTraced()


def attempt(lease, mode: str, *, resumed: bool):
    """The span of one attempt at a run, current while the attempt runs (its
    calls' spans are its children); ``replayed(journal)`` counts what it
    replays, ``ended(outcome, error)`` says how it ended."""
    tracer = tracing.tracer  # read once: traces may stop meanwhile
    if tracer is None:
        return NOT_TRACED
    return _made(_AttemptSpan, tracer, lease, mode, resumed)


def model_call(lease, kind: str, model: str | None):
    """The span of one live model call of the provider ``kind`` (``model``:
    the one asked for, if the provider names one); ``returned(turn)`` adds
    what the turn says (the model that answered, its tokens) and returns it."""
    tracer = tracing.tracer
    if tracer is None:
        return NOT_TRACED
    return _made(_ModelCallSpan, tracer, lease, kind, model)


def tool_call(call, context, call_id: str):
    """The span of one tool call while its tool runs: ``call`` (a
    ``PlannedCall``) under ``context`` (its ``ToolContext``), ``call_id``
    as the model was told it."""
    tracer = tracing.tracer
    if tracer is None:
        return NOT_TRACED
    return _made(_ToolCallSpan, tracer, call, context, call_id)


def _made(kind, *args):
    """A span of ``kind``, or ``NOT_TRACED`` if making it fails (logged)."""
    try:
        return kind(*args)
    except Exception:
        logger.warning("%s: no span, it could not be made", kind.__name__, exc_info=True)
        return NOT_TRACED


class _Span:
    """A span current from ``__enter__`` to ``__exit__``; an exception
    passing through marks it failed. It never raises (the module's
    docstring says why): with no span (its start failed) it does nothing."""

    kind = "INTERNAL"
    span = None

    def __init__(self, tracer, name: str, attributes: dict):
        self._tracer, self._name, self._attributes = tracer, name, attributes

    def __enter__(self):
        self._quietly(self._start)
        return self

    def _start(self) -> None:
        from opentelemetry import context, trace

        span = self._tracer.start_span(
            self._name, kind=trace.SpanKind[self.kind], attributes=self._attributes
        )
        self._token = context.attach(trace.set_span_in_context(span))
        self.span = span

    def __exit__(self, exc_type, error, tb):
        if self.span is None:
            return None
        try:
            if error is not None:
                self._quietly(self._failed, error)
        finally:
            self._quietly(self._end)
        return None

    def _end(self) -> None:
        from opentelemetry import context

        try:
            # Detached whatever happens: else the thread's next spans would
            # be its children. (``detach`` logs what fails, never raises.)
            context.detach(self._token)
        finally:
            self.span.end()

    def _quietly(self, step, *args) -> None:
        """``step(*args)``; what it raises is logged, never the run's."""
        try:
            step(*args)
        except Exception:
            logger.warning(
                "span %r: %s failed; the run goes on", self._name, step.__name__, exc_info=True
            )

    def _failed(self, error: BaseException) -> None:
        from opentelemetry.trace import StatusCode

        kind = type(error)
        name = (
            kind.__qualname__
            if kind.__module__ == "builtins"
            else f"{kind.__module__}.{kind.__qualname__}"
        )
        message = _printed(error)
        self.span.set_attribute("error.type", name)
        self.span.set_status(StatusCode.ERROR, f"{kind.__name__}: {message}")
        try:
            self.span.record_exception(error)
        except Exception:
            # Its ``str()`` raised again: the same event, with what we printed.
            self.span.add_event(
                "exception",
                {
                    "exception.type": name,
                    "exception.message": message,
                    "exception.stacktrace": "".join(traceback.format_exception(error)),
                },
            )


def _printed(error: BaseException) -> str:
    """``str(error)``, or a placeholder if that raises (a ``__str__`` that
    fails, or returns no string)."""
    try:
        return str(error)
    except Exception:
        return f"<{type(error).__name__}: unprintable>"


def _run_attributes(run_id, lease_token: int) -> dict:
    return {"nrllm.run.id": str(run_id), "nrllm.attempt.lease_token": lease_token}


class _AttemptSpan(_Span):
    def __init__(self, tracer, lease, mode: str, resumed: bool):
        super().__init__(
            tracer,
            "nrllm.attempt",
            {
                **_run_attributes(lease.run_id, lease.token),
                "gen_ai.conversation.id": str(lease.run_id),
                "nrllm.run.mode": str(mode),
                "nrllm.attempt.resumed": resumed,
            },
        )
        self._outcome = None

    def replayed(self, journal) -> None:
        if self.span is not None:
            self._quietly(self._count_replayed, journal)

    def _count_replayed(self, journal) -> None:
        self.span.set_attributes(
            {
                "nrllm.attempt.replayed_turns": journal.model_turns,
                "nrllm.attempt.replayed_tool_results": journal.tool_results,
            }
        )

    def ended(self, outcome: str, error: BaseException | None = None) -> None:
        self._outcome = outcome
        if self.span is not None:
            self._quietly(self._end_as, outcome, error)

    def _end_as(self, outcome: str, error: BaseException | None) -> None:
        from opentelemetry.trace import StatusCode

        # A plain string: a ``TerminationReason`` (the loop's) is one too.
        outcome = str(outcome)
        self.span.set_attribute("nrllm.attempt.outcome", outcome)
        if error is not None:
            self._quietly(self._failed, error)
            self.span.set_attribute("nrllm.failure_class", str(classify(error)))
        elif outcome not in _FINE_ENDS:
            self.span.set_attribute("error.type", outcome)
            self.span.set_status(StatusCode.ERROR, outcome)

    def __exit__(self, exc_type, error, tb):
        if error is not None and self._outcome is None:
            interrupted = isinstance(error, KeyboardInterrupt)
            self.ended(AttemptEnd.INTERRUPTED if interrupted else AttemptEnd.FAILED)
        return super().__exit__(exc_type, error, tb)


class _ModelCallSpan(_Span):
    kind = "CLIENT"

    def __init__(self, tracer, lease, kind: str, model: str | None):
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": kind,
            # Its name before semantic conventions 1.37, which some backends still read.
            "gen_ai.system": kind,
            "gen_ai.conversation.id": str(lease.run_id),
            **_run_attributes(lease.run_id, lease.token),
        }
        if model:
            attributes["gen_ai.request.model"] = model
        super().__init__(tracer, f"chat {model}" if model else "chat", attributes)

    def returned(self, turn):
        if self.span is not None:
            self._quietly(self._describe, turn)
        return turn

    def _describe(self, turn) -> None:
        meta = turn.meta or {}
        attributes = {"nrllm.turn.tool_calls": len(turn.tool_calls)}
        if meta.get("model"):
            attributes["gen_ai.response.model"] = str(meta["model"])
        if meta.get("finish_reason"):
            attributes["gen_ai.response.finish_reasons"] = [str(meta["finish_reason"])]
        # The tokens as the run counts them (G17): none from a turn whose
        # counts are missing, or no sane whole number (negative, a bool,
        # beyond 10**8), which the run counts as unreported.
        usage = Usage.of_result(meta)
        if usage is not None and usage.reported:
            # ``input_tokens`` includes the cached ones, as the conventions say.
            attributes["gen_ai.usage.input_tokens"] = usage.prompt
            attributes["gen_ai.usage.output_tokens"] = usage.completion
            if "cached_tokens" in meta["usage"]:
                attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cached
        self.span.set_attributes(attributes)


class _ToolCallSpan(_Span):
    def __init__(self, tracer, call, context, call_id: str):
        tool = call.tool
        super().__init__(
            tracer,
            f"execute_tool {tool.name}",
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool.name,
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.type": "function",
                "nrllm.tool.effect": tool.effect.value,
                "nrllm.tool.idempotency_key": context.idempotency_key,
                "nrllm.tool.position": call.position,
                **_run_attributes(context.run_id, context.attempt),
            },
        )
