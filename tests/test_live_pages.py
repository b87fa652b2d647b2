"""Live pages (issue #41, docs/console.md#live-pages), server side: a page
polls itself only while something it shows is in flight, and a poll is the
page itself — the same permission checks, the same queries however many
rows it shows, never one more per row — that leaves the operator's
messages for the page they load next. The browser's side (what is swapped,
what is kept, when it stops) is tests/test_browser_live.py."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import transitions
from runs.runtime import enqueue
from tests.helpers import answer, call, scripted, stored

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/runs/agentrun/"
INBOX = "/admin/runs/agentrun/approvals/"
#: What live.js sends with each poll.
POLL = {"X-Nrllm-Live": "1"}
#: The script a page in flight carries (admin/runs/_live.html).
MARKER = 'id="live-poll"'


def running_run(steps: int):
    """A run claimed by a worker that recorded ``steps`` tool steps."""
    agent_run = transitions.create_queued_run(stored(scripted(answer())), "in flight")
    lease = transitions.claim(agent_run.pk, "worker-1", 600).lease
    for number in range(steps):
        step = {
            "kind": "tool",
            "tool_name": "search_notes",
            "effect": "read_only",
            "arguments": {"query": f"q{number}"},
            "result": {"notes": [f"note {number}"]},
        }
        assert transitions.record_step(lease, 600, step, clear_fence=False).persisted
    return agent_run, lease


def poll(client, url) -> tuple[str, int]:
    """The page as a poll gets it, and the queries it cost."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, headers=POLL)
    assert response.status_code == 200, url
    return response.content.decode(), len(queries)


def test_a_poll_of_the_runs_list_or_the_inbox_costs_what_the_page_does_whatever_its_rows(
    operator_client, approvals
):
    transitions.create_queued_run(stored(scripted(answer())), "queued")
    enqueue(scripted(answer(), prompt="done"))
    ended = f"{RUNS}?status__exact=completed"
    poll(operator_client, RUNS)  # the process's caches (content types) filled
    page, few = poll(operator_client, RUNS)
    assert MARKER in page
    with CaptureQueriesContext(connection) as loaded:
        operator_client.get(RUNS)
    assert len(loaded) == few  # the poll is the page: not one query more
    # Nothing shown in flight (every row looked at): no script, so a poll
    # that gets this page back stops there.
    page, few_ended = poll(operator_client, ended)
    assert MARKER not in page

    for number in range(15):
        transitions.create_queued_run(stored(scripted(answer())), f"queued {number}")
        enqueue(scripted(answer(), prompt=f"done {number}"))
    page, many = poll(operator_client, RUNS)
    assert page.count('class="action-select"') == 32 and many == few
    page, many_ended = poll(operator_client, ended)
    assert page.count('class="action-select"') == 16 and many_ended == few_ended

    # The inbox: live while a call waits; a poll costs what its page does.
    page, _ = poll(operator_client, INBOX)
    assert "No call waits for approval" in page and MARKER not in page
    notify = call("send_notification", recipient="oncall", message="disk full")
    waiting = enqueue(scripted(notify, answer(), tools=["send_notification"]))
    page, polled = poll(operator_client, INBOX)
    assert f'id="run-{waiting.pk}"' in page and MARKER in page
    with CaptureQueriesContext(connection) as loaded:
        operator_client.get(INBOX)
    assert len(loaded) == polled


def test_a_poll_of_a_run_page_costs_the_same_with_many_steps_and_stops_when_it_ends(
    operator_client, outsider_client, settings
):
    agent_run, lease = running_run(steps=2)
    url = f"{RUNS}{agent_run.pk}/change/"
    poll(operator_client, url)  # the process's caches (content types) filled
    page, few = poll(operator_client, url)
    assert MARKER in page and 'data-interval-ms="5000"' in page
    for _ in range(40):
        assert transitions.record_step(lease, 600, {"kind": "llm"}, clear_fence=False).persisted
    page, many = poll(operator_client, url)
    assert "Steps (43)" in page and many == few

    # A message an action left is for the page the operator loads next,
    # not for a poll that happened to come first.
    response = operator_client.post(f"{RUNS}{agent_run.pk}/cancel/", {"note": "enough"})
    assert response.status_code == 302
    page, _ = poll(operator_client, url)
    assert 'class="messagelist"' not in page
    assert 'class="messagelist"' in operator_client.get(url).content.decode()

    # Whoever may not see the page may not poll it: sent to log in, as the
    # page sends them (live.js then stops and says to reload).
    for page_url in (url, RUNS, INBOX, "/admin/"):
        response = outsider_client.get(page_url, headers=POLL)
        assert response.status_code == 302 and response.url.startswith("/admin/login/")

    final = {"kind": "llm", "result": {"content": "done", "tool_calls": []}}
    transitions.finish(lease, [final], output="done")
    page, _ = poll(operator_client, url)
    assert "<title>run " in page and "(cancelled)" in page and MARKER not in page

    settings.NRLLM_LIVE_POLL_SECONDS = 0  # polling off: no page polls
    assert MARKER not in poll(operator_client, RUNS)[0]
