"""Credentials of MCP servers stay unwritten: a header's value (read from
the environment when a session opens) and a secret in a server's URL
appear in nothing operators, the API or the model are told, nor in a log
line — even when the value is malformed and the HTTP client refuses it.
Against the tracker over streamable HTTP (``tests.mcp_servers.tracker``).
"""

import logging

import pytest

from tests.helpers import answer, scripted
from tests.mcp_toolsets import TrackerOverHttp
from tools.mcp import catalog

pytestmark = pytest.mark.django_db

AUTH_TRACKER = "tests.mcp_toolsets.TrackerWithAuthorization"


def test_a_malformed_header_value_is_refused_naming_its_variable_and_never_written(
    http_tracker, settings, monkeypatch, api, caplog
):
    # A secret read from a file often ends in a line break, which no HTTP
    # header may hold: the HTTP client's refusal quotes the value.
    secret = "s3cret-token-4711"
    monkeypatch.setenv("TRACKER_AUTHORIZATION", f"Bearer {secret}\n")
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, AUTH_TRACKER]
    caplog.set_level(logging.INFO)  # the shipped LOG_LEVEL

    listed = api.get("/api/tools/")
    refused = api.post(
        "/api/runs/", scripted(answer(), tools=["authtracker__search_issues"]), format="json"
    )

    assert listed.status_code == 200, listed.content
    search = {tool["name"]: tool for tool in listed.json()}["authtracker__search_issues"]
    assert search["available"] is False
    # What is wrong, named: the header and the variable it comes from.
    assert "'Authorization'" in search["unavailable_reason"], search["unavailable_reason"]
    assert "TRACKER_AUTHORIZATION" in search["unavailable_reason"]
    assert refused.status_code == 400, refused.content
    for written in (listed.content.decode(), refused.content.decode(), caplog.text):
        assert secret not in written


def test_a_credential_in_a_servers_url_is_not_written_to_the_log(http_tracker, monkeypatch, caplog):
    # An HTTP server reached with userinfo or a token in its query: the
    # HTTP client logs every request's URL at INFO.
    monkeypatch.setenv(
        "TRACKER_MCP_URL",
        http_tracker.url.replace("http://", "http://ops:s3cret-password@") + "?key=s3cret-key",
    )
    caplog.set_level(logging.INFO)  # the shipped LOG_LEVEL

    assert not catalog.listing(TrackerOverHttp).unreachable

    assert "s3cret" not in caplog.text
