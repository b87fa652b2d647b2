"""G14's metrics, scraped from /metrics as Prometheus would: approvals
pending (a gauge read from the database), decisions by outcome, the time to
a decision, and the webhook's deliveries. Counters are the process's own,
so each test compares a scrape after with one before."""

from datetime import timedelta

import pytest
from django.db.models import F
from django.test import Client

from runs import transitions
from runs.approvals import actions as approval_actions
from runs.models import ApprovalRequest
from runs.models.vocabulary import ApprovalStatus, RunStatus
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from tests.drifting_model import NOTIFY, request_for
from tests.helpers import fresh, later

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals")]

TOOLS = ["send_notification"]
NOTIFY_OPS = {"name": "send_notification", "arguments": {"recipient": "ops", "message": "v2"}}
TWO_CALLS = [{"calls": [NOTIFY, NOTIFY_OPS]}, {"answer": "sent"}]
ONE_CALL = [{"calls": [NOTIFY]}, {"answer": "sent"}]


@pytest.fixture
def scrape(settings):
    """``scrape()`` → every sample /metrics shows now: {"name{labels}": value}."""
    settings.NRLLM_METRICS_TOKEN = "scrape-token"

    def scrape() -> dict[str, float]:
        response = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token")
        assert response.status_code == 200
        lines = [line for line in response.content.decode().splitlines() if line[:1] != "#"]
        return {name: float(value) for name, value in (line.rsplit(" ", 1) for line in lines)}

    return scrape


def pending(agent_run) -> list[ApprovalRequest]:
    return list(
        ApprovalRequest.objects.filter(run=agent_run, status=ApprovalStatus.PENDING).order_by(
            "position"
        )
    )


def grown(before: dict, after: dict, name: str) -> float:
    return after.get(name, 0) - before.get(name, 0)


def test_the_gauge_counts_pending_requests(scrape, operator):
    assert scrape()["nrllm_approvals_pending"] == 0
    agent_run = enqueue(request_for("scripted", TWO_CALLS, TOOLS))
    enqueue(request_for("scripted", ONE_CALL, TOOLS))
    assert scrape()["nrllm_approvals_pending"] == 3

    first, second = pending(agent_run)
    assert approval_actions.deny(first, operator, digest=first.digest).ok
    assert scrape()["nrllm_approvals_pending"] == 2
    assert approval_actions.approve(second, operator, digest=second.digest).ok
    assert fresh(agent_run).status == RunStatus.COMPLETED
    assert scrape()["nrllm_approvals_pending"] == 1


def test_decisions_are_counted_by_outcome(scrape, operator):
    approved = enqueue(request_for("scripted", ONE_CALL, TOOLS))
    denied = enqueue(request_for("scripted", ONE_CALL, TOOLS))
    cancelled = enqueue(request_for("scripted", ONE_CALL, TOOLS))
    expired = enqueue(request_for("scripted", ONE_CALL, TOOLS))
    # Only this one is left to expire: the others are decided or withdrawn first.
    ApprovalRequest.objects.exclude(run=expired).update(expires_at=later(10 * 86400))
    before = scrape()

    (request,) = pending(approved)
    assert approval_actions.approve(request, operator, digest=request.digest).ok
    (request,) = pending(denied)
    assert approval_actions.deny(request, operator, digest=request.digest).ok
    assert transitions.cancel(cancelled.pk) is transitions.CancelOutcome.CANCELLED
    assert list(reap_stale_runs(as_of=later(86400 + 60)).decisions) == [str(expired.pk)]

    after = scrape()
    for outcome in ["approved", "denied", "withdrawn", "expired"]:
        name = f'nrllm_approval_decisions_total{{outcome="{outcome}"}}'
        assert grown(before, after, name) == 1, outcome
    assert after["nrllm_approvals_pending"] == 0


def test_the_time_to_a_decision_is_observed(scrape, operator):
    agent_run = enqueue(request_for("scripted", ONE_CALL, TOOLS))
    # Asked 100 s ago (time moved, not slept): decided between 60 s and 300 s.
    ApprovalRequest.objects.filter(run=agent_run).update(
        requested_at=F("requested_at") - timedelta(seconds=100)
    )
    before = scrape()

    (request,) = pending(agent_run)
    assert approval_actions.approve(request, operator, digest=request.digest).ok

    after = scrape()
    series = "nrllm_approval_decision_seconds"
    assert grown(before, after, f'{series}_count{{outcome="approved"}}') == 1
    assert 100 <= grown(before, after, f'{series}_sum{{outcome="approved"}}') < 160
    assert grown(before, after, f'{series}_bucket{{le="60.0",outcome="approved"}}') == 0
    assert grown(before, after, f'{series}_bucket{{le="300.0",outcome="approved"}}') == 1
    assert grown(before, after, f'{series}_count{{outcome="denied"}}') == 0


def test_requests_and_webhook_deliveries_are_counted(scrape, settings, http_server):
    before = scrape()
    settings.NRLLM_APPROVAL_WEBHOOK_URL = http_server.url("/hook")
    enqueue(request_for("scripted", TWO_CALLS, TOOLS))
    settings.NRLLM_APPROVAL_WEBHOOK_URL = http_server.url("/status/503")
    enqueue(request_for("scripted", ONE_CALL, TOOLS))
    settings.NRLLM_HTTP_ALLOWED_HOSTS = []  # 127.0.0.1 no longer allowed: refused
    enqueue(request_for("scripted", ONE_CALL, TOOLS))

    after = scrape()
    assert grown(before, after, 'nrllm_approval_requests_total{tool="send_notification"}') == 4
    for outcome in ["delivered", "rejected", "failed"]:
        name = f'nrllm_approval_webhooks_total{{outcome="{outcome}"}}'
        assert grown(before, after, name) == 1, outcome
    assert len(http_server.posts()) == 2
