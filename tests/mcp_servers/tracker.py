"""An issue tracker as an MCP server, for the tests: ``search_issues``
reads, ``create_issue`` appends, ``close_issue`` is undeclared by the test
toolsets, ``label_issue`` lies in its hints (says read-only, writes),
``render_issue`` (undeclared too) has markup in its description, which the
tools pages must show as text.

Run as ``python -m tests.mcp_servers.tracker stdio`` or ``... http PORT``.
Every call that reaches a tool is appended to ``TRACKER_LOG`` (one JSON
line, flushed and fsynced before the tool acts), so a test counts at the
server what arrived, even from a server it killed. ``create_issue`` with a
title starting ``hold`` waits until ``TRACKER_RELEASE`` exists (a test kills
the server meanwhile); ``TRACKER_FAIL_CREATE`` makes it report an error.
"""

import json
import os
import sys
import time

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

# Quiet: the tests read what reached the tools from the log, not stderr.
server = MCPServer("tracker", log_level="CRITICAL")


def _log(tool: str, arguments: dict, ctx: Context | None) -> None:
    meta = dict(ctx.request_context.meta or {}) if ctx is not None else {}
    line = {
        "tool": tool,
        "arguments": arguments,
        "idempotency_key": meta.get("nrllm-ops/idempotencyKey", ""),
        "pid": os.getpid(),
    }
    with open(os.environ["TRACKER_LOG"], "a") as log:
        log.write(json.dumps(line, sort_keys=True) + "\n")
        log.flush()
        os.fsync(log.fileno())


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def search_issues(query: str, ctx: Context) -> dict:
    """Search the tracker's issues by words in their titles."""
    _log("search_issues", {"query": query}, ctx)
    return {"matches": [f"issue about {query}"]}


@server.tool(annotations=ToolAnnotations(destructiveHint=False, idempotentHint=False))
def create_issue(title: str, ctx: Context) -> dict:
    """Open a new issue with a title."""
    _log("create_issue", {"title": title}, ctx)
    if os.environ.get("TRACKER_FAIL_CREATE"):
        raise ToolError("the tracker is read-only today")
    if title.startswith("hold"):
        release = os.environ["TRACKER_RELEASE"]
        while not os.path.exists(release):
            time.sleep(0.02)
    return {"created": title}


@server.tool(annotations=ToolAnnotations(destructiveHint=True))
def close_issue(number: int, ctx: Context) -> str:
    """Close an issue."""
    _log("close_issue", {"number": number}, ctx)
    return f"closed {number}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def label_issue(number: int, label: str, ctx: Context) -> str:
    """Label an issue (its hints say read-only; it writes)."""
    _log("label_issue", {"number": number, "label": label}, ctx)
    return f"labelled {number} {label}"


@server.tool(
    description='Render an issue as HTML: <script>alert("tracker")</script> <b>bold</b>',
    annotations=ToolAnnotations(readOnlyHint=True),
)
def render_issue(number: int, ctx: Context) -> str:
    _log("render_issue", {"number": number}, ctx)
    return f"<h1>issue {number}</h1>"


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
