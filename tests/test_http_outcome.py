"""A webhook POST that may have been received without an answer coming back
is an unknown outcome (``ToolOutcomeUnknown``); a failure known to have sent
nothing, and any failure of the read-only GET, is an ordinary ``ToolError``;
an answer, whatever its status (a redirect, never followed, included), is a
result.

Against a real local server that takes the request and then hangs, drops the
connection, cuts its answer short, trickles it or answers garbage; some calls
run as the agent loop runs a tool, under its time limit (SIGALRM, which
reaches pytest's main thread), whose ``ToolTimeout`` the loop takes for a
write in doubt.
"""

import socket
import time

import pytest

from runs.runtime import enqueue
from tests.helpers import answer, call, fresh, scripted
from tools.builtin.http import exchange_seconds
from tools.contract import ToolContext, ToolError, ToolOutcomeUnknown
from tools.deadline import ToolTimeout, time_limit
from tools.registry import get_registry

pytestmark = pytest.mark.django_db

CONTEXT = ToolContext(run_id="r", idempotency_key="k" * 64, attempt=1)


def post(url):
    return get_registry().get("post_webhook").run({"url": url, "payload": {"n": 1}}, CONTEXT)


def get(url):
    return get_registry().get("http_get").run({"url": url}, CONTEXT)


def under_time_limit(seconds, call, url):
    """``call(url)`` stopped after ``seconds`` as runs.runtime.loop stops a tool."""
    with time_limit(seconds, "the tool"):
        return call(url)


def as_the_loop_runs(call, url):
    """``call(url)`` under the tool's own ``time_limit()``."""
    name = "post_webhook" if call is post else "http_get"
    return under_time_limit(get_registry().get(name).time_limit(), call, url)


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


@pytest.mark.django_db(transaction=True)
def test_a_webhook_that_answers_a_redirect_got_the_post_which_is_recorded_as_executed(
    http_server,
):
    agent_run = enqueue(  # executed in the caller: no Redis
        scripted(
            call("post_webhook", url=http_server.url("/redirect-in"), payload={"n": 1}),
            answer(),
            tools=["post_webhook"],
        )
    )
    assert fresh(agent_run).status == "completed"
    step = agent_run.steps.get(kind="tool")
    assert step.error == ""
    assert (step.result["status"], step.result["redirect_not_followed"]) == (302, "/ok")
    assert [request.path for request in http_server.received] == ["/redirect-in"]


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


def test_a_post_to_a_name_resolving_slowly_fails_on_its_own_within_the_tools_time_limit(
    dns, settings
):
    # Resolving takes longer than the I/O timeout; the tool's time limit
    # leaves room for it, so the failure is the lookup's, not the alarm's.
    settings.NRLLM_HTTP_TIMEOUT_SECONDS = 1
    settings.NRLLM_HTTP_ALLOWED_HOSTS = ["slow.test"]
    dns.add("slow.test", delay=1.5)
    with pytest.raises(ToolError, match="slow.test does not resolve") as raised:
        as_the_loop_runs(post, "http://slow.test/hook")
    assert not isinstance(raised.value, ToolTimeout)


@pytest.fixture
def unanswered_port():
    """A port whose SYNs are dropped, as behind a firewall: its listener's
    accept queue is full and never accepted from."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(listener.getsockname())
        fillers.append(filler)
    time.sleep(0.2)
    yield listener.getsockname()[1]
    for filler in fillers:
        filler.close()
    listener.close()


def test_a_post_to_an_address_that_never_answers_fails_at_its_connect_timeout_not_the_limit(
    settings, unanswered_port
):
    settings.NRLLM_HTTP_TIMEOUT_SECONDS = 1
    settings.NRLLM_HTTP_ALLOWED_HOSTS = [f"127.0.0.1:{unanswered_port}"]
    url = f"http://127.0.0.1:{unanswered_port}/hook"
    with pytest.raises(ToolError, match=f"POST {url} timed out after 1s") as raised:
        as_the_loop_runs(post, url)
    assert not isinstance(raised.value, ToolTimeout)


@pytest.mark.parametrize("call", [post, get])
def test_a_call_stopped_at_its_time_limit_before_connecting_is_a_tool_error_not_a_timeout(
    dns, settings, call
):
    settings.NRLLM_HTTP_ALLOWED_HOSTS = ["slow.test"]
    dns.add("slow.test", ["127.0.0.1"], delay=2)
    with pytest.raises(ToolError, match="stopped at its time limit") as raised:
        under_time_limit(0.3, call, "http://slow.test/hook")
    assert not isinstance(raised.value, ToolTimeout)
    if call is post:
        assert "before it connected: nothing was sent" in str(raised.value)


def test_a_post_stopped_at_its_time_limit_after_connecting_is_an_unknown_outcome(http_server):
    with pytest.raises(ToolOutcomeUnknown, match="stopped at its time limit after connecting"):
        under_time_limit(0.5, post, http_server.url("/slow"))
    assert [request.path for request in http_server.posts()] == ["/slow"]


@pytest.mark.parametrize(
    "charset", ["hex", "rot13", "base64", "uu", "zlib", "idna", "undefined", "unicode_escape"]
)
def test_a_webhook_that_answered_in_full_is_answered_whatever_charset_it_names(
    http_server, charset
):
    result = post(http_server.url(f"/charset/{charset}"))
    assert (result["status"], result["body"], result["truncated"]) == (200, "ok", False)


@pytest.mark.parametrize(("call", "failure"), [(get, ToolError), (post, ToolOutcomeUnknown)])
def test_an_answer_trickled_past_the_exchange_deadline_is_stopped_there(
    http_server, settings, call, failure
):
    # Called outside any time limit, as in a web thread: only the exchange's
    # deadline bounds it, each byte arriving well within the read timeout.
    settings.NRLLM_HTTP_TIMEOUT_SECONDS = 1
    started = time.monotonic()
    with pytest.raises(failure, match="did not complete within its deadline of 3s"):
        call(http_server.url("/trickle"))
    assert exchange_seconds() <= time.monotonic() - started < exchange_seconds() + 1
