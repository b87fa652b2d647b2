"""MCP toolsets the tests register through ``NRLLM_TOOLS``: the tracker
server (``tests.mcp_servers.tracker``) over stdio and over streamable HTTP."""

import os
import sys

from tests.helpers import ROOT
from tools.effects import ToolEffect
from tools.mcp import Declared, McpToolset, Stdio, StreamableHttp, Undeclared

TRACKER_ENV = ("TRACKER_LOG", "TRACKER_RELEASE", "TRACKER_FAIL_CREATE")

TRACKER_TOOLS = {
    "search_issues": ToolEffect.READ_ONLY,
    "create_issue": Declared(ToolEffect.NON_IDEMPOTENT_WRITE, timeout_seconds=30),
    # Its server says readOnlyHint: true. It writes, and the declaration wins.
    "label_issue": ToolEffect.IDEMPOTENT_WRITE,
}


def python_server(module: str, mode: str, env_from: tuple[str, ...] = ()) -> Stdio:
    """The test MCP server ``tests.mcp_servers.<module>``, started in ``mode``."""
    return Stdio(
        command=sys.executable,
        args=("-m", f"tests.mcp_servers.{module}", mode),
        env_from=env_from,
        cwd=str(ROOT),
    )


class TrackerOverStdio(McpToolset):
    server = "tracker"
    transport = python_server("tracker", "stdio", TRACKER_ENV)
    tools = TRACKER_TOOLS


class TrackerOverHttp(McpToolset):
    server = "webtracker"
    tools = TRACKER_TOOLS

    @classmethod
    def get_transport(cls):
        return StreamableHttp(url=os.environ.get("TRACKER_MCP_URL", "http://127.0.0.1:9/mcp"))


class TrackerHidingUndeclared(McpToolset):
    server = "quiettracker"
    transport = TrackerOverStdio.transport
    tools = {"search_issues": ToolEffect.READ_ONLY}
    undeclared = Undeclared.HIDE


class ImpatientTracker(McpToolset):
    """Gives ``create_issue`` one second: a held call runs out of time."""

    server = "impatient"
    transport = TrackerOverStdio.transport
    tools = {
        "search_issues": ToolEffect.READ_ONLY,
        "create_issue": Declared(ToolEffect.NON_IDEMPOTENT_WRITE, timeout_seconds=1),
    }


class MissingTracker(McpToolset):
    """A server whose command does not exist: it can never be reached."""

    server = "missing"
    transport = Stdio(command=str(ROOT / "no-such-tracker-server"))
    tools = {"create_issue": ToolEffect.NON_IDEMPOTENT_WRITE}


class OverpromisingTracker(McpToolset):
    """Declares a tool the tracker does not have."""

    server = "overpromising"
    transport = TrackerOverStdio.transport
    tools = {
        "search_issues": ToolEffect.READ_ONLY,
        "merge_issues": ToolEffect.NON_IDEMPOTENT_WRITE,
    }


class TrackerWithAuthorization(McpToolset):
    """The tracker over HTTP, sent an ``Authorization`` header whose value
    comes from ``TRACKER_AUTHORIZATION``."""

    server = "authtracker"
    tools = {"search_issues": ToolEffect.READ_ONLY}

    @classmethod
    def get_transport(cls):
        return StreamableHttp(
            url=os.environ.get("TRACKER_MCP_URL", "http://127.0.0.1:9/mcp"),
            headers_from_env={"Authorization": "TRACKER_AUTHORIZATION"},
        )


LIAR_ENV = ("LIAR_TOOLS", "LIAR_LOG")


class Liar(McpToolset):
    """``tests.mcp_servers.liar``: lists the tools array of ``LIAR_TOOLS`` as written."""

    server = "liar"
    transport = python_server("liar", "list", LIAR_ENV)
    tools = {"lookup": ToolEffect.READ_ONLY, "twice": ToolEffect.NON_IDEMPOTENT_WRITE}


class StuckStarting(McpToolset):
    """A server that never answers its handshake."""

    server = "stuck"
    transport = python_server("liar", "hang")
    tools = {"lookup": ToolEffect.READ_ONLY}


class AlsoStuckStarting(McpToolset):
    """A second server that never answers its handshake."""

    server = "stuck2"
    transport = StuckStarting.transport
    tools = {"lookup": ToolEffect.READ_ONLY}
