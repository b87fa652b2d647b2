"""G20: what a rerun is asked with. With the run's own agent version —
left out, or named, as the console's form names it — the original's
request whole, the limits and webhook it was started with included; with
another version, that version's definition, refused when it no longer
offers a tool the replayed turns called. One function decides for the
console and the API (``agents.starting.rerun_request``)."""

import pytest

from agents.versions import save_agent
from runs.models import AgentRun
from tests.drifting_model import FAKE_USAGE, MODELS, SEARCH, request_for, scripted_request
from tests.helpers import free_port
from tests.test_rerun import PLAN, TOOLS, ended, turns_of, url

pytestmark = pytest.mark.django_db(transaction=True)

#: A read, then the answer.
READ_PLAN = [{"calls": [SEARCH]}, {"answer": "found (take {take})"}]
RUNS = "/admin/runs/agentrun/"


def test_a_rerun_with_another_agent_version_is_refused_when_it_drops_a_replayed_tool(api, operator):
    definition = {**scripted_request("", PLAN, TOOLS), "instructions": "be brief"}
    del definition["prompt"]
    save_agent("notifier", definition, user=operator, create=True)
    save_agent(
        "notifier",
        {**definition, "tools": ["send_notification"]},
        user=operator,
        create=False,
        based_on=1,
    )
    started = api.post(
        "/api/runs/", {"agent": "notifier", "version": 1, "input": "ship it"}, format="json"
    )
    assert started.status_code == 201, started.content
    original = AgentRun.objects.get(pk=started.json()["id"])
    _, notify_turn, answer_turn = turns_of(original)

    answer = api.post(url(original, notify_turn), {"version": 2}, format="json")
    assert (answer.status_code, answer.json()["code"]) == (409, "tool_not_offered")
    assert "search_notes" in answer.json()["detail"]
    too_long = {"version": 2, "input": "x" * 100_001}
    answer = api.post(url(original, notify_turn), too_long, format="json")
    assert (answer.status_code, list(answer.json()["errors"])) == (400, ["input"])
    # The version the run started from still reruns, and the new run records it.
    answer = api.post(url(original, answer_turn), {}, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["agent"]["version"] == 1


@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_rerun_with_the_runs_own_version_keeps_the_request_it_was_started_with(
    model, api, operator, operator_client, settings
):
    """An API rerun naming the run's own agent version expanded the version
    anew and dropped what the start gave: its 5,000 tokens became the
    deployment's 100,000 and its webhook was gone (#47). The run's own
    version keeps the original's request, through the API as in the
    console (one function decides for both); another version is that
    version's definition, as a start giving only the input gets it."""
    settings.NRLLM_RUN_MAX_TOTAL_TOKENS = 100_000
    # Nobody listens there: each webhook's first try fails, recorded.
    settings.NRLLM_HTTP_ALLOWED_HOSTS = [f"127.0.0.1:{free_port()}"]
    hook = f"http://{settings.NRLLM_HTTP_ALLOWED_HOSTS[0]}/hooks/runs"
    definition = request_for(model, READ_PLAN, ["search_notes"], scripted_usage=FAKE_USAGE)
    prompt = definition.pop("prompt")
    definition["provider"] = {**definition["provider"], "max_tokens": 64}
    save_agent("reader", definition, user=operator, create=True)
    save_agent(
        "reader",
        {**definition, "max_total_tokens": 50_000, "require_approval": ["search_notes"]},
        user=operator,
        create=False,
        based_on=1,
    )
    start = {"agent": "reader", "version": 1, "input": prompt, "webhook": hook}
    started = api.post(
        "/api/runs/", {**start, "max_total_tokens": 5_000, "max_iterations": 4}, format="json"
    )
    assert started.status_code == 201, started.content
    original = ended(started.json()["id"])
    assert (original.request["max_total_tokens"], original.request["webhook"]) == (5_000, hook)
    _, answer_turn = turns_of(original)

    def made(answer) -> AgentRun:
        assert answer.status_code in (201, 302), answer.content
        new_run = AgentRun.objects.filter(rerun_of=original.pk).order_by("-created_at").first()
        assert new_run.agent_version.number == 1
        return ended(new_run.pk)

    # The API, naming the run's own version; with another input too.
    again = made(api.post(url(original, answer_turn), {"version": 1}, format="json"))
    assert again.request == original.request
    other_input = f"Again. {prompt}"
    answer = api.post(
        url(original, answer_turn), {"version": 1, "input": other_input}, format="json"
    )
    assert made(answer).request == {**original.request, "prompt": other_input}
    # The console's form, its own version and input prefilled: the same.
    form = {"input": prompt, "version": "1", "note": "again"}
    page = operator_client.post(f"{RUNS}{original.pk}/rerun-from/{answer_turn}/", form)
    assert made(page).request == original.request
    # Another version: its definition, none of what the start gave.
    answer = api.post(url(original, answer_turn), {"version": 2}, format="json")
    assert answer.status_code == 201, answer.content
    other = AgentRun.objects.get(pk=answer.json()["id"])
    assert (other.request["max_total_tokens"], other.request["require_approval"]) == (
        50_000,
        ["search_notes"],
    )
    assert "webhook" not in other.request and other.agent_version.number == 2
