"""The overview, the admin's landing page, in a real browser at a laptop's
width and a desktop's: its numbers, the reaper's liveness and the charts
are on the screen, none cut, and the header counts the calls waiting for
approval. Saves the laptop's view for the manual (docs/console.md)."""

import pytest
from playwright.sync_api import expect

from runs import transitions
from runs.models import AgentRun
from runs.models.last_passes import EMBEDDED_WORKER
from runs.reaper import Beat, reap_stale_runs
from runs.runtime import enqueue, run
from runs.transitions import db_time
from tests.browser import admin_page
from tests.helpers import answer, call, scripted
from tests.test_browser import spend_history
from tests.test_console import audit_failed_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: What must be on the screen, whole.
MODULES = ["#now", "#liveness", "#runs-chart", "#failures-chart", "#spend-chart", "#app-lists"]


def a_day_of_runs(settings):
    """Runs over the last 24 hours, some failed (three classes), one write
    in doubt, one waiting for approval, one queued long overdue; and the
    embedded worker's pass, just now."""
    reap_stale_runs(beat=Beat(EMBEDDED_WORKER, 1))
    for hour in range(0, 24, 2):
        requests = [scripted(answer(), prompt=f"hour {hour}") for _ in range(1 + hour % 5)]
        if hour % 3 == 0:
            requests.append(
                scripted({"error": ("auth", "client_error", "configuration")[hour % 9 // 3]})
            )
        made = [run(request) for request in requests]
        AgentRun.objects.filter(pk__in=[m.pk for m in made]).update(
            created_at=db_time(-hour * 3600 - 60)
        )
    audit_failed_run()
    overdue = transitions.create_queued_run({"prompt": "p", "tools": []}, "p")
    AgentRun.objects.filter(pk=overdue.pk).update(available_at=db_time(-600))
    settings.NRLLM_APPROVAL_REQUIRED_FOR = "non_idempotent_write"
    notify = call("send_notification", recipient="team", message="v2 is out")
    enqueue(scripted(notify, answer(), tools=["send_notification"]))


@pytest.mark.parametrize("viewport", [(1366, 900), (1920, 1080)], ids=["laptop", "desktop"])
def test_the_overview_fits_the_screen(
    live_server, operator, settings, orm_beside_the_browser, screenshots, viewport
):
    # Before the browser opens (see test_browser.py): the ORM in its block
    # would hold a connection past the test.
    a_day_of_runs(settings)
    spend_history(operator)
    width, _ = viewport
    with admin_page(live_server.url, "olivia", viewport=viewport) as page:
        page.goto(f"{live_server.url}/admin/")
        expect(page.locator("#header-approvals")).to_have_text("1 call waiting for approval")
        expect(page.locator("#header-approvals")).to_be_in_viewport()
        expect(page.locator("#pending-approvals")).to_have_text("1")
        expect(page.locator("#writes-in-doubt")).to_have_text("1")
        expect(page.locator("#overdue")).to_have_text("1")
        expect(page.locator("#liveness .badge.alive")).to_have_text("alive")
        expect(page.locator("#runs-chart g.hour")).to_have_count(24)
        expect(page.locator("#failures-legend li")).to_have_count(
            4
        )  # and the audit failure: unknown
        sidebar = page.locator("#content-related").bounding_box()
        for selector in MODULES:
            box = page.locator(selector).bounding_box()
            assert box and box["x"] >= 0 and box["x"] + box["width"] <= width, (selector, box)
            if selector != "#app-lists":  # beside the sidebar, not under it
                assert box["x"] + box["width"] <= sidebar["x"], (selector, box, sidebar)
        # Nothing scrolls sideways: not the page, not a module.
        overflowing = page.evaluate(
            """() => [document.documentElement, ...document.querySelectorAll('#content .module')]
                .filter(e => e.scrollWidth > e.clientWidth)
                .map(e => e.id || e.className || e.tagName)"""
        )
        assert overflowing == [], overflowing
        if width == 1366:
            page.screenshot(path=screenshots / "overview-1366.png")
        page.click("#window-7d")
        expect(page.locator("#runs-chart g.hour")).to_have_count(168)
        box = page.locator("#runs-chart").bounding_box()
        assert box["x"] + box["width"] <= width, box
