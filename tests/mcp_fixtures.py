"""Fixtures for tools from MCP servers: the tracker server
(``tests.mcp_servers.tracker``) over stdio, started by the session that
first calls it, and over streamable HTTP, a process on a local port.

The server appends every call that reaches a tool to a log, so a test
counts at the server what arrived — from a server it killed, too."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, free_port, wait_until

STDIO = "tests.mcp_toolsets.TrackerOverStdio"
HTTP = "tests.mcp_toolsets.TrackerOverHttp"


def reset_mcp() -> None:
    """Close this process's MCP sessions and forget its listings."""
    from tools.mcp import catalog
    from tools.mcp.sessions import sessions

    sessions().close_all()
    catalog.forget()


class Tracker:
    """The tracker's log and switches, and (over HTTP) its process."""

    def __init__(self, directory: Path):
        self.log = directory / "tracker.log"
        self.log.touch()
        self.release_file = directory / "tracker.release"
        self.env = {"TRACKER_LOG": str(self.log), "TRACKER_RELEASE": str(self.release_file)}
        self.process: subprocess.Popen | None = None
        self.port: int | None = None

    def calls(self, tool: str | None = None) -> list[dict]:
        """Every call that reached a tool (of ``tool``), in order."""
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [line for line in lines if tool is None or line["tool"] == tool]

    def release(self) -> None:
        """Let a held ``create_issue`` (a title starting ``hold``) finish."""
        self.release_file.touch()

    def held(self, timeout=30.0, progress=None) -> dict:
        """Wait for a held call to reach the server; return it. ``progress``:
        ``wait_until``'s, for a call that comes from a worker starting."""

        def held_call():
            calls = self.calls("create_issue")
            return next((c for c in calls if c["arguments"]["title"].startswith("hold")), None)

        return wait_until(
            held_call,
            timeout=timeout,
            what="a held create_issue at the tracker",
            progress=progress,
        )

    def kill_server_of(self, call: dict) -> None:
        """SIGKILL the server process that logged ``call``."""
        try:
            os.kill(call["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass

    # --- over streamable HTTP -------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start_http(self) -> None:
        self.port = self.port or free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.mcp_servers.tracker", "http", str(self.port)],
            cwd=ROOT,
            env={**os.environ, **self.env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self._listening, timeout=30, what="the tracker's HTTP port")

    def _listening(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"the tracker exited with {self.process.returncode}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def stop_http(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        self.process = None


def _tracker(tmp_path, monkeypatch, settings, toolset: str) -> Tracker:
    tracker = Tracker(tmp_path)
    for name, value in tracker.env.items():
        monkeypatch.setenv(name, value)
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, toolset]
    return tracker


@pytest.fixture
def tracker(tmp_path, monkeypatch, settings):
    """The tracker over stdio, as the ``tracker__*`` tools."""
    tracker = _tracker(tmp_path, monkeypatch, settings, STDIO)
    yield tracker
    reset_mcp()


@pytest.fixture
def http_tracker(tmp_path, monkeypatch, settings):
    """The tracker over streamable HTTP on a local port, as the
    ``webtracker__*`` tools; ``stop_http``/``start_http`` take it down and up."""
    directory = tmp_path / "http"
    directory.mkdir()
    tracker = _tracker(directory, monkeypatch, settings, HTTP)
    tracker.start_http()
    monkeypatch.setenv("TRACKER_MCP_URL", tracker.url)
    tracker.env["TRACKER_MCP_URL"] = tracker.url
    yield tracker
    reset_mcp()
    tracker.stop_http()
