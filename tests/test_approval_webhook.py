"""G14's webhook: ``NRLLM_APPROVAL_WEBHOOK_URL`` is posted once per park,
through the tools' SSRF guard, to a real local HTTP server. Best effort: a
refused, failing, hanging, redirecting or flooding receiver never changes
the run, and neither its secret nor a token in its URL is ever logged."""

import hashlib
import hmac
import json
import logging
import time

import pytest
from django.utils.dateparse import parse_datetime

from runs.approvals import actions as approval_actions
from runs.models import ApprovalRequest
from runs.models.vocabulary import ApprovalStatus, RunStatus
from runs.runtime import enqueue
from tests.approval_requests import waiting
from tests.drifting_model import NOTIFY, request_for
from tests.helpers import fresh, manage, sqlite_env
from tools.builtin.http import guarded_get
from tools.contract import ToolError
from tools.models import OutboxNotification

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals")]

TOOLS = ["search_notes", "send_notification"]
NOTIFY_OPS = {"name": "send_notification", "arguments": {"recipient": "ops", "message": "v2"}}
#: A turn of two notifications, then a turn of one: two parks.
PLAN = [{"calls": [NOTIFY, NOTIFY_OPS]}, {"calls": [NOTIFY]}, {"answer": "told everyone"}]
ONE_CALL = [{"calls": [NOTIFY]}, {"answer": "sent"}]
SECRET = "webhook-secret"


def pending(agent_run) -> list[ApprovalRequest]:
    return list(
        ApprovalRequest.objects.filter(run=agent_run, status=ApprovalStatus.PENDING).order_by(
            "position"
        )
    )


def approve_all(agent_run, operator) -> None:
    for request in pending(agent_run):
        assert approval_actions.approve(request, operator, digest=request.digest).ok


def webhook_log(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "runs.approvals.webhook"]


def webhook_at(settings, url: str, secret: str = "") -> None:
    settings.NRLLM_APPROVAL_WEBHOOK_URL = url
    settings.NRLLM_APPROVAL_WEBHOOK_SECRET = secret


def test_each_park_posts_its_calls_once_signed(settings, http_server, operator):
    webhook_at(settings, http_server.url("/hook"), SECRET)
    request = {**request_for("scripted", PLAN, TOOLS), "prompt": "announce v2 " + "x" * 400}

    agent_run = enqueue(request)

    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    (post,) = http_server.posts()
    assert post.path == "/hook"
    headers = {name.lower(): value for name, value in post.headers.items()}
    assert headers["content-type"] == "application/json"
    assert headers["x-nrllm-event"] == "approval_requested"
    expected = "sha256=" + hmac.new(SECRET.encode(), post.body, hashlib.sha256).hexdigest()
    assert headers["x-nrllm-signature-256"] == expected
    event = json.loads(post.body)
    assert event["event"] == "approval_requested"
    assert event["run"]["id"] == str(agent_run.pk)
    assert event["run"]["prompt"].startswith("announce v2 xxx")
    assert len(event["run"]["prompt"]) == 200 and event["run"]["prompt"].endswith("…")
    assert event["run"]["admin_path"] == f"/admin/runs/agentrun/{agent_run.pk}/change/"
    assert str(agent_run.pk) in event["inbox_path"]
    requests = pending(agent_run)
    assert [
        (call["id"], call["tool"], call["effect"], call["position"], call["digest"])
        for call in event["approvals"]
    ] == [
        (r.pk, "send_notification", "non_idempotent_write", r.position, r.digest) for r in requests
    ]
    assert [parse_datetime(call["expires_at"]) for call in event["approvals"]] == [
        r.expires_at for r in requests
    ]
    assert "arguments" not in event["approvals"][0]  # the inbox and the API show them

    approve_all(agent_run, operator)  # the run resumes and parks at its second turn

    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    first, second = http_server.posts()
    (call,) = json.loads(second.body)["approvals"]
    assert (call["position"], call["id"]) == ("2.0", pending(agent_run)[0].pk)
    approve_all(agent_run, operator)
    assert fresh(agent_run).status == RunStatus.COMPLETED
    assert len(http_server.posts()) == 2  # a release, a decision, the end: no POST
    assert OutboxNotification.objects.count() == 3


def test_without_a_secret_the_post_is_unsigned(settings, http_server):
    webhook_at(settings, http_server.url("/hook"))

    enqueue(request_for("scripted", ONE_CALL, TOOLS))

    (post,) = http_server.posts()
    assert "x-nrllm-signature-256" not in {name.lower() for name in post.headers}


def test_without_a_url_nothing_is_tried(settings, http_server, caplog):
    webhook_at(settings, "")

    with caplog.at_level(logging.DEBUG, logger="runs.approvals.webhook"):
        agent_run = enqueue(request_for("scripted", ONE_CALL, TOOLS))

    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    assert http_server.received == []
    assert webhook_log(caplog) == []


def test_a_url_resolving_to_a_private_address_not_allowed_is_refused_and_the_run_waits(
    settings, http_server, dns, caplog
):
    dns.add("hooks.test", ["127.0.0.1"])
    settings.NRLLM_HTTP_ALLOWED_HOSTS = []
    webhook_at(settings, http_server.url("/hook", host="hooks.test"))

    with caplog.at_level(logging.WARNING, logger="runs.approvals.webhook"):
        agent_run = enqueue(request_for("scripted", ONE_CALL, TOOLS))

    assert http_server.received == []
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    assert len(pending(agent_run)) == 1
    (message,) = webhook_log(caplog)
    assert "resolves to 127.0.0.1, a loopback address" in message


def test_the_webhook_host_needs_no_entry_and_stays_closed_to_the_tools(settings, http_server, dns):
    """The operator's URL is allowed by being set; a private address it
    resolves to must still be allowed literally. Listing it for the webhook
    opens nothing to an agent's HTTP tools."""
    dns.add("hooks.test", ["127.0.0.1"])
    settings.NRLLM_HTTP_ALLOWED_HOSTS = [http_server.host]  # the address, not the name
    webhook_at(settings, http_server.url("/hook", host="hooks.test"))

    enqueue(request_for("scripted", ONE_CALL, TOOLS))

    (post,) = http_server.posts()
    assert {name.lower(): value for name, value in post.headers.items()}["host"] == (
        f"hooks.test:{http_server.port}"
    )
    with pytest.raises(ToolError, match="host 'hooks.test' is not in NRLLM_HTTP_ALLOWED_HOSTS"):
        guarded_get(http_server.url("/hook", host="hooks.test"))
    assert len(http_server.received) == 1


def test_a_receiver_answering_500_does_not_change_the_run(settings, http_server, operator, caplog):
    webhook_at(settings, http_server.url("/status/500"))

    with caplog.at_level(logging.WARNING, logger="runs.approvals.webhook"):
        agent_run = enqueue(request_for("scripted", ONE_CALL, TOOLS))

    assert len(http_server.posts()) == 1
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    assert "answered 500" in webhook_log(caplog)[0]
    approve_all(agent_run, operator)
    assert fresh(agent_run).status == RunStatus.COMPLETED
    assert OutboxNotification.objects.count() == 1


@pytest.mark.parametrize("path", ["/hold", "/trickle"])
def test_a_receiver_that_hangs_or_trickles_is_cut_at_the_timeout_and_the_run_still_waits(
    settings, http_server, caplog, path
):
    """``/hold`` never answers; ``/trickle`` answers a byte every 0.2 s for
    10 s, each read within any read timeout: only the deadline ends it."""
    settings.NRLLM_APPROVAL_WEBHOOK_TIMEOUT_SECONDS = 1
    webhook_at(settings, http_server.url(path))
    started = time.monotonic()

    with caplog.at_level(logging.WARNING, logger="runs.approvals.webhook"):
        agent_run = enqueue(request_for("scripted", ONE_CALL, TOOLS))

    assert time.monotonic() - started < 5
    assert len(http_server.posts()) == 1  # it arrived; the whole answer never did
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    assert len(pending(agent_run)) == 1
    assert "not delivered" in webhook_log(caplog)[0]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("ftp://hooks.example.org/x", "must be an http or https URL"),
        ("hooks.example.org/x", "must be an http or https URL"),
        ("https://", "has no host"),
        ("https://hooks.example.org:99999/", "port 99999 is not a TCP port"),
        ("https://user:pw@hooks.example.org/", "must not hold a user name or password"),
        ("https://hooks example.org/", "must not contain spaces"),
    ],
)
def test_a_malformed_webhook_url_stops_start_up_naming_it(tmp_path, value, message):
    env = sqlite_env(tmp_path / "db.sqlite3", NRLLM_APPROVAL_WEBHOOK_URL=value)

    result = manage("check", env=env)

    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr
    if "@" in value:  # the URL holds a password: it is named, never shown
        assert "NRLLM_APPROVAL_WEBHOOK_URL must not" in result.stderr
        assert "pw@" not in result.stderr
    else:
        assert f"NRLLM_APPROVAL_WEBHOOK_URL={value!r}" in result.stderr


# --- at its edges: a redirect, a huge answer, secrets in the log ----------------


def test_the_webhook_follows_no_redirect(settings, http_server):
    settings.NRLLM_APPROVAL_WEBHOOK_URL = http_server.url("/redirect-to//hook")
    settings.NRLLM_APPROVAL_WEBHOOK_SECRET = ""
    agent_run, _ = waiting(plan=ONE_CALL)
    assert [post.path for post in http_server.posts()] == ["/redirect-to//hook"]
    assert [r.path for r in http_server.received if r.path == "/hook"] == []
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL


def test_a_huge_webhook_answer_is_cut_and_the_run_waits(settings, http_server):
    settings.NRLLM_APPROVAL_WEBHOOK_URL = http_server.url("/huge")
    settings.NRLLM_APPROVAL_WEBHOOK_SECRET = ""
    agent_run, _ = waiting(plan=ONE_CALL)
    assert http_server.body_bytes_sent < 64 * 1024 * 1024
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL


def test_the_webhook_secret_is_never_logged(settings, http_server, caplog):
    secret = "s3cr3t-signing-key"
    settings.NRLLM_APPROVAL_WEBHOOK_URL = http_server.url("/status/500")
    settings.NRLLM_APPROVAL_WEBHOOK_SECRET = secret
    with caplog.at_level(logging.DEBUG):
        waiting(plan=ONE_CALL)
    assert all(secret not in record.getMessage() for record in caplog.records)


def test_a_webhook_token_in_the_url_is_not_logged_when_refused(settings, http_server, dns, caplog):
    """Hook URLs commonly carry their credential in the path or query
    (``/services/T0/B0/<token>``, ``?token=``); userinfo is refused at
    start-up because it would be logged, but a token in the query is
    logged whole by a refusal."""
    dns.add("hooks.test", ["10.1.2.3"])
    settings.NRLLM_HTTP_ALLOWED_HOSTS = []
    settings.NRLLM_APPROVAL_WEBHOOK_URL = "https://hooks.test/hook?token=tok-SECRET-123"
    with caplog.at_level(logging.DEBUG):
        agent_run, _ = waiting(plan=ONE_CALL)
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    assert webhook_log(caplog), "the refusal is logged"
    assert all("tok-SECRET-123" not in message for message in webhook_log(caplog))
    assert "'https://hooks.test/…': hooks.test resolves to 10.1.2.3" in webhook_log(caplog)[0]
