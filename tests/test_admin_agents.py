"""G18 in the console: an operator defines an agent and changes it in the
admin (each change a new version and a log entry, refused with the API's
words when bad, beside the field), its provider asked for as fields, every
version reads as it was saved, and the start form starts a run of an agent
by name, from the agent's page too."""

import json
import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission

from agents.models import Agent, AgentVersion
from console.start_run import TURNS_EXAMPLE
from runs.models import AgentRun
from runs.models.vocabulary import RunStatus

pytestmark = pytest.mark.django_db

TURNS = '[{"content": "noted"}]'


def form(**changes) -> dict:
    data = {
        "name": "notes",
        "description": "reads notes",
        "instructions": "Answer from the notes only.",
        "provider": "scripted",
        "model": "",
        "temperature": "",
        "max_tokens": "",
        "turns": TURNS,
        "provider_options": "",
        "tools": ["read_note"],
        "max_iterations": "",
        "max_total_tokens": "",
        "max_cost": "",
        "webhook": "",
    }
    return {**data, **changes}


def test_an_operator_defines_and_changes_an_agent_each_change_a_version(operator_client):
    added = operator_client.post("/admin/agents/agent/add/", form())
    assert added.status_code == 302, added.context["adminform"].form.errors
    agent = Agent.objects.get(name="notes")
    assert (agent.latest.number, agent.latest.tools) == (1, ["read_note"])

    page = operator_client.get(f"/admin/agents/agent/{agent.pk}/change/")
    assert page.context["adminform"].form.initial["instructions"] == "Answer from the notes only."
    changed = operator_client.post(
        f"/admin/agents/agent/{agent.pk}/change/", form(instructions="Cite the note.")
    )
    assert changed.status_code == 302
    agent.refresh_from_db()
    assert agent.latest.number == 2
    assert AgentVersion.objects.get(agent=agent, number=1).instructions == (
        "Answer from the notes only."
    )
    assert [entry.change_message for entry in LogEntry.objects.order_by("pk")] == [
        "created notes: version 1",
        "changed notes: version 2",
    ]

    # Refused with the API's words, beside the field; nothing stored.
    refused = operator_client.post(
        f"/admin/agents/agent/{agent.pk}/change/", form(tools=["read_note"], max_total_tokens="-3")
    )
    assert refused.status_code == 200
    errors = refused.context["adminform"].form.errors
    assert list(errors) == ["max_total_tokens"], errors
    assert AgentVersion.objects.filter(agent=agent).count() == 2

    # A version's page is read-only and shows the definition as saved.
    version = operator_client.get(f"/admin/agents/agentversion/{agent.latest.pk}/change/")
    assert b"Cite the note." in version.content
    assert b'name="_save"' not in version.content
    assert operator_client.post(f"/admin/agents/agent/{agent.pk}/delete/").status_code == 403


def test_a_viewer_reads_agents_but_cannot_change_them(operator_client, viewer_client):
    operator_client.post("/admin/agents/agent/add/", form())
    agent = Agent.objects.get()
    assert viewer_client.get(f"/admin/agents/agent/{agent.pk}/change/").status_code == 200
    viewer_client.post(f"/admin/agents/agent/{agent.pk}/change/", form(instructions="x"))
    assert Agent.objects.get().latest.number == 1
    assert viewer_client.get("/admin/agents/agent/add/").status_code == 403


def test_the_start_form_starts_a_run_of_an_agent_by_name(operator, operator_client):
    operator.user_permissions.add(Permission.objects.get(codename="add_agentrun"))
    operator_client.post("/admin/agents/agent/add/", form())
    started = operator_client.post(
        "/admin/runs/agentrun/start/",
        {"agent": "notes", "prompt": "What changed?", "provider": "scripted", "turns": ""},
    )
    assert started.status_code == 302
    run = AgentRun.objects.get()
    # Queued: this test's transaction never commits, so no job is dispatched.
    assert (run.status, run.prompt) == (RunStatus.QUEUED, "What changed?")
    assert run.agent_version.number == 1
    assert run.request["instructions"] == "Answer from the notes only."
    page = operator_client.get(f"/admin/runs/agentrun/{run.pk}/change/")
    assert b"notes v1" in page.content


def test_a_form_opened_before_another_change_is_refused_not_saved_over_it(operator_client):
    """Two operators open the agent's page at version 1; the first saves
    version 2. The second's save, made on version 1, would undo that
    change: it is refused, saying so, and stores nothing until reloaded."""
    operator_client.post("/admin/agents/agent/add/", form())
    agent = Agent.objects.get()
    url = f"/admin/agents/agent/{agent.pk}/change/"
    shown = operator_client.get(url).context["adminform"].form.initial["based_on"]
    assert shown == 1
    first = operator_client.post(url, form(instructions="Cite the note.", based_on=shown))
    assert first.status_code == 302

    second = operator_client.post(url, form(tools=[], based_on=shown))

    assert second.status_code == 200
    (problem,) = second.context["adminform"].form.non_field_errors()
    assert "changed since this page showed version 1" in problem, problem
    assert "latest is version 2" in problem
    assert [v.instructions for v in AgentVersion.objects.order_by("number")] == [
        "Answer from the notes only.",
        "Cite the note.",
    ]
    reloaded = operator_client.get(url).context["adminform"].form.initial
    again = operator_client.post(
        url, form(instructions=reloaded["instructions"], tools=[], based_on=reloaded["based_on"])
    )
    assert again.status_code == 302
    latest = Agent.objects.get().latest
    assert (latest.number, latest.instructions, latest.tools) == (3, "Cite the note.", [])


def test_the_provider_is_asked_for_as_fields_and_a_version_holds_its_options(
    operator_client, settings
):
    """The add page asks for the provider's kind among the registered ones
    and its options as fields, a scripted agent's turns prefilled with a
    valid example, never JSON prefilled null; saved, a version's provider
    is those options, and a page saved unchanged makes no new version."""
    page = operator_client.get("/admin/agents/agent/add/")
    shown = page.context["adminform"].form
    assert [kind for kind, _ in shown.fields["provider"].choices] == ["openai", "scripted"]
    assert dict(shown.fields["provider"].choices)["openai"] == "openai (not configured here)"
    assert shown.initial["provider"] == "scripted"
    assert json.loads(shown.initial["turns"]) == json.loads(TURNS_EXAMPLE)
    assert "null" not in page.content.decode()
    assert 'class="turns-example"' in page.content.decode()  # the example, under the field

    # The defaults as shown make a valid agent: the example's turns.
    added = operator_client.post("/admin/agents/agent/add/", form(turns=shown.initial["turns"]))
    assert added.status_code == 302, added.context["adminform"].form.errors
    agent = Agent.objects.get()
    assert agent.latest.provider == {"kind": "scripted", "turns": json.loads(TURNS_EXAMPLE)}

    settings.NRLLM_OPENAI_BASE_URL = "http://127.0.0.1:9/v1"
    settings.NRLLM_OPENAI_API_KEY = "sk-test-not-a-real-key"
    url = f"/admin/agents/agent/{agent.pk}/change/"
    openai = form(
        provider="openai", model="gpt-4.1-mini", temperature="0.2", max_tokens="800", turns=""
    )
    assert operator_client.post(url, openai).status_code == 302
    agent.refresh_from_db()
    assert (agent.latest.number, agent.latest.provider) == (
        2,
        {"kind": "openai", "model": "gpt-4.1-mini", "temperature": 0.2, "max_tokens": 800},
    )

    # The page shows the version's options in their fields; saved as shown
    # (a description changed), the definition is the same: no version.
    initial = operator_client.get(url).context["adminform"].form.initial
    assert {name: initial[name] for name in ("provider", "model", "temperature", "max_tokens")} == {
        "provider": "openai",
        "model": "gpt-4.1-mini",
        "temperature": "0.2",
        "max_tokens": "800",
    }
    as_shown = {name: initial.get(name, "") for name in form()} | {"description": "reads notes!"}
    assert operator_client.post(url, as_shown).status_code == 302
    agent.refresh_from_db()
    assert (agent.latest.number, agent.description) == (2, "reads notes!")


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"turns": "[{"}, "turns", "not JSON"),
        ({"turns": "[]"}, "turns", "provider/turns: [] should be non-empty"),
        ({"turns": '[{"bogus": 1}]'}, "turns", "provider/turns/0: "),
        ({"turns": ""}, "turns", 'provider: "turns" is a required property'),
        ({"max_tokens": "0"}, "max_tokens", "provider/max_tokens: 0 is less than the minimum"),
        ({"max_tokens": "many"}, "max_tokens", "Enter a whole number"),
        ({"temperature": "warm"}, "temperature", "'warm' is not a number"),
        ({"temperature": "nan"}, "temperature", "'nan' is not a number"),
        ({"model": "gpt-4.1-mini"}, "model", "model: the scripted provider takes none"),
        ({"provider": "nope"}, "provider", "Select a valid choice"),
        (
            {"provider": "openai", "model": "m", "turns": ""},
            "provider",
            "provider 'openai' is not configured: set NRLLM_OPENAI_API_KEY",
        ),
        ({"provider_options": "[1]"}, "provider_options", "a JSON object"),
        ({"provider_options": "{"}, "provider_options", "not JSON"),
        (
            {"provider_options": '{"turns": []}'},
            "provider_options",
            "'turns' is set by the turns field",
        ),
        ({"provider_options": '{"top_p": 1}'}, "provider_options", '("top_p" was unexpected)'),
    ],
)
def test_a_bad_provider_field_is_refused_by_name_and_stores_nothing(
    operator_client, fields, field, words
):
    operator_client.post("/admin/agents/agent/add/", form())
    agent = Agent.objects.get()
    url = f"/admin/agents/agent/{agent.pk}/change/"

    refused = operator_client.post(url, form(instructions="Changed.", **fields))

    assert refused.status_code == 200
    errors = refused.context["adminform"].form.errors
    assert list(errors) == [field], errors
    assert words in errors[field][0], errors
    assert AgentVersion.objects.filter(agent=agent).count() == 1


def test_an_openai_agent_without_a_model_or_over_the_temperature_is_refused_by_field(
    operator_client, settings
):
    settings.NRLLM_OPENAI_BASE_URL = "http://127.0.0.1:9/v1"
    settings.NRLLM_OPENAI_API_KEY = "sk-test-not-a-real-key"
    for fields, field, words in [
        ({}, "model", 'provider: "model" is a required property'),
        ({"model": "m", "temperature": "3"}, "temperature", "3 is greater than the maximum of 2"),
        ({"model": "m", "turns": "[]"}, "turns", "turns: the openai provider takes none"),
    ]:
        refused = operator_client.post(
            "/admin/agents/agent/add/", form(provider="openai", **{"turns": "", **fields})
        )
        assert refused.status_code == 200
        errors = refused.context["adminform"].form.errors
        assert list(errors) == [field] and words in errors[field][0], (fields, errors)
    assert not Agent.objects.exists()


def test_an_agents_page_starts_a_run_of_it_for_whoever_may_start_runs(
    operator, operator_client, viewer_client
):
    operator_client.post("/admin/agents/agent/add/", form())
    agent = Agent.objects.get()
    url = f"/admin/agents/agent/{agent.pk}/change/"
    start_runs = Permission.objects.get(codename="add_agentrun")
    operator.user_permissions.remove(start_runs)
    assert "start-run-of-agent" not in operator_client.get(url).content.decode()
    operator.user_permissions.add(start_runs)

    page = operator_client.get(url).content.decode()

    link = re.search(r'<a href="([^"]+)" class="addlink" id="start-run-of-agent">', page)
    assert link and link.group(1) == "/admin/runs/agentrun/start/?agent=notes", page
    start = operator_client.get(link.group(1))
    assert start.context["form"]["agent"].value() == "notes"
    assert '<option value="notes" selected>' in start.content.decode()
    assert "start-run-of-agent" not in viewer_client.get(url).content.decode()
