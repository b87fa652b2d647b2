"""MCP servers that misbehave: what a server lists is checked before a
tool is offered, and a server that hangs costs its own listing the connect
timeout and nothing more — not another server's listing, not twice the
timeout. A schema that would hang or crash a check makes its own tool
unavailable, never the server's listing; a backtracking pattern ends a
call's check as invalid arguments; a listing or a result past the cap on
one message costs that much memory and no more.

Servers: ``tests.mcp_servers.liar`` (raw JSON-RPC over stdio: lists what
the test writes, or never answers) and the tracker
(``tests.mcp_servers.tracker``).
"""

import contextlib
import json
import threading
import time
import tracemalloc

import psutil
import pytest

from runs.models import AgentRun
from runs.models.vocabulary import RunStatus, StepKind
from runs.runtime import enqueue
from tests.helpers import answer, call, fresh, scripted, wait_until
from tests.mcp_fixtures import reset_mcp
from tests.mcp_toolsets import Liar, StuckStarting, TrackerOverStdio
from tools.contract import ToolContext, ToolOutcomeUnknown
from tools.mcp import catalog, limits
from tools.mcp.results import RESULT_CHARS

pytestmark = pytest.mark.django_db

LIAR = "tests.mcp_toolsets.Liar"
STUCK = "tests.mcp_toolsets.StuckStarting"


@pytest.fixture
def liar(tmp_path, monkeypatch, settings):
    """``write(tools_json)``: what the liar lists next, as raw JSON text."""
    tools_file = tmp_path / "liar-tools.json"
    tools_file.write_text("[]")
    monkeypatch.setenv("LIAR_TOOLS", str(tools_file))
    monkeypatch.setenv("LIAR_LOG", str(tmp_path / "liar.log"))
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, LIAR]
    yield tools_file.write_text
    reset_mcp()


def tools_of(api) -> dict[str, dict]:
    response = api.get("/api/tools/")
    assert response.status_code == 200, response.content
    return {tool["name"]: tool for tool in response.json()}


def test_a_listed_schema_json_cannot_carry_makes_its_tool_unavailable_not_a_5xx(liar, api):
    # NaN is no JSON number: the API could not return the schema, and no
    # chat-completions request could carry it to the model.
    liar(
        '[{"name": "lookup", "description": "Look it up", "inputSchema": {"type": "object", '
        '"properties": {"n": {"type": "number", "maximum": NaN}}}}]'
    )

    lookup = tools_of(api)["liar__lookup"]

    assert lookup["available"] is False
    assert "NaN" in lookup["unavailable_reason"], lookup["unavailable_reason"]
    refused = api.post("/api/runs/", scripted(answer(), tools=["liar__lookup"]), format="json")
    assert refused.status_code == 400, refused.content
    assert "liar__lookup" in refused.content.decode()
    assert AgentRun.objects.count() == 0


def test_a_tool_listed_twice_is_unavailable_rather_than_either_listing(liar, api):
    # Which of the two the server would run is unknown: the runtime would
    # check a call's arguments against one schema and send it to the other.
    liar(
        '[{"name": "twice", "inputSchema": {"type": "object"}},'
        ' {"name": "twice", "inputSchema": {"type": "object", "properties": '
        '{"title": {"type": "string"}}, "required": ["title"]}},'
        ' {"name": "lookup", "inputSchema": {"type": "object"}}]'
    )

    tools = tools_of(api)

    assert tools["liar__twice"]["available"] is False
    assert "more than once" in tools["liar__twice"]["unavailable_reason"]
    assert tools["liar__lookup"]["available"] is True


def test_a_json_rpc_error_in_place_of_a_result_leaves_a_write_in_doubt(liar, tmp_path):
    # The server answered, but with no result: unlike isError, nothing says
    # the tool did not act, so a write is not told to the model as failed.
    liar('[{"name": "refuse_entry", "inputSchema": {"type": "object"}}]')
    tool = catalog.listing(Liar).tools["liar__refuse_entry"]
    assert tool.effect == "non_idempotent_write"  # undeclared

    with pytest.raises(ToolOutcomeUnknown, match="cannot do refuse_entry now"):
        tool.run({}, ToolContext(run_id="r", idempotency_key="k", attempt=1))

    assert (tmp_path / "liar.log").read_text() == '"refuse_entry"\n'  # sent, once


def test_one_runs_json_rpc_error_leaves_another_runs_call_on_the_shared_session_alone(
    liar, tmp_path
):
    """Runs in flight in one process (G15) share its session with a server:
    a call the server refuses, while another run's write is in flight on the
    session, must not close the session under that write (which would leave
    it in doubt, though it was answered)."""
    liar(
        '[{"name": "slow_entry", "inputSchema": {"type": "object"}},'
        ' {"name": "refuse_entry", "inputSchema": {"type": "object"}}]'
    )
    tools = catalog.listing(Liar).tools
    outcomes = {}

    def call_tool(name, after=None):
        if after is not None:  # while that call is in flight (the server answers it in 2 s)
            log = tmp_path / "liar.log"
            wait_until(lambda: log.exists() and after in log.read_text(), what=f"{after} sent")
        context = ToolContext(run_id=name, idempotency_key=name, attempt=1)
        try:
            outcomes[name] = tools[f"liar__{name}"].run({}, context)
        except ToolOutcomeUnknown as unknown:
            outcomes[name] = unknown

    threads = [
        threading.Thread(target=call_tool, args=("slow_entry",)),
        threading.Thread(target=call_tool, args=("refuse_entry", "slow_entry")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert "done slowly" in str(outcomes["slow_entry"]), outcomes
    assert isinstance(outcomes["refuse_entry"], ToolOutcomeUnknown)
    assert sorted((tmp_path / "liar.log").read_text().split()) == ['"refuse_entry"', '"slow_entry"']


def server_started(mode: str) -> bool:
    """Whether this process has started a liar server in ``mode``."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.cmdline()[-2:] == ["tests.mcp_servers.liar", mode]:
                return True
    return False


def test_a_server_stuck_starting_costs_its_listing_the_connect_timeout_and_no_other_listing(
    tracker, settings
):
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, STUCK]
    # The tracker's session opens first, under the usual connect timeout: a
    # loaded host took more than the stuck server's 2 s to start it.
    assert not catalog.listing(TrackerOverStdio).unreachable
    settings.NRLLM_MCP_CONNECT_TIMEOUT_SECONDS = 2
    stuck = {}

    def list_the_stuck_server():
        started = time.monotonic()
        stuck["listing"] = catalog.listing(StuckStarting)
        stuck["seconds"] = time.monotonic() - started

    lister = threading.Thread(target=list_the_stuck_server)
    lister.start()
    wait_until(lambda: server_started("hang"), what="the stuck server's session opening")
    started = time.monotonic()
    meanwhile = catalog.listing(TrackerOverStdio, refresh=True)
    meanwhile_seconds = time.monotonic() - started
    lister.join(timeout=30)

    # Another server's listing does not wait for the stuck one's session.
    assert not meanwhile.unreachable, meanwhile.unreachable
    assert meanwhile_seconds < 1.5, meanwhile_seconds
    # The stuck server is unreachable after its connect timeout, not two.
    assert stuck["listing"].unreachable.startswith("MCP server 'stuck' cannot be reached: ")
    assert stuck["seconds"] < 2 + 1.5, stuck["seconds"]


def test_the_tools_list_waits_for_servers_stuck_starting_side_by_side_not_one_after_another(
    api, settings
):
    # Each stuck server costs its listing the connect timeout; one after
    # another, a few of them would outlast a web worker's timeout (gunicorn
    # kills it at 30 s), and the page to switch their tools off would fail.
    settings.NRLLM_MCP_CONNECT_TIMEOUT_SECONDS = 2
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, STUCK, "tests.mcp_toolsets.AlsoStuckStarting"]
    started = time.monotonic()

    tools = tools_of(api)

    assert time.monotonic() - started < 2 + 1.5
    for name in ("stuck__lookup", "stuck2__lookup"):
        assert tools[name]["available"] is False
        assert "cannot be reached" in tools[name]["unavailable_reason"]
    refused_at = time.monotonic()
    catalog.forget()  # an enqueue in a process that has not listed them
    refused = api.post(
        "/api/runs/", scripted(answer(), tools=["stuck__lookup", "stuck2__lookup"]), format="json"
    )
    assert refused.status_code == 400, refused.content
    assert time.monotonic() - refused_at < 2 + 1.5


def listed(*tools: dict) -> str:
    return json.dumps(list(tools))


LOOKUP = {"name": "lookup", "inputSchema": {"type": "object"}}


def nested(depth: int) -> dict:
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return {"type": "object", "properties": {"q": schema}}


@pytest.mark.parametrize(
    "schema, reason",
    [
        (nested(150), "nested more than 64 levels deep"),
        ({"type": "object", "allOf": [{"$ref": "#"}]}, "refers to itself in place"),
    ],
    ids=["nested 150 levels", "refers to itself"],
)
@pytest.mark.django_db(transaction=True)  # the embedded default executes a run on commit
def test_a_schema_a_check_cannot_finish_makes_only_its_tool_unavailable(
    liar, api, operator_client, schema, reason
):
    # The SDK parses both; jsonschema's checks of them recurse past the
    # interpreter's limit. Raised, it failed the whole listing: the tools
    # pages and enqueue answered 500, every tool of the server was lost.
    liar(listed({"name": "twice", "inputSchema": schema}, LOOKUP))

    tools = tools_of(api)

    assert tools["liar__twice"]["available"] is False
    assert reason in tools["liar__twice"]["unavailable_reason"]
    assert tools["liar__lookup"]["available"] is True
    assert operator_client.get("/admin/tools/toolsetting/").status_code == 200
    refused = api.post("/api/runs/", scripted(answer(), tools=["liar__twice"]), format="json")
    assert refused.status_code == 400, refused.content
    assert reason in refused.json()["detail"]
    accepted = api.post(
        "/api/runs/",
        scripted(call("liar__lookup"), answer(), tools=["liar__lookup"]),
        format="json",
    )
    assert accepted.status_code == 201, accepted.content
    ran = fresh(enqueue(scripted(call("liar__lookup"), answer(), tools=["liar__lookup"])))
    assert ran.status == RunStatus.COMPLETED, ran.error_message
    assert ran.steps.get(kind=StepKind.TOOL).result == "done"


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_backtracking_pattern_ends_a_calls_check_as_invalid_arguments_and_the_run_goes_on(
    liar, workers, tmp_path
):
    # re takes hours on this: the worker would spin, its lease expire, and
    # the next worker hang the same way.
    pattern = {"type": "object", "properties": {"q": {"type": "string", "pattern": "^(a|aa)+$"}}}
    liar(listed({"name": "lookup", "inputSchema": pattern}))
    slow, quick = "a" * 48 + "b", "aaaa"
    agent_run = enqueue(
        scripted(
            call("liar__lookup", q=slow),
            call("liar__lookup", q=quick),
            answer(),
            tools=["liar__lookup"],
        )
    )
    second = enqueue(scripted(call("liar__lookup", q=quick), answer(), tools=["liar__lookup"]))

    workers.run_burst(timeout=60, **{key: str(tmp_path / name) for key, name in LIAR_FILES.items()})

    done = fresh(agent_run)
    assert done.status == RunStatus.COMPLETED, done.error_message
    refused, called = done.steps.filter(kind=StepKind.TOOL).order_by("sequence")
    assert refused.error.startswith("invalid arguments: (arguments): matching the pattern")
    assert "took longer than 1s" in refused.error
    assert called.error == "" and called.result == "done"
    # The worker was free for the next run; the slow call never left it.
    assert fresh(second).status == RunStatus.COMPLETED
    assert (tmp_path / "liar.log").read_text() == '"lookup"\n' * 2


LIAR_FILES = {"LIAR_TOOLS": "liar-tools.json", "LIAR_LOG": "liar.log"}


def test_a_tool_list_past_the_cap_fails_its_listing_with_a_reason(liar, api):
    description = "x" * (limits.MESSAGE_BYTES + 1000)
    liar(listed({**LOOKUP, "description": description}))

    tools = tools_of(api)

    reason = tools["liar__lookup"]["unavailable_reason"]
    assert reason == (
        f"MCP server 'liar' cannot be listed: its tool list is larger than "
        f"{limits.MESSAGE_BYTES} bytes, this client's cap"
    )
    refused = api.post("/api/runs/", scripted(answer(), tools=["liar__lookup"]), format="json")
    assert refused.status_code == 400, refused.content
    assert len(refused.content) < 2000


def test_a_result_past_the_cap_is_cut_as_it_arrives_and_the_session_goes_on(liar):
    huge = f"huge_{8 * limits.MESSAGE_BYTES}"  # the size it answers with
    liar(listed({"name": huge, "inputSchema": {"type": "object"}}, LOOKUP))
    listing = catalog.listing(Liar)
    context = ToolContext(run_id="r", idempotency_key="k", attempt=1)

    tracemalloc.start()
    try:
        value = listing.tools[f"liar__{huge}"].run({}, context)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    # Read whole, the answer alone would be 32 MB (and its parse more).
    assert peak < 2 * limits.MESSAGE_BYTES, peak
    assert value["truncated"] is True
    assert len(value["json"]) == RESULT_CHARS
    assert value["json"].startswith('{"jsonrpc": "2.0", "id": ')
    # The rest of the answer was read and dropped: the next call's answer
    # is its own, over the same session.
    assert listing.tools["liar__lookup"].run({}, context) == "done"
