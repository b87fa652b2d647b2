"""Where operators see MCP tools, through the API (``/api/tools/``), against
the real tracker server (``tests.mcp_servers.tracker``): each tool says where
it comes from, what its toolset declares, whether it can be offered now and
why not, and the server's hints beside the declaration — flagged where they
contradict it, never acted on (G1). And ``/metrics`` per server."""

import time

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from runs.models.vocabulary import RunStatus, StepKind
from runs.runtime import run
from tests.helpers import answer, call, scripted
from tests.mcp_fixtures import reset_mcp
from tools.models import ToolSetting

pytestmark = pytest.mark.django_db

LABEL_FLAG = "the server says readOnlyHint: true; declared idempotent_write"


def tools_of(api, query="") -> dict[str, dict]:
    response = api.get(f"/api/tools/{query}")
    assert response.status_code == 200, response.content
    return {tool["name"]: tool for tool in response.json()}


def test_the_api_lists_mcp_tools_with_their_server_declaration_and_hints(api, tracker):
    tools = tools_of(api)

    search = tools["tracker__search_issues"]
    assert {key: search[key] for key in ("source", "server", "effect", "declared")} == {
        "source": "mcp",
        "server": "tracker",
        "effect": "read_only",
        "declared": True,
    }
    assert (search["registered"], search["available"], search["unavailable_reason"]) == (
        True,
        True,
        "",
    )
    assert search["hints"] == {"readOnlyHint": True}
    assert search["hint_contradictions"] == []
    assert search["description"] == "Search the tracker's issues by words in their titles."
    assert search["parameters"]["required"] == ["query"]  # the server's schema
    create = tools["tracker__create_issue"]
    assert create["effect"] == "non_idempotent_write"
    assert create["hints"] == {"destructiveHint": False, "idempotentHint": False}
    assert create["hint_contradictions"] == []
    # A builtin says where it comes from too, and has no server nor hints.
    notes = tools["search_notes"]
    assert (notes["source"], notes["server"], notes["declared"], notes["available"]) == (
        "builtin",
        "",
        True,
        True,
    )
    assert (notes["hints"], notes["hint_contradictions"]) == ({}, [])
    detail = api.get("/api/tools/tracker__search_issues/").json()
    assert detail == search


def test_a_tool_whose_hints_contradict_its_declaration_is_flagged_and_the_declaration_wins(
    api, tracker, settings
):
    settings.NRLLM_APPROVAL_REQUIRED_FOR = "write"
    label = tools_of(api)["tracker__label_issue"]

    assert label["hints"] == {"readOnlyHint": True}
    assert label["hint_contradictions"] == [LABEL_FLAG]
    assert (label["effect"], label["declared"]) == ("idempotent_write", True)
    # A write by its declaration: under "every write waits", it waits,
    # whatever the server says.
    assert label["approval_required"] is True
    flagged = tools_of(api, "?flagged=true")
    assert sorted(flagged) == ["tracker__label_issue", "tracker__render_issue"]
    assert "tracker__label_issue" not in tools_of(api, "?flagged=false")

    settings.NRLLM_APPROVAL_REQUIRED_FOR = "none"
    agent_run = run(
        scripted(
            call("tracker__label_issue", number=7, label="bug"),
            answer("labelled"),
            tools=["tracker__label_issue"],
        )
    )
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error
    (step,) = agent_run.steps.filter(kind=StepKind.TOOL)
    assert step.effect == "idempotent_write"  # recorded as a write: audited (G2)
    assert [c["arguments"] for c in tracker.calls("label_issue")] == [{"number": 7, "label": "bug"}]


@pytest.mark.usefixtures("approvals")
def test_an_undeclared_tool_is_listed_as_a_non_idempotent_write_needing_approval(api, tracker):
    assert not ToolSetting.objects.filter(name="tracker__close_issue").exists()

    close = tools_of(api)["tracker__close_issue"]

    assert (close["source"], close["server"], close["effect"]) == (
        "mcp",
        "tracker",
        "non_idempotent_write",
    )
    assert (close["declared"], close["registered"], close["available"]) == (False, True, True)
    assert close["hints"] == {"destructiveHint": True}
    assert close["approval_required"] is True  # the shipped default policy
    # Seen in a listing, it has a settings row: an operator can switch it off.
    assert ToolSetting.objects.filter(name="tracker__close_issue").exists()
    switched = api.patch("/api/tools/tracker__close_issue/", {"enabled": False}, format="json")
    assert switched.status_code == 200 and switched.json()["enabled"] is False
    assert switched.json()["effect"] == "non_idempotent_write"


def test_an_undeclared_tool_named_before_any_list_gets_its_setting_on_its_own_page(api, tracker):
    response = api.get("/api/tools/tracker__close_issue/")

    assert response.status_code == 200, response.content
    assert (response.json()["declared"], response.json()["effect"]) == (
        False,
        "non_idempotent_write",
    )
    assert ToolSetting.objects.filter(name="tracker__close_issue").exists()
    # A name the server does not offer gets nothing.
    assert api.get("/api/tools/tracker__no_such_tool/").status_code == 404
    assert not ToolSetting.objects.filter(name="tracker__no_such_tool").exists()


def test_a_name_no_listing_showed_gets_no_setting_while_its_server_is_down(api, settings):
    # A server that cannot be reached may offer any name: the name is not
    # unknown to the registry, but nothing says such a tool exists, and a
    # look at its page must not make a settings row for it.
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, "tests.mcp_toolsets.MissingTracker"]

    for name in ("missing__no_such_tool", "missing__another_guess"):
        assert api.get(f"/api/tools/{name}/").status_code == 404

    assert not ToolSetting.objects.filter(name__startswith="missing__no").exists()
    assert not ToolSetting.objects.filter(name="missing__another_guess").exists()
    # Its declared tool has its row from code, server or no server.
    assert api.get("/api/tools/missing__create_issue/").status_code == 200


def test_a_server_down_shows_its_tools_unavailable_with_the_reason(api, http_tracker):
    http_tracker.stop_http()
    started = time.monotonic()

    response = api.get("/api/tools/")

    assert response.status_code == 200
    assert time.monotonic() - started < 10  # an unreachable HTTP server fails fast
    tools = {tool["name"]: tool for tool in response.json()}
    create = tools["webtracker__create_issue"]
    assert (create["registered"], create["available"], create["declared"]) == (True, False, True)
    assert create["unavailable_reason"].startswith("MCP server 'webtracker' cannot be reached")
    assert create["effect"] == "non_idempotent_write"  # from code, server or no server
    assert (create["hints"], create["parameters"]) == ({}, None)
    unavailable = tools_of(api, "?available=false")
    assert sorted(unavailable) == [
        "webtracker__create_issue",
        "webtracker__label_issue",
        "webtracker__search_issues",
    ]
    assert "search_notes" in tools_of(api, "?available=true")
    # The same reason refuses a run at enqueue.
    refused = api.post(
        "/api/runs/",
        scripted(answer(), tools=["webtracker__search_issues"]),
        format="json",
    )
    assert refused.status_code == 400
    assert create["unavailable_reason"] in refused.json()["detail"]

    http_tracker.start_http()
    reset_mcp()  # as a process that has not listed since (the catalog retries after 5 s)
    assert tools_of(api)["webtracker__create_issue"]["available"] is True


def test_a_setting_whose_toolset_is_gone_or_hides_the_tool_says_why_it_is_not_offered(
    api, tracker, settings
):
    tools_of(api)  # the undeclared close_issue is seen, and gets its row
    # The deployment now lists the tracker only through a toolset that
    # hides what it does not declare; a row from before names its tool.
    settings.NRLLM_TOOLS = [
        *(name for name in settings.NRLLM_TOOLS if name != "tests.mcp_toolsets.TrackerOverStdio"),
        "tests.mcp_toolsets.TrackerHidingUndeclared",
    ]
    ToolSetting.objects.create(name="quiettracker__close_issue")

    tools = tools_of(api)

    gone = tools["tracker__close_issue"]
    assert (gone["source"], gone["server"], gone["registered"], gone["available"]) == (
        "unknown",
        "",
        False,
        False,
    )
    assert gone["effect"] == "non_idempotent_write"  # an unknown name fails closed (G1)
    assert gone["unavailable_reason"].startswith("not registered")
    hidden = tools["quiettracker__close_issue"]
    assert (hidden["source"], hidden["server"], hidden["declared"]) == (
        "mcp",
        "quiettracker",
        False,
    )
    assert (hidden["registered"], hidden["available"]) == (False, False)
    assert hidden["unavailable_reason"].startswith("hidden")
    assert tools_of(api, "?source=mcp").keys() == {
        "quiettracker__close_issue",
        "quiettracker__search_issues",
    }
    assert tools_of(api, "?server=quiettracker&available=true").keys() == {
        "quiettracker__search_issues"
    }


@pytest.mark.parametrize(
    "body",
    [
        {"effect": "read_only"},
        {"enabled": False, "effect": "read_only"},
        {"hints": {"readOnlyHint": False}},
        {"declared": True},
        {"hint_contradictions": []},
        {"source": "builtin"},
        {"available": True},
    ],
)
def test_a_patch_cannot_set_what_code_or_the_server_says(api, tracker, body):
    before = tools_of(api)["tracker__label_issue"]

    response = api.patch("/api/tools/tracker__label_issue/", body, format="json")

    assert response.status_code == 400
    field = next(name for name in body if name != "enabled")
    assert f"{field} is read-only" in response.json()["detail"]
    assert tools_of(api)["tracker__label_issue"] == before


@pytest.mark.parametrize(
    "query, named",
    [("?available=yes", "available"), ("?flagged=1", "flagged"), ("?source=MCP", "source")],
)
def test_a_bad_filter_is_a_400_naming_it(api, query, named):
    response = api.get(f"/api/tools/{query}")
    assert response.status_code == 400
    assert response.json()["detail"].startswith(f"{named}: must be")


def test_metrics_count_each_servers_calls_by_outcome_and_time_them(settings, tracker, monkeypatch):
    monkeypatch.setenv("TRACKER_FAIL_CREATE", "1")  # read as the server starts
    settings.NRLLM_METRICS_TOKEN = "t"

    def scrape() -> dict:
        text = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer t").content.decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def grown(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    before = scrape()
    agent_run = run(
        scripted(
            call("tracker__search_issues", query="login"),
            call("tracker__create_issue", title="login broken"),
            answer("the tracker refused"),
            tools=["tracker__search_issues", "tracker__create_issue"],
        )
    )
    after = scrape()

    assert agent_run.status == RunStatus.COMPLETED, agent_run.error
    assert grown("nrllm_mcp_calls_total", server="tracker", outcome="ok") == 1
    assert grown("nrllm_mcp_calls_total", server="tracker", outcome="error") == 1
    assert grown("nrllm_mcp_call_seconds_count", server="tracker") == 2
    assert grown("nrllm_mcp_listings_total", server="tracker", outcome="ok") >= 1
    assert grown("nrllm_mcp_calls_total", server="webtracker", outcome="ok") == 0
