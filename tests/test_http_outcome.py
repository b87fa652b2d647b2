"""A webhook POST that may have been received without an answer coming back
is an unknown outcome (``ToolOutcomeUnknown``); a failure known to have sent
nothing, and any failure of the read-only GET, is an ordinary ``ToolError``.

Against a real local server that takes the request and then hangs, drops the
connection, cuts its answer short or answers garbage.
"""

import socket

import pytest

from tools.contract import ToolContext, ToolError, ToolOutcomeUnknown
from tools.registry import get_registry

pytestmark = pytest.mark.django_db

CONTEXT = ToolContext(run_id="r", idempotency_key="k" * 64, attempt=1)


def post(url):
    return get_registry().get("post_webhook").run({"url": url, "payload": {"n": 1}}, CONTEXT)


def get(url):
    return get_registry().get("http_get").run({"url": url}, CONTEXT)


def test_a_webhook_that_takes_the_post_and_hangs_past_the_timeout_is_an_unknown_outcome(
    http_server, settings
):
    settings.NRLLM_HTTP_TIMEOUT_SECONDS = 1
    with pytest.raises(
        ToolOutcomeUnknown,
        match="timed out after 1s, after the request may have been received: whether",
    ):
        post(http_server.url("/slow"))
    assert [request.path for request in http_server.posts()] == ["/slow"]


def test_a_webhook_that_stops_reading_the_post_midway_is_an_unknown_outcome(http_server, settings):
    settings.NRLLM_HTTP_TIMEOUT_SECONDS = 1
    payload = {"blob": "x" * 2**25}  # more than the sockets' buffers hold
    with pytest.raises(ToolOutcomeUnknown, match="timed out after 1s, after the request"):
        get_registry().get("post_webhook").run(
            {"url": http_server.url("/no-read"), "payload": payload}, CONTEXT
        )


@pytest.mark.parametrize(
    ("path", "failure"),
    [
        ("/drop", "Server disconnected without sending a response"),
        ("/cut-body", "peer closed connection without sending complete message body"),
        ("/garbage", "illegal status line"),
    ],
)
def test_a_webhook_that_breaks_off_after_the_post_is_an_unknown_outcome(http_server, path, failure):
    with pytest.raises(ToolOutcomeUnknown, match=failure):
        post(http_server.url(path))
    assert [request.path for request in http_server.posts()] == [path]


@pytest.mark.parametrize("path", ["/slow", "/drop", "/cut-body", "/garbage"])
def test_the_read_only_get_reports_the_same_failures_as_tool_errors(http_server, settings, path):
    settings.NRLLM_HTTP_TIMEOUT_SECONDS = 1
    with pytest.raises(ToolError, match=f"GET {http_server.url(path)} (failed|timed out)"):
        get(http_server.url(path))


def test_a_post_refused_at_connect_is_a_tool_error(settings):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.NRLLM_HTTP_ALLOWED_HOSTS = [f"127.0.0.1:{port}"]
    with pytest.raises(ToolError, match="failed: .*Connection refused"):
        post(f"http://127.0.0.1:{port}/hook")


def test_a_post_to_a_name_that_does_not_resolve_is_a_tool_error(dns, settings):
    settings.NRLLM_HTTP_ALLOWED_HOSTS = ["nowhere.test"]
    with pytest.raises(ToolError, match="nowhere.test does not resolve"):
        post("http://nowhere.test/hook")
    assert dns.lookups == ["nowhere.test"]
