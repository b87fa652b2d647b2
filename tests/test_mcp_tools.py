"""Tools from MCP servers, in-process, against the real tracker server
(``tests.mcp_servers.tracker``) over stdio and streamable HTTP: a run reads
through one MCP tool and writes through another, each step recorded with
the effect its toolset declares (G1); the call carries its idempotency key
to the server; a server's hints never change what the runtime does."""

import pytest

from runs.models import AgentRun
from runs.runtime import enqueue
from runs.vocabulary import RunStatus, StepKind
from tests.drifting_model import request_for
from tests.helpers import fresh

pytestmark = pytest.mark.django_db(transaction=True)

SEARCH = {"name": "{server}__search_issues", "arguments": {"query": "login (take {take})"}}
CREATE = {"name": "{server}__create_issue", "arguments": {"title": "login broken (take {take})"}}


def plan_for(server: str, *turns) -> list[dict]:
    def named(call):
        return {**call, "name": call["name"].format(server=server)}

    return [
        {"calls": [named(call) for call in turn]} if isinstance(turn, list) else turn
        for turn in turns
    ]


@pytest.fixture(params=["stdio", "http"])
def server(request):
    """The tracker over each transport: its fixture and its tools' prefix."""
    if request.param == "stdio":
        return request.getfixturevalue("tracker"), "tracker"
    return request.getfixturevalue("http_tracker"), "webtracker"


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_a_run_reads_and_writes_through_mcp_tools_with_their_declared_effects(model, server):
    tracker, prefix = server
    plan = plan_for(prefix, [SEARCH], [CREATE], {"answer": "filed (take {take})"})
    tools = [f"{prefix}__search_issues", f"{prefix}__create_issue"]
    agent_run = fresh(
        enqueue(request_for("scripted" if model is None else "drifting", plan, tools))
    )

    assert agent_run.status == RunStatus.COMPLETED, agent_run.error
    steps = list(agent_run.steps.filter(kind=StepKind.TOOL).order_by("sequence"))
    assert [(step.tool_name, step.effect) for step in steps] == [
        (f"{prefix}__search_issues", "read_only"),
        (f"{prefix}__create_issue", "non_idempotent_write"),
    ]
    assert "issue about login" in str(steps[0].result)
    (created,) = tracker.calls("create_issue")
    assert created["idempotency_key"] == steps[1].idempotency_key
    assert created["arguments"] == steps[1].arguments
    assert AgentRun.objects.count() == 1
