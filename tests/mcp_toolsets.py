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


class TrackerOverStdio(McpToolset):
    server = "tracker"
    transport = Stdio(
        command=sys.executable,
        args=("-m", "tests.mcp_servers.tracker", "stdio"),
        env_from=TRACKER_ENV,
        cwd=str(ROOT),
    )
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
