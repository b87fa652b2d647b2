"""MCP servers that misbehave: what a server lists is checked before a
tool is offered, and a server that hangs costs its own listing the connect
timeout and nothing more — not another server's listing, not twice the
timeout.

Servers: ``tests.mcp_servers.liar`` (raw JSON-RPC over stdio: lists what
the test writes, or never answers) and the tracker
(``tests.mcp_servers.tracker``).
"""

import threading
import time

import pytest

from tests.mcp_toolsets import StuckStarting, TrackerOverStdio
from tools.mcp import catalog

pytestmark = pytest.mark.django_db

STUCK = "tests.mcp_toolsets.StuckStarting"


def test_a_server_stuck_starting_costs_its_listing_the_connect_timeout_and_no_other_listing(
    tracker, settings
):
    settings.NRLLM_MCP_CONNECT_TIMEOUT_SECONDS = 2
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, STUCK]
    assert not catalog.listing(TrackerOverStdio).unreachable  # its session is open
    stuck = {}

    def list_the_stuck_server():
        started = time.monotonic()
        stuck["listing"] = catalog.listing(StuckStarting)
        stuck["seconds"] = time.monotonic() - started

    lister = threading.Thread(target=list_the_stuck_server)
    lister.start()
    time.sleep(0.5)  # the stuck server's session is opening
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
