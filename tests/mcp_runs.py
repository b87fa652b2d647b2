"""What the MCP recovery tests share: the tracker over each transport (the
``server`` fixture), plans naming its tools, and the faults the tests
inject at the server's own boundary — its process killed or stopped."""

from dataclasses import dataclass

import pytest

from tests.drifting_model import request_for
from tests.mcp_fixtures import Tracker

SEARCH = {"name": "search_issues", "arguments": {"query": "login (take {take})"}}
CREATE = {"name": "create_issue", "arguments": {"title": "login broken (take {take})"}}
#: The tracker holds a title starting "hold" until the test releases it.
HELD_CREATE = {"name": "create_issue", "arguments": {"title": "hold: login broken (take {take})"}}
LABEL = {"name": "label_issue", "arguments": {"number": 7, "label": "bug-{take}"}}
ANSWER = {"answer": "filed (take {take})"}


@dataclass
class Server:
    """The tracker as one run sees it: its fixture, and the prefix of its tools."""

    tracker: Tracker
    prefix: str

    @property
    def over_stdio(self) -> bool:
        return self.prefix == "tracker"

    def tool(self, remote_name: str) -> str:
        return f"{self.prefix}__{remote_name}"

    def plan(self, *turns) -> list[dict]:
        """Plan entries (``tests.drifting_model``): a list of calls is one
        turn, its calls named by their tool on this server."""

        def named(call):
            return {**call, "name": self.tool(call["name"])}

        return [
            {"calls": [named(call) for call in turn]} if isinstance(turn, list) else turn
            for turn in turns
        ]

    def request(self, model, *turns, scripted_before=None) -> dict:
        """A run request playing ``turns`` on ``model`` (the ``model``
        fixture's value), offered the tools its turns call;
        ``scripted_before``: ``request_for``'s, for the scripted model."""
        plan = self.plan(*turns)
        tools = sorted({call["name"] for entry in plan for call in entry.get("calls", [])})
        name = "scripted" if model is None else "drifting"
        return request_for(name, plan, tools, scripted_before=scripted_before)

    def kill(self, call: dict) -> None:
        """The server that received ``call`` dies: over stdio its process
        (a child of the work horse) is SIGKILLed; over HTTP the server
        process is."""
        if self.over_stdio:
            self.tracker.kill_server_of(call)
        else:
            self.tracker.stop_http()


@pytest.fixture(name="server", params=["stdio", "http"])
def server_fixture(request) -> Server:
    """``server``: the tracker over each transport. (Import
    ``server_fixture`` to use it.)"""
    if request.param == "stdio":
        return Server(request.getfixturevalue("tracker"), "tracker")
    return Server(request.getfixturevalue("http_tracker"), "webtracker")
