"""The builtin tools do real work; the HTTP ones only reach allowed hosts."""

import json
import uuid

import pytest

from tools.contract import ToolContext, ToolError, idempotency_key_for
from tools.models import Note, OutboxNotification
from tools.registry import get_registry

pytestmark = pytest.mark.django_db


def context(key="k" * 64):
    return ToolContext(run_id=str(uuid.uuid4()), idempotency_key=key, attempt=1)


def tool(name):
    return get_registry().get(name)


def test_notes_are_read_searched_and_upserted():
    assert tool("upsert_note").run({"slug": "a", "body": "first"}, context()) == {
        "slug": "a",
        "created": True,
    }
    # Idempotent: the same call again leaves the same state.
    tool("upsert_note").run({"slug": "a", "body": "first"}, context())
    assert Note.objects.get(slug="a").body == "first"
    assert tool("read_note").run({"slug": "a"}, context()) == {"slug": "a", "body": "first"}
    assert tool("search_notes").run({"query": "FIRST"}, context())["matches"] == [
        {"slug": "a", "excerpt": "first"}
    ]
    with pytest.raises(ToolError, match="no note with slug 'missing'"):
        tool("read_note").run({"slug": "missing"}, context())


def test_send_notification_appends_a_row_per_call_with_run_and_key():
    ctx = context("a" * 64)
    tool("send_notification").run({"recipient": "r", "message": "m"}, ctx)
    tool("send_notification").run({"recipient": "r", "message": "m"}, ctx)
    rows = OutboxNotification.objects.all()
    assert len(rows) == 2
    assert {(str(row.run_id), row.idempotency_key) for row in rows} == {(ctx.run_id, "a" * 64)}


def test_idempotency_key_identifies_the_call():
    base = idempotency_key_for("run-1", "1.0", "post_webhook", {"a": 1, "b": 2})
    assert base == idempotency_key_for("run-1", "1.0", "post_webhook", {"b": 2, "a": 1})
    assert (
        len(
            {
                base,
                idempotency_key_for("run-2", "1.0", "post_webhook", {"a": 1, "b": 2}),
                idempotency_key_for("run-1", "2.0", "post_webhook", {"a": 1, "b": 2}),
                idempotency_key_for("run-1", "1.0", "http_get", {"a": 1, "b": 2}),
                idempotency_key_for("run-1", "1.0", "post_webhook", {"a": 1, "b": 3}),
            }
        )
        == 5
    )


def test_http_get_reaches_an_allowed_host(http_server):
    result = tool("http_get").run({"url": http_server.url("/ok")}, context())
    assert result["status"] == 200 and json.loads(result["body"]) == {"path": "/ok"}


@pytest.mark.parametrize(
    "url",
    [
        "http://blocked.invalid/",
        "http://127.0.0.2:9/",
        "file:///etc/passwd",
        "ftp://x/",
        "http:///x",
    ],
)
def test_http_tools_refuse_hosts_not_allowed(http_server, url):
    for name, arguments in [
        ("http_get", {"url": url}),
        ("post_webhook", {"url": url, "payload": 1}),
    ]:
        with pytest.raises(ToolError, match="refused"):
            tool(name).run(arguments, context())
    assert http_server.received == []


def test_http_get_follows_a_redirect_within_allowed_hosts(http_server):
    result = tool("http_get").run({"url": http_server.url("/redirect-in")}, context())
    assert json.loads(result["body"]) == {"path": "/ok"}


def test_http_get_refuses_a_redirect_to_another_host(http_server):
    with pytest.raises(ToolError, match="'blocked.invalid' is not in NRLLM_HTTP_ALLOWED_HOSTS"):
        tool("http_get").run({"url": http_server.url("/redirect-out")}, context())


def test_http_tools_time_out(http_server, settings):
    settings.NRLLM_HTTP_TIMEOUT_SECONDS = 1
    with pytest.raises(ToolError, match="timed out after 1s"):
        tool("http_get").run({"url": http_server.url("/slow")}, context())


def test_post_webhook_sends_json_once_with_the_idempotency_key(http_server):
    ctx = context("f" * 64)
    result = tool("post_webhook").run(
        {"url": http_server.url("/hook"), "payload": {"event": "deployed"}}, ctx
    )
    assert result["status"] == 200
    [received] = http_server.posts()
    assert json.loads(received.body) == {"event": "deployed"}
    assert received.headers["Idempotency-Key"] == "f" * 64


@pytest.mark.parametrize(
    ("path", "location"), [("/redirect-in", "/ok"), ("/redirect-out", "http://blocked.invalid/x")]
)
def test_post_webhook_takes_a_redirect_as_delivered_and_never_follows_it(
    http_server, path, location
):
    # The receiver got the POST: a result with the status, not a ToolError
    # that would tell the model nothing was sent.
    result = tool("post_webhook").run({"url": http_server.url(path), "payload": {}}, context())
    assert (result["status"], result["redirect_not_followed"]) == (302, location)
    assert result["url"] == http_server.url(path)
    assert [request.path for request in http_server.received] == [path]
