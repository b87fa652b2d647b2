"""An MCP toolset is checked when the registry loads (G1): an effect that is
not a ``ToolEffect`` member, a bad server name, a missing transport, a
duplicate server or a clash with another tool's name stops start-up with a
message naming the class — and no MCP server is asked anything to load."""

import pytest

from tests.mcp_toolsets import MissingTracker, TrackerOverStdio
from tools.builtin import BUILTIN_TOOLS
from tools.contract import Tool
from tools.effects import ToolEffect
from tools.mcp import Declared, McpToolset, Stdio, StreamableHttp, catalog
from tools.registry import ToolRegistry, ToolRegistryError


def toolset(**attributes) -> type[McpToolset]:
    defaults = {
        "server": "ledger",
        "transport": Stdio(command="ledger-mcp"),
        "tools": {"post_entry": ToolEffect.NON_IDEMPOTENT_WRITE},
    }
    return type("LedgerTools", (McpToolset,), {**defaults, **attributes})


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        (
            {"tools": {"post_entry": "non_idempotent_write"}},
            "tool 'post_entry': effect 'non_idempotent_write' is not a ToolEffect member",
        ),
        (
            {"tools": {"post_entry": Declared("read_only")}},
            "tool 'post_entry': effect 'read_only' is not a ToolEffect member",
        ),
        (
            {"tools": {"post_entry": Declared(ToolEffect.READ_ONLY, timeout_seconds=0)}},
            "tool 'post_entry': timeout_seconds must be a finite number of seconds above 0",
        ),
        (
            # An endless limit: the lease cannot be extended to cover it,
            # and the run would fail at the call, not at load.
            {"tools": {"post_entry": Declared(ToolEffect.READ_ONLY, timeout_seconds=float("inf"))}},
            "tool 'post_entry': timeout_seconds must be a finite number of seconds above 0",
        ),
        (
            {"tools": {"post_entry": Declared(ToolEffect.READ_ONLY, timeout_seconds=True)}},
            "tool 'post_entry': timeout_seconds must be a finite number of seconds above 0",
        ),
        (
            {"tools": {"post.entry": ToolEffect.READ_ONLY}},
            "tool 'post.entry': its registered name must be 1-64 letters",
        ),
        (
            {"tools": {"p" * 60: ToolEffect.READ_ONLY}},
            "its registered name must be 1-64 letters",
        ),
        ({"server": ""}, "server '' must be 1-40 letters"),
        ({"server": "led ger"}, "server 'led ger' must be 1-40 letters"),
        ({"server": "led__ger"}, "server 'led__ger' must not contain '__'"),
        # "ledger_" + "__" + "entry" is "ledger" + "__" + "_entry": one
        # registered name for two servers' tools.
        ({"server": "ledger_"}, "server 'ledger_' must not end with '_'"),
        ({"transport": "stdio://ledger"}, "transport must be a Stdio or a StreamableHttp"),
        # ("LEDGER_TOKEN") is a str, not a tuple: its letters would be the
        # variables handed on, and the server would start without its token.
        (
            {"transport": Stdio(command="ledger-mcp", env_from=("LEDGER_TOKEN"))},
            "transport: env_from must be a tuple of strings, not the str 'LEDGER_TOKEN'",
        ),
        (
            {"transport": Stdio(command="ledger-mcp", args=("--books"))},
            "transport: args must be a tuple of strings, not the str '--books'",
        ),
        (
            {"transport": StreamableHttp(url="https://x/mcp", headers_from_env="LEDGER_AUTH")},
            "transport: headers_from_env must map header names to variable names",
        ),
        ({"tools": ["post_entry"]}, "tools must be a dict"),
        ({"undeclared": "hide"}, "undeclared must be an Undeclared member"),
        ({"timeout_seconds": -1}, "timeout_seconds must be a finite number of seconds above 0"),
        (
            {"timeout_seconds": float("inf")},
            "timeout_seconds must be a finite number of seconds above 0",
        ),
    ],
)
def test_a_broken_toolset_is_refused_at_load_naming_its_class(attributes, message):
    with pytest.raises(ToolRegistryError) as refused:
        ToolRegistry([toolset(**attributes)])
    assert "MCP toolset tests.test_mcp_toolset_loading.LedgerTools" in str(refused.value)
    assert message in str(refused.value)


def test_two_toolsets_for_one_server_name_are_refused():
    with pytest.raises(ToolRegistryError, match="duplicate MCP server name 'ledger'"):
        ToolRegistry([toolset(), toolset()])


def test_a_tool_class_named_like_a_toolsets_tool_is_refused():
    class Impostor(Tool):
        name = "ledger__post_entry"
        parameters = {"type": "object"}

    with pytest.raises(ToolRegistryError, match="duplicate tool name 'ledger__post_entry'"):
        ToolRegistry([Impostor, toolset()])

    class Squatter(Tool):
        name = "ledger__anything"
        parameters = {"type": "object"}

    with pytest.raises(ToolRegistryError, match="named like a tool of the MCP toolset"):
        ToolRegistry([Squatter, toolset()])


def test_loading_asks_no_server_and_effects_resolve_from_code_alone():
    # MissingTracker's command does not exist: any attempt to reach it fails.
    registry = ToolRegistry([*BUILTIN_TOOLS, MissingTracker, TrackerOverStdio])
    assert "missing__create_issue" in registry.names()
    assert registry.effect_for("missing__create_issue") == ToolEffect.NON_IDEMPOTENT_WRITE
    assert registry.effect_for("tracker__search_issues") == ToolEffect.READ_ONLY
    assert registry.effect_for("tracker__label_issue") == ToolEffect.IDEMPOTENT_WRITE
    # Undeclared, or unknown: the riskiest effect (G1).
    assert registry.effect_for("tracker__close_issue") == ToolEffect.NON_IDEMPOTENT_WRITE
    assert registry.effect_for("missing__whatever") == ToolEffect.NON_IDEMPOTENT_WRITE
    assert registry.toolset_of("tracker__close_issue") is TrackerOverStdio
    assert registry.toolset_of("read_note") is None


def test_a_transport_built_when_a_session_opens_is_checked_then_naming_what_is_wrong():
    # Built by get_transport(), it is not there to check at load: the
    # session refuses it, and the listing says why.
    class LedgerFromEnvironment(McpToolset):
        server = "ledger"
        tools = {"post_entry": ToolEffect.NON_IDEMPOTENT_WRITE}

        @classmethod
        def get_transport(cls):
            return Stdio(command="ledger-mcp", env_from=("LEDGER_TOKEN"))

    listed = catalog.listing(LedgerFromEnvironment)

    assert listed.unreachable == (
        "MCP server 'ledger' cannot be reached: TypeError: get_transport(): env_from must be "
        "a tuple of strings, not the str 'LEDGER_TOKEN'"
    )
