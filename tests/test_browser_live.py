"""Live pages in a real browser (issue #41, docs/console.md#live-pages), at
1366 × 900: while a worker records a step and then ends its run, and
another operator approves a call, the run page, the runs list, the overview
and the approvals inbox — open side by side — show it without a reload;
nothing the operator holds moves or is lost (the scroll position, an open
fieldset, a note being typed, the runs selected on the list); the run
page's heading, breadcrumbs and title follow the run's status and it stops
asking once its run has ended; the list says when runs came
instead of moving its rows; a tab in the background does not ask; and a
page whose server does not answer stays as it was, says so, and catches
up. The run's changes come from the test, through the same transitions a
worker uses."""

import re
import threading
from collections import Counter
from urllib.parse import urlsplit

import pytest
from django.db import connection
from playwright.sync_api import expect

from runs import transitions
from runs.approvals import actions as approval_actions
from runs.models import ApprovalRequest
from runs.models.vocabulary import RunStatus
from runs.runtime import enqueue
from tests.browser import admin_page
from tests.browser_boxes import assert_shown
from tests.helpers import answer, call, fresh, scripted, stored

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: How often the pages poll here (the shipped default is 5 s).
POLL_SECONDS = 0.4
RUNS = "/admin/runs/agentrun/"
#: The tab sent to the background (false) or brought back (true), as the
#: browser tells a page: ``document.hidden`` and a ``visibilitychange``.
SHOWN = """shown => {
  Object.defineProperty(document, "hidden", {value: !shown, configurable: true});
  document.dispatchEvent(new Event("visibilitychange"));
}"""
INBOX = "/admin/runs/agentrun/approvals/"
#: How long a page may take to catch up: a few polls, on a test server that
#: answers several pages' polls one at a time on a machine that may be busy.
CATCH_UP = 15_000


def a_tool_step(number: int) -> dict:
    return {
        "kind": "tool",
        "tool_name": "search_notes",
        "effect": "read_only",
        "arguments": {"query": f"incident {number}"},
        "result": {"notes": [f"note {number}"]},
    }


def waiting_for_approval(prompt: str):
    notify = call("send_notification", recipient="oncall", message=prompt)
    request = {
        **scripted(notify, answer("Sent."), tools=["send_notification"], prompt=prompt),
        "require_approval": ["send_notification"],
    }
    waiting = enqueue(request)
    assert fresh(waiting).status == RunStatus.WAITING_FOR_APPROVAL
    return waiting


def elsewhere(change):
    """``change`` (ORM work) in a thread of its own, its connection closed
    after: inside Playwright's block the ORM would hold one past the test."""
    outcome = {}

    def target():
        try:
            outcome["value"] = change()
        except BaseException as error:  # re-raised in the test
            outcome["error"] = error
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(60)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def test_live_pages_show_a_new_step_an_ended_run_and_a_decided_call_without_a_reload(
    live_server, operator, settings, orm_beside_the_browser
):
    settings.NRLLM_LIVE_POLL_SECONDS = POLL_SECONDS
    # Before the browser opens: a running run with enough steps to scroll,
    # two runs waiting for approval, one completed.
    running = transitions.create_queued_run(stored(scripted(answer())), "Sort the incidents")
    lease = transitions.claim(running.pk, "worker-1", 600).lease
    for number in range(15):
        assert transitions.record_step(lease, 600, a_tool_step(number), clear_fence=False).persisted
    kept_waiting = waiting_for_approval("Failover at 22:00 UTC")
    decided_elsewhere = waiting_for_approval("Disk full on db-2")
    done = enqueue(scripted(answer(), prompt="Summarise the week"))
    (approval,) = ApprovalRequest.objects.filter(run=decided_elsewhere)
    run_path = f"{RUNS}{running.pk}/change/"

    base = live_server.url
    polls = Counter()  # path → polls (live.js marks its requests)

    def counted(page):
        page.on(
            "request",
            lambda request: (
                request.headers.get("x-nrllm-live") and polls.update([urlsplit(request.url).path])
            ),
        )
        return page

    def beside(page):
        """Another window, logged in as ``page`` is."""
        context = page.context.browser.new_context(
            viewport=page.viewport_size, storage_state=page.context.storage_state()
        )
        return counted(context.new_page())

    # Logged in, the admin shows the overview.
    with admin_page(base, "olivia", viewport=(1366, 900)) as overview:
        counted(overview)
        runs_list = beside(overview)
        runs_list.goto(f"{base}{RUNS}")
        for run_id in (running.pk, done.pk):
            runs_list.check(f"input.action-select[value='{run_id}']")
        counter = runs_list.locator(".action-counter").inner_text()
        assert counter.startswith("2 of"), counter
        running_row = runs_list.locator("#result_list tbody tr", has_text="Sort the incidents")
        expect(running_row.locator(".run-status")).to_have_text("running")

        expect(overview.locator("#running")).to_have_text("1")

        inbox = beside(overview)
        inbox.goto(f"{base}{INBOX}")
        note = inbox.locator(f"#run-{kept_waiting.pk} input[name=note]")
        note.fill("asking the DBA first")
        # Another operator approves the other call: its run goes on and ends.
        elsewhere(
            lambda: approval_actions.approve(
                ApprovalRequest.objects.get(pk=approval.pk), operator, digest=approval.digest
            )
        )
        expect(inbox.locator(f"#run-{decided_elsewhere.pk}")).to_have_count(0, timeout=CATCH_UP)
        expect(inbox.locator("#pending-approvals h2")).to_have_text("Waiting for a decision (1)")
        expect(inbox.locator("#header-approvals")).to_have_text("1 call waiting for approval")
        expect(note).to_have_value("asking the DBA first")  # typed, kept
        # A tab in the background does not ask; shown again, it asks at once.
        inbox.evaluate(SHOWN, False)
        asked = polls[INBOX]
        inbox.wait_for_timeout(POLL_SECONDS * 1000 * 3)
        assert polls[INBOX] == asked, polls
        with inbox.expect_request(lambda request: request.headers.get("x-nrllm-live")):
            inbox.evaluate(SHOWN, True)
        inbox.context.close()  # fewer pages asking the one test server

        # The run page: a note typed in its summary, the lease fieldset
        # opened, scrolled down to the steps.
        run_page = beside(overview)
        run_page.goto(f"{base}{run_path}")
        run_page.click("#fieldset-4 summary")
        cancel_note = run_page.locator("#run-summary .cancel-form input[name=note]")
        cancel_note.fill("stuck?")
        run_page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
        scrolled = run_page.evaluate("window.scrollY")
        assert scrolled > 300, scrolled
        steps = run_page.locator("#steps tbody tr")
        expect(steps).to_have_count(16)  # the request and 15 tool calls
        # The heading, the breadcrumbs and the window's title name the run
        # with its status (below: they change with it).
        heading = run_page.locator("#run-heading")
        here = run_page.locator("#run-breadcrumbs li[aria-current=page]")
        for names_it in (heading, here):
            expect(names_it).to_have_text(f"run {running.pk} (running)")
        expect(run_page).to_have_title(re.compile(rf"^run {running.pk} \(running\) \| "))
        model_time = run_page.locator(".field-model_time_shown .readonly")
        expect(model_time).to_have_text("-")
        ran = run_page.locator("#summary-ran").inner_text()

        elsewhere(lambda: transitions.record_step(lease, 600, a_tool_step(15), clear_fence=False))
        expect(steps).to_have_count(17, timeout=CATCH_UP)
        expect(steps.last).to_contain_text("incident 15")
        assert run_page.evaluate("window.scrollY") == scrolled
        # Where the operator types, nothing was swapped ("ran … so far" moves on
        # with every poll there): the note, its focus and the old time stay.
        expect(cancel_note).to_have_value("stuck?")
        expect(cancel_note).to_be_focused()
        assert run_page.locator("#summary-ran").inner_text() == ran
        expect(run_page.locator("#fieldset-4")).to_have_attribute("open", "")

        # The operator lets go of the note; the run ends. The summary grows
        # (the verdicts) above the steps, which stay where they were on screen.
        # (Not page.fill: it would scroll the note into view.)
        run_page.evaluate(
            "() => { const note = document.activeElement; note.value = ''; note.blur(); }"
        )
        assert run_page.evaluate("window.scrollY") == scrolled
        looked_at = steps.nth(14).bounding_box()["y"]
        assert 0 < looked_at < 900, looked_at  # on the screen
        # Its model call took 1.4 s, as the worker timed it (a scripted turn
        # reports no usage: the run's usage totals leave its time out).
        final = {
            "kind": "llm",
            "result": {"content": "Sorted.", "tool_calls": [], "latency_ms": 1400},
        }
        elsewhere(lambda: transitions.finish(lease, [final], output="Sorted."))
        expect(run_page.locator("#summary-status")).to_have_text("completed", timeout=CATCH_UP)
        # Issue #47: the heading, the breadcrumbs and the title said "running"
        # until a reload; the time in model calls stayed "-".
        for names_it in (heading, here):
            expect(names_it).to_have_text(f"run {running.pk} (completed)")
        expect(run_page).to_have_title(re.compile(rf"^run {running.pk} \(completed\) \| "))
        expect(model_time).to_have_text("1.4 s in 1 model call")
        assert_shown(run_page, "#run-heading", "#run-breadcrumbs")
        expect(run_page.locator("#requeue-verdict")).to_be_attached()
        expect(steps).to_have_count(18)
        assert abs(steps.nth(14).bounding_box()["y"] - looked_at) < 1
        expect(run_page.locator("#fieldset-4")).to_have_attribute("open", "")
        # Nothing left in flight on the run page: it stops asking.
        asked = polls[run_path]
        run_page.wait_for_timeout(POLL_SECONDS * 1000 * 3)
        assert polls[run_path] == asked > 1, polls

        # The list and the overview caught up; the runs selected stay selected.
        expect(running_row.locator(".run-status")).to_have_text("completed", timeout=CATCH_UP)
        for run_id in (running.pk, done.pk):
            expect(runs_list.locator(f"input.action-select[value='{run_id}']")).to_be_checked()
        assert runs_list.locator(".action-counter").inner_text() == counter
        # A row that changed but was not selected: its checkbox is the one the
        # admin's "select all" still knows (it names the run and its status).
        decided_row = runs_list.locator("#result_list tbody tr", has_text="Disk full on db-2")
        expect(decided_row.locator(".run-status")).to_have_text("completed")
        runs_list.check("#action-toggle")
        expect(runs_list.locator("input.action-select:not(:checked)")).to_have_count(0)
        expect(overview.locator("#running")).to_have_text("0", timeout=CATCH_UP)
        assert polls[RUNS] > 1 and polls["/admin/"] > 1, polls
        # A run arrives: the list does not slide its rows under the
        # operator's pointer; it says it changed, with a link to reload.
        elsewhere(lambda: enqueue(scripted(answer(), prompt="Arrived later")))
        changed = runs_list.locator("#live-status")
        expect(changed).to_contain_text("This list has changed", timeout=CATCH_UP)
        expect(changed.locator("a")).to_have_text("reload")
        expect(runs_list.locator("#result_list tbody tr")).to_have_count(4)
        # The run that arrived ran as it was enqueued (without Redis it runs
        # in its caller): a poll the overview made meanwhile showed it running.
        # Its next shows it ended; a fresh clone's loaded host cut the server
        # off below before that poll came.
        expect(overview.locator("#running")).to_have_text("0", timeout=CATCH_UP)

        # The server does not answer: the overview stays as it was, says so
        # quietly, and catches up once it answers again.
        overview.route("**/admin/", lambda route: route.abort())
        status = overview.locator("#live-status")
        expect(status).to_contain_text("Not updating", timeout=CATCH_UP)
        expect(overview.locator("#running")).to_have_text("0")
        overview.unroute("**/admin/")
        expect(status).to_be_hidden(timeout=CATCH_UP)
