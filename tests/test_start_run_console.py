"""Starting a run from the console (#30): the same request and checks as
``POST /api/runs/``, the operator as its submitter, nothing stored when it
is refused. The browser's view of it is in test_browser.py."""

import json
import re

import pytest
from django.contrib.auth.models import Permission

from agents.models import Agent, AgentVersion
from console.start_run import initial_from
from runs.models import AgentRun
from runs.models.vocabulary import SubmittedVia
from spend.models import SubmitterBudget

pytestmark = pytest.mark.django_db

START = "/admin/runs/agentrun/start/"
TURNS = json.dumps(
    [{"tool_calls": [{"name": "search_notes", "arguments": {"query": "x"}}]}, {"content": "done"}]
)


def a_form(**fields) -> dict:
    return {
        "prompt": "Summarise the incidents",
        "provider": "scripted",
        "turns": TURNS,
        "tools": ["search_notes"],
        **fields,
    }


@pytest.mark.usefixtures("approvals")
def test_an_operator_starts_a_run_from_the_console_and_bad_input_stores_nothing(
    operator, operator_client
):
    start_runs = Permission.objects.get(codename="add_agentrun")
    operator.user_permissions.remove(start_runs)
    assert operator_client.get(START).status_code == 403
    assert "start-run" not in operator_client.get("/admin/runs/agentrun/").content.decode()
    operator.user_permissions.add(start_runs)

    page = operator_client.get(START).content.decode()
    assert 'id="start-run-form"' in page
    # Each tool with its effect, and whether its calls wait for approval.
    assert "send_notification — non_idempotent_write, waits for approval" in page
    assert "search_notes — read_only<" in page
    assert 'id="start-run"' in operator_client.get("/admin/runs/agentrun/").content.decode()

    SubmitterBudget.objects.create(user=operator, period="day", max_tokens=0)
    for fields, named in [
        ({"prompt": ""}, "This field is required"),
        ({"turns": "[{"}, "not JSON"),
        ({"turns": "[" * 100_000 + "]" * 100_000}, "nested too deeply"),
        ({"max_iterations": "100000"}, "max_iterations: 100000 is above the limit"),
        ({"max_cost": "two"}, "max_cost: &quot;two&quot; is not an amount"),
        ({"tools": ["no_such_tool"]}, "Select a valid choice"),
        ({"provider": "openai"}, "Select a valid choice"),  # not configured here
        ({}, "budget"),  # the operator's budget of 0 tokens: spent
    ]:
        response = operator_client.post(START, a_form(**fields))
        assert response.status_code == 200, (fields, response.status_code)
        assert named in response.content.decode(), fields
    assert AgentRun.objects.count() == 0

    SubmitterBudget.objects.filter(user=operator).delete()
    response = operator_client.post(START, a_form(max_total_tokens="5000"))
    started = AgentRun.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/admin/runs/agentrun/{started.pk}/change/"
    assert (started.submitted_by, started.submitted_via) == (operator, SubmittedVia.CONSOLE)
    assert started.request["tools"] == ["search_notes"]
    assert started.request["max_total_tokens"] == 5000
    assert started.request["provider"]["turns"] == json.loads(TURNS)


def test_a_body_nested_past_what_json_can_read_is_a_400_naming_it(api):
    """``json.loads`` raises RecursionError, not ValueError, past Python's
    recursion limit: DRF let it through as a 500."""
    response = api.generic(
        "POST", "/api/runs/", "[" * 100_000 + "]" * 100_000, content_type="application/json"
    )
    assert response.status_code == 400
    assert "nested too deeply" in response.json()["detail"]
    assert AgentRun.objects.count() == 0


def test_a_user_who_may_start_runs_but_not_view_them_is_told_the_run_id():
    from tests.conftest import _client_for, _user

    starter = _client_for(_user("sam", staff=True, permissions=["runs.add_agentrun"]))
    response = starter.post(START, a_form(), follow=True)
    started = AgentRun.objects.get()
    assert response.redirect_chain == [(START, 302)]
    assert f"Run {started.pk} started: it is queued." in response.content.decode()


@pytest.mark.usefixtures("approvals")
def test_a_refusal_is_beside_its_field_in_json_and_a_run_is_run_again_from_its_page(
    operator, operator_client
):
    operator.user_permissions.add(Permission.objects.get(codename="add_agentrun"))

    def row_of(page: str, field: str) -> str:
        return re.search(rf'<div class="form-row field-{field}[ "].*?</fieldset>', page, re.S)[0]

    # Beside the field the refusal names (after its input), values in JSON.
    for fields, field, said in [
        ({"max_cost": "two"}, "max_cost", "max_cost: &quot;two&quot; is not an amount"),
        ({"turns": '[{"bogus": 1}]'}, "turns", "provider/turns/0: {&quot;bogus&quot;: 1}"),
    ]:
        page = operator_client.post(START, a_form(**fields)).content.decode()
        assert f'class="form-row field-{field} errors"' in page, fields
        row = row_of(page, field)
        assert row.index(f'id="id_{field}"') < row.index(said), fields
        assert 'id="start-run-errors"' not in page, re.findall(
            r"start-run-errors.*?</ul>", page, re.S
        )
        assert not re.search(r"[{(:\[] ?&#x27;", page), fields  # no Python repr
    # The form offers what a request may ask: an example of scripted turns,
    # require_approval.
    page = operator_client.get(START).content.decode()
    assert 'id="turns-example"' in page and "&quot;tool_calls&quot;" in page
    response = operator_client.post(START, a_form(require_approval=["search_notes"]))
    first = AgentRun.objects.get()
    assert first.request["require_approval"] == ["search_notes"]

    # "Run again" opens the form filled in with the run's request...
    run_page = operator_client.get(response["Location"]).content.decode()
    assert f'href="{START}?from={first.pk}" id="run-again"' in run_page
    page = operator_client.get(START, {"from": first.pk}).content.decode()
    assert "Summarise the incidents</textarea>" in page
    assert re.search(r'name="require_approval" value="search_notes"[^>]*checked', page)
    # ...and what it holds starts the same request again.
    operator_client.post(START, {**initial_from(first), "tools": first.request["tools"]})
    second = AgentRun.objects.exclude(pk=first.pk).get()
    assert second.request == first.request

    # A run started from an agent: its agent and input.
    agent = Agent.objects.create(name="summariser")
    version = AgentVersion.objects.create(
        agent=agent,
        number=1,
        provider={"kind": "scripted", "turns": [{"content": "done"}]},
        max_iterations=3,
    )
    Agent.objects.filter(pk=agent.pk).update(latest=version)
    operator_client.post(START, a_form(agent="summariser", prompt="What broke?"))
    from_agent = AgentRun.objects.get(agent_version=version)
    page = operator_client.get(START, {"from": from_agent.pk}).content.decode()
    assert '<option value="summariser" selected>' in page
    assert "What broke?</textarea>" in page and "started from agent summariser version 1" in page
    assert "There is no run" in operator_client.get(START, {"from": "nope"}).content.decode()
