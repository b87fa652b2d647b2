"""A run's steps as a compact trace on its page (issue #41): a row a step,
with what kind of step it is in words, the tool's name (broken only where
the name itself breaks, at "_", "." or "-"), how long it took, what it was
given and what came of it.

How long a step took: a model turn its own ``latency_ms`` (the provider's
call, timed by the worker) when its record holds one; any other step the
time since the step before it in the same attempt was recorded (a step is
recorded when it is done, so that is how long it ran, the recording
included). The first step of an attempt, and a step whose predecessor was
another attempt's, took no time the journal knows of. ``RunStep`` holds
no timing of its own but ``created_at``: no migration.

The request is shown once, under Request: an attempt's request step that
holds the run's request says so and links there, instead of repeating it.
The run's error is shown once, in the summary: the model call that failed
(no step records it) ends the trace with its failure class and a link up.
"""

from datetime import timedelta

from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from console import approval_rows
from console.display import cut, effect_badge, shortened, span
from console.run_spend import turn_spend_text
from runs.models import AgentRun, RunStep
from runs.models.vocabulary import StepKind

#: A model's answer in its step's sentence (all of it in the record).
ANSWER_CHARS = 300
#: Failed model calls are recorded so: the provider's error, classified (G8).
PROVIDER_ERROR = "ProviderError"
#: Each kind of step in the words an operator reads.
KIND_WORDS = {
    StepKind.REQUEST: "request",
    StepKind.LLM: "model turn",
    StepKind.TOOL: "tool call",
    StepKind.OPERATOR: "operator",
    StepKind.REAPER: "reaper",
    StepKind.RESUME: "resumed",
    StepKind.APPROVAL: "approval",
    StepKind.INPUT: "input",
    StepKind.LATE_RESULT: "late result",
}
#: Where a tool's name may break: after these, never inside a word.
NAME_BREAKS = "_.-"


def trace_rows(run: AgentRun, steps) -> list[dict]:
    """The rows of ``steps`` (a page of the run's steps, in order). One
    query more when the page does not start at the first step: the step
    before it, for the first row's duration."""
    steps = list(steps)
    previous = None
    if steps and steps[0].sequence > 1:
        previous = run.steps.filter(sequence__lt=steps[0].sequence).order_by("-sequence").first()
    rows = []
    for step in steps:
        rows.append(trace_row(run, step, previous))
        previous = step
    return rows


def trace_row(run: AgentRun, step: RunStep, previous: RunStep | None) -> dict:
    is_run_request = step.kind == StepKind.REQUEST and step.arguments == run.request
    return {
        "step": step,
        "kind": KIND_WORDS.get(step.kind, step.kind),
        "tool": tool_name_html(step.tool_name),
        "badge": effect_badge(step.effect),
        "took": took(step, previous),
        # The run's request is shown under Request: not once per attempt.
        "is_run_request": is_run_request,
        "arguments": shortened(None if is_run_request else step.arguments),
        "outcome": shortened(step.error or step.result),
        "said": said(step),
        "spend": turn_spend_text(step),
        "is_turn": step.kind == StepKind.LLM,
    }


def took(step: RunStep, previous: RunStep | None) -> dict | None:
    """``{"text", "how"}``: how long ``step`` took and how that is known;
    None when the journal does not say (see the module's docstring)."""
    result = step.result if isinstance(step.result, dict) else {}
    latency = result.get("latency_ms")
    if step.kind == StepKind.LLM and isinstance(latency, int) and latency >= 0:
        return {"text": span(timedelta(milliseconds=latency)), "how": "the model call's latency"}
    if step.kind == StepKind.REQUEST or previous is None:
        return None
    if previous.lease_token != step.lease_token:
        return None  # another attempt's step: the gap is the time between attempts
    return {
        "text": span(step.created_at - previous.created_at),
        "how": f"since step {previous.sequence} was recorded",
    }


def tool_name_html(name: str):
    """``name`` in a ``<code class="tool-name">`` that may break only after
    "_", "." or "-" (a ``<wbr>`` there; the CSS forbids breaking elsewhere):
    "send_<wbr>notification", never "send_notifica / tion"."""
    if not name:
        return ""
    parts, part = [], ""
    for character in name:
        part += character
        if character in NAME_BREAKS:
            parts.append(part)
            part = ""
    parts.append(part)
    return format_html(
        '<code class="tool-name">{}</code>',
        # A constant, not text of the tool's: each part is escaped by the join.
        format_html_join(mark_safe("<wbr>"), "{}", ((part,) for part in parts if part)),
    )


def said(step: RunStep) -> str:
    """A model turn, an approval, an input, a resume or an operator step
    as a sentence (its whole record behind it); "" for other kinds."""
    if step.kind == StepKind.APPROVAL:
        return approval_rows.approval_summary(step)
    if step.kind == StepKind.INPUT:
        return approval_rows.input_summary(step)
    if step.kind == StepKind.LLM:
        return approval_rows.step_row(step)["what"] + _answer(step)
    result = step.result if isinstance(step.result, dict) else {}
    if step.kind == StepKind.RESUME:
        summary = result.get("summary")
        return summary if isinstance(summary, str) else ""
    if step.kind != StepKind.OPERATOR:
        return ""
    what = f"{result.get('action', '?')} by {result.get('operator') or '?'}"
    if result.get("outcome"):
        what += f" ({result['outcome']})"
    return f"{what}: {result['note']}" if result.get("note") else what


def _answer(step: RunStep) -> str:
    content = approval_rows.turn_content(step)
    return f": {cut(content, ANSWER_CHARS)}" if content else ""


def failed_model_call(run: AgentRun) -> dict | None:
    """The model call the run's last attempt failed on, from the run's error
    fields (None: it did not fail on one). Its turn is the one after the
    journal's last: one count on the (run, sequence) index; how long it
    took, from the attempt's last step to the run's end: one query more."""
    if run.error_type != PROVIDER_ERROR:
        return None
    turns = run.steps.filter(kind=StepKind.LLM, sequence__gt=run.journal_begins_after).count()
    last = run.steps.filter(lease_token=run.lease_token).order_by("-sequence").first()
    took_text = ""
    if last is not None and run.finished_at is not None:
        took_text = span(run.finished_at - last.created_at)
    return {
        "turn": turns + 1,
        "failure_class": run.failure_class or "unknown",
        "error": run.error_message,
        "attempt": run.lease_token,
        "at": run.finished_at,
        "took": took_text,
    }
