"""Tools from MCP servers, in-process, against the real tracker server
(``tests.mcp_servers.tracker``) over stdio and streamable HTTP: a run reads
through one MCP tool and writes through another, each step recorded with
the effect its toolset declares (G1); the call carries its idempotency key
to the server; the server's hints never change what the runtime does; an
undeclared tool is a non_idempotent_write; outcomes are mapped (an error
the server reports, nothing sent, no answer). With real workers and killed
servers: ``test_mcp_recovery.py``."""

import pytest

from runs.approvals import actions as approval_actions
from runs.models import AgentRun, ApprovalRequest, DeadLetter
from runs.models.vocabulary import ApprovalStatus, RunStatus, StepKind, TerminationReason
from runs.runtime import enqueue
from runs.runtime.journal import read_journal_of
from runs.runtime.run_request import InvalidRunRequest, parse_stored_request
from tests.drifting_model import request_for
from tests.helpers import answer, call, fresh, scripted
from tools.mcp import catalog
from tools.registry import ToolsUnavailable, get_registry, require_available

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


def provider(model) -> str:
    return "scripted" if model is None else "drifting"


def finished(*turns, tools):
    """The scripted run of ``turns`` offered ``tools``, enqueued (executed
    here, as the embedded default does) and read back."""
    return fresh(enqueue(scripted(*turns, tools=tools)))


def tool_steps(agent_run) -> list:
    return list(agent_run.steps.filter(kind=StepKind.TOOL).order_by("sequence"))


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
    agent_run = fresh(enqueue(request_for(provider(model), plan, tools)))

    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    steps = tool_steps(agent_run)
    assert [(step.tool_name, step.effect) for step in steps] == [
        (f"{prefix}__search_issues", "read_only"),
        (f"{prefix}__create_issue", "non_idempotent_write"),
    ]
    assert "issue about login" in str(steps[0].result)
    assert steps[1].error == ""
    # The write reached the server once, with the arguments and the
    # idempotency key its step records.
    (created,) = tracker.calls("create_issue")
    assert created["idempotency_key"] == steps[1].idempotency_key
    assert created["arguments"] == steps[1].arguments


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_an_undeclared_tool_runs_only_as_a_non_idempotent_write_after_approval(
    model, tracker, approvals, operator
):
    close = {"name": "tracker__close_issue", "arguments": {"number": 7}}
    plan = [{"calls": [close]}, {"answer": "closed (take {take})"}]
    agent_run = fresh(enqueue(request_for(provider(model), plan, ["tracker__close_issue"])))

    assert get_registry().effect_for("tracker__close_issue") == "non_idempotent_write"
    assert agent_run.status == RunStatus.WAITING_FOR_APPROVAL
    (request,) = ApprovalRequest.objects.filter(run=agent_run, status=ApprovalStatus.PENDING)
    assert (request.tool_name, request.effect) == ("tracker__close_issue", "non_idempotent_write")
    assert tracker.calls() == []  # nothing reached the server while it waits

    assert approval_actions.approve(request, operator, digest=request.digest).ok

    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    (step,) = tool_steps(agent_run)
    assert step.effect == "non_idempotent_write"
    (closed,) = tracker.calls("close_issue")
    assert closed["idempotency_key"] == request.idempotency_key


def labelled(number: int):
    """A run that labels issue ``number`` through the tool whose hints lie."""
    return finished(
        call("tracker__label_issue", number=number, label="bug"),
        answer(),
        tools=["tracker__label_issue"],
    )


def test_a_hint_that_lies_is_flagged_and_the_declaration_is_what_runs(tracker, settings):
    tool = get_registry().get("tracker__label_issue")
    assert tool.hints == {"readOnlyHint": True}
    assert tool.contradictions == ["the server says readOnlyHint: true; declared idempotent_write"]
    # Every write waits under this policy: readOnlyHint does not let it pass.
    settings.NRLLM_APPROVAL_REQUIRED_FOR = "write"
    agent_run = labelled(3)
    assert agent_run.status == RunStatus.WAITING_FOR_APPROVAL
    (request,) = ApprovalRequest.objects.filter(run=agent_run)
    assert request.effect == "idempotent_write"

    settings.NRLLM_APPROVAL_REQUIRED_FOR = "none"
    agent_run = labelled(4)
    assert agent_run.status == RunStatus.COMPLETED
    (step,) = tool_steps(agent_run)
    # Recorded and fenced as the write it was declared, never as a read.
    assert step.effect == "idempotent_write"
    assert step.idempotency_key
    assert [c["arguments"]["number"] for c in tracker.calls("label_issue")] == [4]


def test_a_toolset_that_hides_undeclared_tools_does_not_offer_them(tracker, settings):
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, "tests.mcp_toolsets.TrackerHidingUndeclared"]
    registry = get_registry()
    assert registry.get("quiettracker__search_issues") is not None
    assert "quiettracker__close_issue" not in registry
    assert "quiettracker__close_issue" not in registry.names()
    with pytest.raises(InvalidRunRequest, match="unknown tool.*quiettracker__close_issue"):
        enqueue(scripted(answer(), tools=["quiettracker__close_issue"]))
    assert AgentRun.objects.count() == 0


def test_an_error_the_server_reports_is_fed_back_to_the_model(tracker, monkeypatch):
    monkeypatch.setenv("TRACKER_FAIL_CREATE", "1")
    agent_run = finished(
        call("tracker__create_issue", title="x"),
        answer(),
        tools=["tracker__create_issue"],
    )
    assert agent_run.status == RunStatus.COMPLETED
    (step,) = tool_steps(agent_run)
    assert "the server reports an error" in step.error
    assert "the tracker is read-only today" in step.error
    assert len(tracker.calls("create_issue")) == 1


def test_arguments_are_checked_against_the_servers_schema_before_a_call(tracker):
    agent_run = finished(
        call("tracker__create_issue", title=5),
        call("tracker__create_issue"),
        answer(),
        tools=["tracker__create_issue"],
    )
    assert agent_run.status == RunStatus.COMPLETED
    errors = [step.error for step in tool_steps(agent_run)]
    assert errors[0].startswith("invalid arguments: title: 5 is not of type 'string'")
    assert "'title' is a required property" in errors[1]
    assert tracker.calls() == []


def test_a_write_that_runs_past_its_time_limit_is_a_write_in_doubt(tracker, settings):
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, "tests.mcp_toolsets.ImpatientTracker"]
    agent_run = finished(
        call("impatient__create_issue", title="hold on"),
        answer(),
        tools=["impatient__create_issue"],
    )
    tracker.release()
    assert (agent_run.status, agent_run.termination_reason) == (
        RunStatus.FAILED,
        TerminationReason.WRITE_INTERRUPTED,
    )
    assert DeadLetter.objects.filter(run=agent_run).exists()
    assert len(tracker.calls("create_issue")) == 1


def test_a_server_that_cannot_be_reached_refuses_the_run_at_enqueue(settings):
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, "tests.mcp_toolsets.MissingTracker"]
    with pytest.raises(InvalidRunRequest) as refused:
        enqueue(scripted(answer(), tools=["missing__create_issue"]))
    assert str(refused.value).startswith(
        "tools: unavailable now: missing__create_issue: MCP server 'missing' cannot be reached: "
    )
    assert AgentRun.objects.count() == 0


def test_a_declared_tool_the_server_does_not_offer_is_registered_but_unavailable(tracker, settings):
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, "tests.mcp_toolsets.OverpromisingTracker"]
    registry = get_registry()
    assert "overpromising__merge_issues" in registry  # declared in code
    assert registry.get("overpromising__merge_issues") is None
    names = ["overpromising__merge_issues", "overpromising__search_issues"]
    assert registry.unavailable(names) == {
        "overpromising__merge_issues": "MCP server 'overpromising' does not offer it"
    }
    with pytest.raises(ToolsUnavailable) as refused:
        require_available(["overpromising__merge_issues", "read_note"], disabled=())
    # The server answers and lacks it: retrying would not help.
    assert refused.value.failure_class == "configuration"
    # Disabled by an operator, it is not offered, so nothing waits for it.
    require_available(["overpromising__merge_issues"], disabled={"overpromising__merge_issues"})


def test_readyz_does_not_fail_over_an_unreachable_mcp_server(client, settings):
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, "tests.mcp_toolsets.MissingTracker"]
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    assert "missing" not in response.content.decode()


def test_a_journal_holding_an_undeclared_tool_reads_where_it_was_not_listed_yet(tracker):
    agent_run = enqueue(
        scripted(call("tracker__close_issue", number=1), answer(), tools=["tracker__close_issue"])
    )
    assert fresh(agent_run).status == RunStatus.COMPLETED
    catalog.forget()  # a process (the admin's, say) that never listed the tracker

    journal = read_journal_of(agent_run.pk, parse_stored_request(agent_run.request), disabled=())

    assert (journal.tool_results, journal.ends_with_final_answer) == (1, True)
