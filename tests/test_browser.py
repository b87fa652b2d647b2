"""The console in a real browser: Playwright driving Debian's chromium against
the live test server. Saves screenshots of the main pages for the manual (docs/console.md)."""

import json
import re
from datetime import UTC, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from playwright.sync_api import expect

from runs.models import AgentRun
from runs.models.faults import step_inserts_refused
from runs.runtime import enqueue, run
from spend.budgets import database_now
from spend.models import DailySpend
from tests.browser import DOCS_SCREENSHOTS, admin_page
from tests.browser_boxes import assert_shown, assert_table_fits
from tests.helpers import answer, call, retried_when_due, scripted
from tools.models import Note

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def runs_to_operate_on():
    Note.objects.create(slug="release", body="v1")
    completed = run(
        scripted(
            call("read_note", slug="release"),
            call("upsert_note", slug="release", body="v2"),
            answer("Release notes updated."),
            tools=["read_note", "upsert_note"],
            prompt="Update the release notes",
        )
    )
    safe = enqueue(
        scripted(
            call("search_notes", query="incident"),
            {"error": "auth"},
            tools=["search_notes"],
            prompt="Summarise the incidents",
        )
    )
    with step_inserts_refused("send_notification"):
        unsafe = enqueue(
            scripted(
                call("send_notification", recipient="oncall", message="<b>disk full</b>"),
                answer(),
                tools=["send_notification"],
                prompt="Page on-call",
            )
        )
    # Its provider fails once after the notification: the retry resumes.
    resumed = enqueue(
        scripted(
            call("send_notification", recipient="team", message="v2 is out"),
            {"error": "server_error", "attempts": 1},
            answer("Sent once."),
            tools=["send_notification"],
            prompt="Announce the release",
        )
    )
    retried_when_due()
    return {"completed": completed, "safe": safe, "unsafe": unsafe, "resumed": resumed}


def spend_history(operator) -> None:
    """Two weeks of daily spend for the overview's spend module: two models
    and two submitters, one day with turns of a model that has no price."""
    today = database_now().astimezone(UTC).date()
    for days_ago in range(12):
        for submitter, model, usual_turns in ((operator.pk, "gpt-4o", 6), (0, "gpt-4o-mini", 20)):
            turns = usual_turns + days_ago % 5
            DailySpend.objects.create(
                day=today - timedelta(days=days_ago),
                submitter=submitter,
                provider="openai",
                model=model,
                turns=turns,
                input_tokens=turns * 900,
                output_tokens=turns * 150,
                cost=Decimal("0.0042") * turns * (1 + days_ago % 3),
            )
    DailySpend.objects.create(
        day=today - timedelta(days=2),
        submitter=operator.pk,
        provider="openai",
        model="local-llama",
        turns=4,
        input_tokens=5000,
        output_tokens=800,
        unpriced_turns=4,
    )


def test_an_operator_filters_requeues_is_refused_and_reconciles(
    live_server, operator, runs_to_operate_on, orm_beside_the_browser, screenshots
):
    # Playwright's sync API keeps an event loop in this thread; the ORM calls
    # below happen between its calls, never inside them.
    safe, unsafe = runs_to_operate_on["safe"], runs_to_operate_on["unsafe"]
    base = live_server.url
    # Before the browser opens: an ORM call inside its block gets a connection
    # of its own (Playwright's greenlet) that outlives the test and keeps the
    # teardown from dropping the test database.
    spend_history(operator)
    # The manual's screenshots at issue #30's laptop size.
    with admin_page(base, "olivia", viewport=(1366, 900)) as page:
        page.goto(f"{base}/admin/runs/agentrun/")
        page.click("#changelist-filter >> text=failed")
        expect(page).to_have_url(f"{base}/admin/runs/agentrun/?status__exact=failed")
        expect(page.locator("#result_list tbody tr")).to_have_count(2)
        page.screenshot(path=screenshots / "runs-list.png")

        page.click(f"#result_list a[href*='{unsafe.pk}/change/']")  # its id's head
        expect(page.locator("#requeue-verdict")).to_contain_text("reconcile it first")
        expect(page.locator("#requeue-button")).to_have_count(0)
        page.screenshot(path=screenshots / "run-detail-write-in-doubt.png", full_page=True)

        page.goto(f"{base}/admin/runs/agentrun/{safe.pk}/change/")
        expect(page.locator("#requeue-verdict")).to_contain_text("resumes after step")
        page.screenshot(path=screenshots / "run-detail.png", full_page=True)
        page.fill("#requeue-verdict input[name=note]", "auth token rotated")
        page.click("#requeue-button")
        # An auth failure comes again unless fixed: asked first, with why.
        expect(page.locator("#lasting-failure-warning")).to_be_visible()
        expect(page.locator("input[name=note]")).to_have_value("auth token rotated")
        page.click("#confirm-button")
        # The scripted provider refuses the key again: the message says so,
        # linking the dead letter the run opened.
        expect(page.locator(".messagelist")).to_contain_text(
            re.compile(r"Requeued at .* Since then it failed again at its model call \(auth\)")
        )
        expect(page.locator(".messagelist a.opened-dead-letter")).to_have_count(1)
        expect(page.locator("#since-action")).to_contain_text("Since your requeue at")

        page.goto(f"{base}/admin/runs/agentrun/{runs_to_operate_on['resumed'].pk}/change/")
        expect(page.locator("#attempts")).to_contain_text("resumed after step 3")
        page.screenshot(path=screenshots / "run-detail-resumed.png", full_page=True)

        # Rerun from its first turn (G20): the verdict first, the notification
        # recorded after that turn refusing it until someone allowed confirms.
        page.locator("#steps a.rerun-link").first.click()
        expect(page.locator("#rerun-verdict")).to_contain_text("(past_write)")
        expect(page.locator("#writes-after")).to_contain_text("send_notification")
        expect(page.locator(".field-confirm_past_write")).to_contain_text(
            "Confirming needs the permission runs.rerun_past_write"
        )
        assert_shown(page, "#writes-after", "#id_input", "#rerun-button")
        assert_table_fits(page, "#writes-after")
        page.screenshot(path=screenshots / "rerun-from.png", full_page=True)

        page.goto(f"{base}/admin/runs/agentrun/write-audits/")
        row = page.locator(f"#audit-{unsafe.pk}")
        expect(row).to_contain_text("send_notification")
        page.screenshot(path=screenshots / "write-audits.png", full_page=True)
        row.locator("input[name=outcome][value=not_applied]").check()
        row.locator("input[name=note]").fill("the pager shows no page at that time")
        row.locator("input[type=submit]").click()
        expect(row).to_contain_text("not_applied")

        page.goto(f"{base}/admin/runs/agentrun/overview/")
        expect(page.locator("#writes-in-doubt")).to_have_text("0")
        expect(page.locator("#spend-chart .bar")).to_have_count(14)
        expect(page.locator("#spend-chart .mark")).to_have_count(1)
        expect(page.locator("#spend-by-model")).to_contain_text("openai/local-llama")
        # Issue #30's laptop screen: the chart must fit 1366 px as it stands.
        chart = page.locator("#spend-chart").bounding_box()
        assert chart["width"] > 500 and chart["x"] + chart["width"] <= 1366, chart
        page.screenshot(path=screenshots / "overview.png", full_page=True)

    assert AgentRun.objects.get(pk=safe.pk).steps.filter(kind="operator").count() == 1
    assert AgentRun.objects.get(pk=unsafe.pk).reconciliation.outcome == "not_applied"


def test_an_operator_starts_a_run_from_the_form_at_laptop_width_and_lands_on_its_page(
    live_server, operator, orm_beside_the_browser, screenshots
):
    operator.user_permissions.add(Permission.objects.get(codename="add_agentrun"))
    base = live_server.url
    turns = [{"tool_calls": [{"name": "search_notes", "arguments": {"query": "disk"}}]}]
    turns.append({"content": "No incidents about the disk."})
    with admin_page(base, "olivia", viewport=(1366, 900)) as page:
        page.goto(f"{base}/admin/runs/agentrun/")
        page.click("#start-run")
        # Nothing that matters is off a laptop's screen, or cut.
        for selector in ("#id_prompt", "#id_tools", "#id_provider", "#id_turns"):
            box = page.locator(selector).bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= 1366, (selector, box)
        # Aligned (issue #41): every field, and its help, starts at one x.
        fields = ["#id_agent", "#id_prompt", "#id_tools", "#id_provider", "#id_turns"]
        fields += ["#id_require_approval", "#id_max_cost", "#id_prompt_helptext"]
        lefts = {selector: page.locator(selector).bounding_box()["x"] for selector in fields}
        assert max(lefts.values()) - min(lefts.values()) < 2, lefts
        expect(page.locator("#turns-example")).to_contain_text('"tool_calls"')
        tool = page.locator("#id_tools label", has_text="search_notes")
        expect(tool).to_contain_text("read_only")
        page.fill("#id_prompt", "Summarise the incidents about the disk")
        page.check("input[name=tools][value=search_notes]")
        page.select_option("#id_provider", "scripted")
        page.fill("#id_turns", json.dumps(turns))
        page.fill("#id_max_cost", "two")
        page.click("#start-run-form input[type=submit]")
        # Refused beside the field it names, its value in JSON.
        error = page.locator(".field-max_cost .errorlist")
        expect(error).to_contain_text('max_cost: "two" is not an amount')
        field, said = page.locator("#id_max_cost").bounding_box(), error.bounding_box()
        assert said["x"] >= field["x"] + field["width"] and said["y"] < field["y"] + 10, said
        assert said["x"] + said["width"] <= 1366, said
        page.screenshot(path=screenshots / "start-run.png", full_page=True)
        page.fill("#id_max_cost", "")
        page.click("#start-run-form input[type=submit]")
        expect(page).to_have_url(re.compile(r"/admin/runs/agentrun/[0-9a-f-]{36}/change/$"))
        expect(page.locator(".messagelist")).to_contain_text("Run started")
        # Run again: the form, filled in with this run's request.
        page.click("#run-again")
        expect(page.locator("#id_prompt")).to_have_value("Summarise the incidents about the disk")
        expect(page.locator("input[name=tools][value=search_notes]")).to_be_checked()
        assert json.loads(page.input_value("#id_turns")) == turns
        # Rerun from its answer with another input (G20): nothing written
        # after that turn, so no confirmation; the new run links back.
        page.go_back()
        page.locator("#steps a.rerun-link").last.click()
        expect(page.locator("#writes-after")).to_contain_text("none")
        page.fill("#id_input", "Summarise the incidents about the disk, briefly")
        page.click("#rerun-button")
        expect(page.locator("#rerun-of")).to_contain_text("from step")
    started = AgentRun.objects.get(rerun_of=None)
    assert (started.submitted_by, started.submitted_via) == (operator, "console")
    rerun = AgentRun.objects.get(rerun_of=started.pk)
    assert (rerun.status, rerun.prompt) == (
        "completed",
        "Summarise the incidents about the disk, briefly",
    )


def test_screenshots_of_the_main_pages_are_in_the_docs():
    names = {path.name for path in DOCS_SCREENSHOTS.glob("*.png")}
    assert {
        "runs-list.png",
        "run-detail.png",
        "run-detail-resumed.png",
        "write-audits.png",
        "overview.png",
        "rerun-from.png",
    } <= names
