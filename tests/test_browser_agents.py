"""Agents in a real browser at 1366×900 (G18): an operator defines one on
the admin's add page — its provider as fields, only those its kind takes
shown —, changes its instructions (version 2), reads both versions, and
starts a run of it from the agent's page; the run's page names the
version. An agent the API stored as no field shows it byte for byte,
saved from its page untouched, is kept as it was. Saves the manual's
screenshot of the agent's page (docs/agents.md; `make screenshots`)."""

import json
import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from playwright.sync_api import expect

from agents.models import Agent, AgentVersion
from runs.models import AgentRun
from tests.browser import DOCS_SCREENSHOTS, admin_page
from tests.browser_boxes import assert_shown

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TURNS = '[{"content": "The notes say v2 shipped."}]'


def no_sideways_scroll(page) -> None:
    widths = page.evaluate(
        "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert widths[0] <= widths[1], widths


def test_an_operator_defines_an_agent_changes_it_and_starts_a_run_of_it(
    live_server, operator, orm_beside_the_browser, screenshots
):
    operator.user_permissions.add(Permission.objects.get(codename="add_agentrun"))
    base = live_server.url
    with admin_page(base, "olivia", viewport=(1366, 900)) as page:
        page.goto(f"{base}/admin/agents/agent/add/")
        page.fill("#id_name", "notes")
        page.fill("#id_description", "Answers from the team's notes.")
        page.fill("#id_instructions", "Answer from the notes only; say which note.")
        # The provider as fields: scripted (the only kind configured here)
        # shows its turns, prefilled with an example, and its bound; a real
        # model's fields only once that kind is chosen.
        expect(page.locator("#id_provider")).to_have_value("scripted")
        expect(page.locator("#id_turns")).to_have_value(re.compile(r'^\[\n  \{"tool_calls"'))
        expect(page.locator(".field-model")).to_be_hidden()
        page.select_option("#id_provider", "openai")
        expect(page.locator(".field-turns")).to_be_hidden()
        assert_shown(page, ".field-model input", ".field-temperature input")
        page.select_option("#id_provider", "scripted")
        expect(page.locator(".field-model")).to_be_hidden()
        assert_shown(
            page,
            "#id_provider",
            "#id_turns",
            ".field-turns .turns-example",
            "#id_max_tokens",
            "#id_provider_options",
        )
        no_sideways_scroll(page)
        page.fill("#id_turns", TURNS)
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
        # Shown as the version holds them, a turn a line.
        expect(page.locator("#id_turns")).to_have_value(
            '[\n  {"content": "The notes say v2 shipped."}\n]'
        )
        # "Start a run" beside the page's history, above the fold.
        assert_shown(page, "#start-run-of-agent", above_the_fold=True)
        no_sideways_scroll(page)
        page.screenshot(path=screenshots / "agent.png", full_page=True)

        page.click("#start-run-of-agent")
        expect(page.locator("#id_agent")).to_have_value("notes")
        page.fill("#id_prompt", "What shipped?")
        page.click("input[type=submit]")
        expect(page.locator(".field-agent_shown")).to_contain_text("notes v2")
        no_sideways_scroll(page)

    agent = Agent.objects.get(name="notes")
    assert agent.latest.number == 2
    (run,) = AgentRun.objects.all()
    assert run.agent_version == agent.latest
    assert run.request["instructions"] == "Answer from the notes only; quote the note."
    assert run.request["provider"] == {"kind": "scripted", "turns": json.loads(TURNS)}


#: Definitions the API stores as a form's fields cannot send them back:
#: a whole number written 40.0 (the number field reads "40.0" as 40),
#: instructions on lines ending LF and with a last one (a textarea sends
#: CRLF; a form field strips the ends), a model and a webhook with a space
#: after them (a form field strips it).
STORED_AS_NO_FIELD_SHOWS_THEM = {
    "scripted-notes": {
        "description": "Answers from the notes.\n",
        "instructions": "Answer from the notes only.\n\nSay which note.\n",
        "provider": {"kind": "scripted", "turns": [{"content": "noted"}], "max_tokens": 40.0},
    },
    "openai-notes": {
        "instructions": "  Indented, as pasted.",
        "webhook": "http://hooks.example/notes ",
        "provider": {
            "kind": "openai",
            "model": "gpt-4.1-mini ",
            "temperature": 1.0,
            "max_tokens": 800.0,
        },
    },
}


def test_an_agent_saved_unchanged_keeps_its_version_byte_for_byte(
    live_server, operator, api, settings, orm_beside_the_browser
):
    """Saved from its page in a browser without an edit, an agent's
    definition is kept as the API stored it: no new version, no byte
    changed, no description rewritten, nothing logged. (The form read each
    field back as the browser sent it, so such an agent got a version
    whose provider or instructions differed from the ones the page showed.)"""
    settings.NRLLM_OPENAI_BASE_URL = "http://127.0.0.1:9/v1"
    settings.NRLLM_OPENAI_API_KEY = "sk-test-not-a-real-key"
    settings.NRLLM_HTTP_ALLOWED_HOSTS = ["hooks.example"]
    for name, definition in STORED_AS_NO_FIELD_SHOWS_THEM.items():
        created = api.post("/api/agents/", {"name": name, **definition}, format="json")
        assert created.status_code == 201, created.content
    # Read before the browser opens: an ORM call inside its block gets a
    # connection of its own (Playwright's greenlet) that outlives the test.
    stored = {
        agent.pk: (agent.description, agent.latest.definition()) for agent in Agent.objects.all()
    }
    logged = LogEntry.objects.count()
    base = live_server.url
    with admin_page(base, "olivia", viewport=(1366, 900)) as page:
        for pk in stored:
            page.goto(f"{base}/admin/agents/agent/{pk}/change/")
            page.click("input[name=_continue]")
            expect(page.locator(".messagelist")).to_contain_text("was changed successfully")

    assert AgentVersion.objects.count() == len(STORED_AS_NO_FIELD_SHOWS_THEM)
    for agent in Agent.objects.all():
        description, definition = stored[agent.pk]
        assert (agent.description, agent.latest.definition()) == (description, definition)
        # Equal as Python values is not enough: 40 == 40.0; as JSON they differ.
        assert json.dumps(agent.latest.provider) == json.dumps(definition["provider"])
    assert LogEntry.objects.count() == logged


def test_the_screenshot_of_the_agent_page_is_in_the_docs():
    assert (DOCS_SCREENSHOTS / "agent.png").exists()
