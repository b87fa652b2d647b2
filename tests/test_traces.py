"""OpenTelemetry traces of a run (docs/observability.md#traces), caught by the
SDK's in-memory exporter: a span per attempt, per live model call (GenAI
``chat``) and per tool call executed (``execute_tool``), with the effect and
idempotency key; nothing for what a resumed attempt replays. In-process, as
``test_approvals.py`` runs runs; the processes (the on-switch, a forked work
horse, nothing imported when off) are in ``test_traces_processes.py``."""

import threading
import time

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from ground import tracing
from runs.approvals import actions as approval_actions
from runs.models import ApprovalRequest
from runs.models.vocabulary import RunStatus
from runs.runtime import enqueue, run
from tests.drifting_model import FAKE_USAGE, NOTIFY, SEARCH, request_for
from tests.fake_openai import Reply, completion
from tests.helpers import answer, call, fresh, scripted

pytestmark = pytest.mark.django_db(transaction=True)

TOOLS = ["search_notes", "send_notification"]
#: A read, then a write that waits for approval, then the answer.
PLAN = [{"calls": [SEARCH]}, {"calls": [NOTIFY]}, {"answer": "sent (take {take})"}]


@pytest.fixture
def exported():
    """Spans made while the test runs, each exported as it ends."""
    exporter = InMemorySpanExporter()
    tracing.start(exporter, batch=False)
    yield exporter
    tracing.stop()


def named(spans, prefix: str) -> list:
    return [span for span in spans if span.name.startswith(prefix)]


def children(spans, parent) -> list:
    return [span for span in spans if span.parent and span.parent.span_id == parent.context.span_id]


@pytest.mark.usefixtures("approvals")
@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_a_run_that_reads_waits_for_approval_and_writes_is_traced_attempt_by_attempt(
    model, operator, exported
):
    drifting = model is not None
    agent_run = enqueue(
        request_for("drifting" if drifting else "scripted", PLAN, TOOLS, scripted_usage=FAKE_USAGE)
    )
    (request,) = ApprovalRequest.objects.filter(run=agent_run)
    # The first attempt: the read's turn, the read, the write's turn; then it waits.
    (first,) = named(exported.get_finished_spans(), "nrllm.attempt")
    assert first.attributes["nrllm.attempt.outcome"] == "waiting_for_approval"
    assert first.status.status_code is StatusCode.UNSET

    assert approval_actions.approve(request, operator, digest=request.digest).ok

    assert fresh(agent_run).status == RunStatus.COMPLETED
    spans = exported.get_finished_spans()
    first, second = named(spans, "nrllm.attempt")
    run_id = str(agent_run.pk)
    for attempt, resumed in ((first, False), (second, True)):
        assert attempt.kind is SpanKind.INTERNAL and attempt.parent is None
        assert attempt.attributes["nrllm.run.id"] == run_id
        assert attempt.attributes["gen_ai.conversation.id"] == run_id
        assert attempt.attributes["nrllm.run.mode"] == "queued"
        assert attempt.attributes["nrllm.attempt.resumed"] is resumed
    assert first.context.trace_id != second.context.trace_id
    token = {first: first.attributes["nrllm.attempt.lease_token"]}
    token[second] = second.attributes["nrllm.attempt.lease_token"]
    assert token[second] == token[first] + 1
    # What the second attempt replayed: no span, a count on its own.
    assert "nrllm.attempt.replayed_turns" not in first.attributes
    assert second.attributes["nrllm.attempt.replayed_turns"] == 2
    assert second.attributes["nrllm.attempt.replayed_tool_results"] == 1
    assert second.attributes["nrllm.attempt.outcome"] == "completed"

    calls = {
        attempt: [
            (span.name, span.attributes["gen_ai.operation.name"])
            for span in children(spans, attempt)
        ]
        for attempt in (first, second)
    }
    chat = "chat drifting" if drifting else "chat"
    assert calls[first] == [
        (chat, "chat"),
        ("execute_tool search_notes", "execute_tool"),
        (chat, "chat"),
    ]
    assert calls[second] == [("execute_tool send_notification", "execute_tool"), (chat, "chat")]
    assert len(spans) == 2 + 5  # nothing else: no span for the replayed turns and read

    for attempt in (first, second):
        for span in children(spans, attempt):
            assert span.attributes["nrllm.run.id"] == run_id
            assert span.attributes["nrllm.attempt.lease_token"] == token[attempt]
            assert span.status.status_code is StatusCode.UNSET
    read, write = named(spans, "execute_tool")
    assert read.kind is SpanKind.INTERNAL
    assert read.attributes["gen_ai.tool.name"] == "search_notes"
    assert read.attributes["nrllm.tool.effect"] == "read_only"
    assert read.attributes["nrllm.tool.position"] == "1.0"
    (search_step,) = agent_run.steps.filter(kind="tool", tool_name="search_notes")
    assert read.attributes["nrllm.tool.idempotency_key"] == search_step.idempotency_key
    # The write: the very call the operator approved.
    assert write.attributes["gen_ai.tool.name"] == "send_notification"
    assert write.attributes["nrllm.tool.effect"] == "non_idempotent_write"
    assert write.attributes["nrllm.tool.idempotency_key"] == request.idempotency_key
    assert write.attributes["nrllm.tool.position"] == "2.0"
    turn = agent_run.steps.get(sequence=request.turn_sequence).result
    assert write.attributes["gen_ai.tool.call.id"] == (
        turn["tool_calls"][0].get("id") or "call_2_0"
    )

    for span in named(spans, "chat"):
        assert span.kind is SpanKind.CLIENT
        provider = "openai" if drifting else "scripted"
        assert span.attributes["gen_ai.provider.name"] == provider
        assert span.attributes["gen_ai.system"] == provider
        assert span.attributes["gen_ai.conversation.id"] == run_id
        assert span.attributes["gen_ai.usage.input_tokens"] == FAKE_USAGE["prompt_tokens"]
        assert span.attributes["gen_ai.usage.output_tokens"] == FAKE_USAGE["completion_tokens"]
        if drifting:
            assert span.attributes["gen_ai.request.model"] == "drifting"
            assert span.attributes["gen_ai.response.model"] == "fake-model"
        else:
            assert "gen_ai.request.model" not in span.attributes
            assert "gen_ai.response.model" not in span.attributes
    finish_reasons = [
        span.attributes.get("gen_ai.response.finish_reasons") for span in named(spans, "chat")
    ]
    assert finish_reasons == (
        [("tool_calls",), ("tool_calls",), ("stop",)] if drifting else [None] * 3
    )


def test_a_failed_attempt_and_its_model_call_say_why(settings, exported):
    settings.NRLLM_MAX_REQUEUES = 0
    agent_run = enqueue(scripted({"error": "rate_limit"}, answer()))

    assert fresh(agent_run).status == RunStatus.FAILED
    (attempt,) = named(exported.get_finished_spans(), "nrllm.attempt")
    (chat,) = children(exported.get_finished_spans(), attempt)
    for span in (attempt, chat):
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes["error.type"] == "runs.providers.base.ProviderError"
        assert [event.name for event in span.events] == ["exception"]
    assert attempt.attributes["nrllm.attempt.outcome"] == "failed"
    assert attempt.attributes["nrllm.failure_class"] == "rate_limit"


def test_a_tool_error_marks_its_span_and_the_run_goes_on(exported):
    agent_run = enqueue(
        scripted(
            {"tool_calls": [{"name": "read_note", "arguments": {"slug": "no-such-note"}}]},
            answer(),
            tools=["read_note"],
        )
    )

    assert fresh(agent_run).status == RunStatus.COMPLETED
    (tool,) = named(exported.get_finished_spans(), "execute_tool")
    assert tool.status.status_code is StatusCode.ERROR
    assert tool.attributes["error.type"] == "tools.contract.ToolError"
    (attempt,) = named(exported.get_finished_spans(), "nrllm.attempt")
    assert attempt.attributes["nrllm.attempt.outcome"] == "completed"
    assert attempt.status.status_code is StatusCode.UNSET


def test_a_run_that_hits_its_iteration_cap_ends_its_attempt_in_error(exported):
    loop = {"tool_calls": [{"name": "search_notes", "arguments": {"query": "x"}}]}
    agent_run = enqueue(scripted(loop, loop, tools=["search_notes"], max_iterations=2))

    assert fresh(agent_run).status == RunStatus.FAILED
    (attempt,) = named(exported.get_finished_spans(), "nrllm.attempt")
    assert attempt.attributes["nrllm.attempt.outcome"] == "max_iterations"
    assert attempt.attributes["error.type"] == "max_iterations"
    assert attempt.status.status_code is StatusCode.ERROR


@pytest.mark.parametrize("tool", ["unprintable_read", "unprintable_write"])
def test_a_tool_error_that_cannot_be_printed_ends_the_run_as_it_does_untraced(settings, tool):
    """The spans run inside the runtime's own ``try`` blocks: a span that
    raised, printing the error, would put its exception in the tool's place
    (a read would complete, an idempotent write be retried), and, never
    ended, stay the parent of the attempt's next spans."""
    settings.NRLLM_TOOLS = [f"tests.tools_for_tests.{name}" for name in TOOLS_THAT_RAISE]
    settings.NRLLM_MAX_REQUEUES = 0

    def ending() -> tuple:
        agent_run = fresh(enqueue(scripted(call(tool), answer(), tools=[tool])))
        return agent_run.status, agent_run.termination_reason, agent_run.error_type

    untraced = ending()
    exporter = InMemorySpanExporter()
    tracing.start(exporter, batch=False)
    try:
        assert ending() == untraced
    finally:
        tracing.stop()
    spans = exporter.get_finished_spans()
    (attempt,) = named(spans, "nrllm.attempt")
    (span,) = named(spans, f"execute_tool {tool}")
    assert span.status.description == "Unprintable: <Unprintable: unprintable>"
    assert span.events[0].attributes["exception.message"] == "<Unprintable: unprintable>"
    assert [other.parent.span_id for other in spans if other is not attempt] == [
        attempt.context.span_id
    ] * (len(spans) - 1)


TOOLS_THAT_RAISE = ("UnprintableRead", "UnprintableWrite")


def test_a_turns_token_counts_are_exported_as_the_run_counts_them(fake_openai, exported):
    """A count no sane whole number (here one beyond 10**8, one negative)
    leaves the turn's tokens unreported in the run (G17): nor does its span
    say any."""
    body = completion("done")
    body["usage"] = {"prompt_tokens": 10**20, "completion_tokens": -5, "total_tokens": 0}
    fake_openai.script(Reply(body=body))

    agent_run = run({"prompt": "p", "provider": {"kind": "openai", "model": "fake-model"}})

    assert (agent_run.status, agent_run.prompt_tokens, agent_run.unpriced_turns) == (
        RunStatus.COMPLETED,
        0,
        1,
    )
    (chat,) = named(exported.get_finished_spans(), "chat")
    assert chat.attributes["gen_ai.response.model"] == "fake-model"  # the turn was described
    assert not [key for key in chat.attributes if key.startswith("gen_ai.usage.")]


def test_with_traces_stopped_a_run_makes_no_span(exported):
    tracing.stop()
    enqueue(scripted(answer()))
    assert exported.get_finished_spans() == ()
    tracing.start(exported, batch=False)  # for the fixture to stop


def test_a_flush_waits_no_longer_than_it_is_told():
    """A work horse's flush (``runs.worker.HORSE_FLUSH_SECONDS``): a
    collector that does not answer holds it that long, not the exporter's
    timeout and retries."""

    class Held(InMemorySpanExporter):
        def __init__(self):
            super().__init__()
            self.release = threading.Event()

        def export(self, spans):
            self.release.wait(10)
            return super().export(spans)

    held = Held()
    tracing.start(held)
    try:
        tracing.tracer.start_span("a span").end()
        started = time.monotonic()
        assert tracing.flush(timeout_seconds=0.2) is False
        assert time.monotonic() - started < 2
        held.release.set()
        assert tracing.flush(timeout_seconds=10) is True
        assert [span.name for span in held.get_finished_spans()] == ["a span"]
    finally:
        held.release.set()
        tracing.stop()
