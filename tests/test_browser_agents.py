"""Agents in a real browser at 1366×900 (G18): an operator defines one on
the admin's add page, changes its instructions (version 2), reads both
versions, and starts a run of it from the start form; the run's page names
the version. Saves the manual's screenshot of the agent's page
(docs/agents.md; `make screenshots`)."""

import pytest
from django.contrib.auth.models import Permission
from playwright.sync_api import expect

from agents.models import Agent
from runs.models import AgentRun
from tests.browser import DOCS_SCREENSHOTS, admin_page

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROVIDER = '{"kind": "scripted", "turns": [{"content": "The notes say v2 shipped."}]}'


def no_sideways_scroll(page) -> None:
    widths = page.evaluate(
        "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert widths[0] <= widths[1], widths


def test_an_operator_defines_an_agent_changes_it_and_starts_a_run_of_it(
    live_server, operator, monkeypatch, screenshots
):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    operator.user_permissions.add(Permission.objects.get(codename="add_agentrun"))
    base = live_server.url
    with admin_page(base, "olivia", viewport=(1366, 900)) as page:
        page.goto(f"{base}/admin/agents/agent/add/")
        page.fill("#id_name", "notes")
        page.fill("#id_description", "Answers from the team's notes.")
        page.fill("#id_instructions", "Answer from the notes only; say which note.")
        page.fill("#id_provider", PROVIDER)
        page.check("input[name=tools][value=read_note]")
        page.fill("#id_max_total_tokens", "-1")
        page.click("input[name=_continue]")
        # Refused beside the field, in the run request's words.
        expect(page.locator(".field-max_total_tokens .errorlist")).to_contain_text(
            "max_total_tokens: -1 is less than the minimum of 1"
        )
        page.fill("#id_max_total_tokens", "20000")
        page.click("input[name=_continue]")
        expect(page.locator(".messagelist")).to_contain_text("was added successfully")
        page.fill("#id_instructions", "Answer from the notes only; quote the note.")
        page.click("input[name=_continue]")
        expect(page.locator(".agent-versions li")).to_have_count(2)
        no_sideways_scroll(page)
        page.screenshot(path=screenshots / "agent.png", full_page=True)

        page.goto(f"{base}/admin/runs/agentrun/start/")
        page.select_option("#id_agent", "notes")
        page.fill("#id_prompt", "What shipped?")
        page.click("input[type=submit]")
        expect(page.locator(".field-agent_shown")).to_contain_text("notes v2")
        no_sideways_scroll(page)

    agent = Agent.objects.get(name="notes")
    assert agent.latest.number == 2
    (run,) = AgentRun.objects.all()
    assert run.agent_version == agent.latest
    assert run.request["instructions"] == "Answer from the notes only; quote the note."


def test_the_screenshot_of_the_agent_page_is_in_the_docs():
    assert (DOCS_SCREENSHOTS / "agent.png").exists()
