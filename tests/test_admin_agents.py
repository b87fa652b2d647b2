"""G18 in the console: an operator defines an agent and changes it in the
admin (each change a new version and a log entry, refused with the API's
words when bad), every version reads as it was saved, and the start form
starts a run of an agent by name."""

import pytest
from django.contrib.admin.models import LogEntry

from agents.models import Agent, AgentVersion
from runs.models import AgentRun
from runs.vocabulary import RunStatus

pytestmark = pytest.mark.django_db

SCRIPTED = '{"kind": "scripted", "turns": [{"content": "noted"}]}'


def form(**changes) -> dict:
    data = {
        "name": "notes",
        "description": "reads notes",
        "instructions": "Answer from the notes only.",
        "provider": SCRIPTED,
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
    from django.contrib.auth.models import Permission

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
