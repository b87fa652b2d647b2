"""A run's page as a compact trace (issue #41): the request once (not once
per attempt and again at the bottom), the error once (the summary), fields
under human labels, each step with how long it took. The browser's view of
it (tool names never broken mid-word, the table in the width) is in
test_browser_laptop.py."""

import html
import re
from datetime import UTC, datetime, timedelta

import pytest

from console.run_trace import took, tool_name_html
from runs.models import RunStep
from runs.models.vocabulary import StepKind
from runs.operators.actions import requeue
from tests.helpers import fresh
from tests.test_console_actions import auth_failed_run, page_of

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_run_page_shows_its_request_and_error_once_human_labels_and_each_steps_time(
    operator, operator_client
):
    agent_run = auth_failed_run()
    requeue(agent_run, operator, "key rotated")  # it fails again: two attempts
    agent_run = fresh(agent_run)
    assert agent_run.steps.filter(kind=StepKind.REQUEST).count() == 2

    page = operator_client.get(page_of(agent_run)).content.decode()

    # The request once: under Request; each attempt's request step links there.
    assert page.count("&quot;max_iterations&quot;") == 1
    assert page.count('href="#request-json" class="request-link"') == 2
    # The error once: in the summary, the failed call's row pointing to it.
    assert page.count("scripted auth failure") == 1
    row = re.search(r'<tr class="step-failed-call" id="failed-model-call">(.*?)</tr>', page, re.S)
    assert "<strong>failed (auth)</strong>" in row[1] and 'href="#summary-error"' in row[1]
    # Labels a person reads, not the columns' names.
    labels = [html.unescape(label) for label in re.findall(r'"field-label">([^<]*)<', page)]
    assert "Time in model calls" in labels and "Run id" in labels, labels
    assert not [label for label in labels if re.search(r"Llm|_| ms$|^Id$|Lease token", label)]
    # Filled for a scripted run too (issue #47: it said "-"), whose turns the
    # worker timed: its one model turn (the failed calls recorded none).
    model_time = re.search(r'field-model_time_shown">.*?<div class="readonly">(.*?)</div>', page)
    assert re.fullmatch(r"\d+ ms in 1 model call", model_time[1]), model_time[1]
    # Each step but an attempt's first says how long it took: a model turn
    # its call, as the worker timed it; a tool call since the step before.
    rows = re.findall(r'<tr class="step-(\w+)" id="step-(\d+)".*?</tr>', page, re.S)
    took_cells = re.findall(r'<td class="step-took">(.*?)</td>', page, re.S)
    assert len(took_cells) == len(rows) + 1  # and the failed call's
    since = r'title="since step \d+ was recorded">\d+\.\d s<'
    for (kind, sequence), cell in zip(rows, took_cells, strict=False):
        if kind == StepKind.LLM:
            assert re.search(r'title="the model call&#x27;s latency">\d+\.\d s<', cell), cell
        elif kind == StepKind.TOOL:
            assert re.search(since, cell), sequence
    assert re.search(r"\d+\.\d s", took_cells[-1])
    assert '<span class="step-kind">model turn</span>' in page
    # A model turn has its actions' cell; a tool call's is empty.
    assert page.count('<td class="step-actions">') == len(rows) + 1


def test_a_step_takes_its_model_calls_latency_or_the_time_since_the_step_before():
    start = datetime(2026, 12, 4, 16, 0, tzinfo=UTC)

    def step(sequence, kind, seconds, lease_token=1, **fields):
        return RunStep(
            sequence=sequence,
            kind=kind,
            lease_token=lease_token,
            created_at=start + timedelta(seconds=seconds),
            **fields,
        )

    request = step(1, StepKind.REQUEST, 0)
    turn = step(2, StepKind.LLM, 1.5, result={"latency_ms": 1234})
    tool = step(3, StepKind.TOOL, 1.9, tool_name="search_notes")
    unmeasured_turn = step(4, StepKind.LLM, 5.0, result={"content": "done"})
    next_attempt = step(5, StepKind.TOOL, 65, lease_token=2)

    assert took(request, None) is None
    assert took(turn, request)["text"] == "1.2 s"  # its own latency, not the 1.5 s gap
    assert took(tool, turn) == {"text": "0.4 s", "how": "since step 2 was recorded"}
    assert took(unmeasured_turn, tool)["text"] == "3.1 s"
    assert took(next_attempt, unmeasured_turn) is None  # the gap is between attempts
    assert str(tool_name_html("send_notification")) == (
        '<code class="tool-name">send_<wbr>notification</code>'
    )
    assert str(tool_name_html("<b>x")) == '<code class="tool-name">&lt;b&gt;x</code>'
