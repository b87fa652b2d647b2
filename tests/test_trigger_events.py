"""Signed events from other systems (G23), POSTed to a trigger's URL as
a sender sends them: an Alertmanager group re-sent, as Alertmanager does
at each ``repeat_interval``, each time with a new Standard Webhooks message
id and timestamp, starts one run (its event id is read from the body);
two deliveries racing start one; GitHub's signature and delivery id work
the same way. A bad or stale signature, a body lacking what the template
names, a trigger past its rate: refused, and nothing stored. The run is
the trigger owner's, who under four-eyes may not approve its write."""

import hashlib
import hmac
import json
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient
from standardwebhooks.webhooks import Webhook

from agents.versions import save_agent
from runs.models import AgentRun, ApprovalRequest
from runs.models.vocabulary import RunStatus
from tests.approval_requests import PLAN, TOOLS, decide
from tests.drifting_model import request_for
from tests.helpers import inserts_held, wait_until
from triggers.models import EventTrigger, TriggerEvent

pytestmark = pytest.mark.django_db(transaction=True)

#: What Alertmanager POSTs to a webhook receiver (its webhook_config).
ALERT_GROUP = {
    "version": "4",
    "groupKey": '{}:{alertname="HighLatency"}',
    "truncatedAlerts": 0,
    "status": "firing",
    "receiver": "nrllm-ops",
    "groupLabels": {"alertname": "HighLatency"},
    "commonLabels": {"alertname": "HighLatency", "service": "checkout"},
    "commonAnnotations": {"summary": "p99 latency above 2 s"},
    "externalURL": "http://alertmanager.example:9093",
    "alerts": [
        {
            "status": "firing",
            "labels": {"alertname": "HighLatency", "service": "checkout", "instance": "api-1"},
            "annotations": {"summary": "p99 latency above 2 s"},
            "startsAt": "2026-12-04T13:00:00.000Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus.example:9090/graph?g0.expr=latency",
            "fingerprint": "3f1c2a9e0b7d4c11",
        }
    ],
}
INPUT = "Alert ${commonLabels.alertname} (${status}) on ${alerts.0.labels.instance}: look into it"


@pytest.fixture
def owner(two_teams, member, api_token):
    """Olga, every role in Alpha, whose agent waits for the approval of its
    notification; her API client."""
    alpha, _ = two_teams
    olga = member("olga", alpha)
    definition = {"provider": request_for("scripted", PLAN, TOOLS)["provider"], "tools": TOOLS}
    save_agent("on-call", definition, user=olga, create=True, team=alpha)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=api_token(olga))
    return {"user": olga, "api": client}


def create_trigger(owner, **fields) -> dict:
    """A trigger made through the API, with the secret its creation shows once."""
    body = {"name": "alerts", "agent": "on-call", "input_template": INPUT, **fields}
    created = owner["api"].post("/api/triggers/", body, format="json")
    assert created.status_code == 201, created.content
    return created.json()


def standard_webhooks_post(trigger, body: bytes, *, at=None, message_id=None, secret=None):
    """POST ``body`` as a Standard Webhooks sender: each send a message id
    and a timestamp of its own, signed over both and the body."""
    at = at or datetime.now(UTC)
    message_id = message_id or f"msg_{uuid.uuid4().hex}"
    signature = Webhook(secret or trigger["secret"]).sign(message_id, at, body)
    return Client().post(
        trigger["url"].removeprefix("http://testserver"),
        body,
        content_type="application/json",
        headers={
            "webhook-id": message_id,
            "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": signature,
        },
    )


def nothing_stored() -> bool:
    return TriggerEvent.objects.count() == 0 and AgentRun.objects.count() == 0


def test_an_alert_group_sent_three_times_starts_one_run_submitted_by_the_owner(owner):
    trigger = create_trigger(owner, event_id_template="${groupKey}/${alerts.0.startsAt}")
    body = json.dumps(ALERT_GROUP).encode()

    first, *repeats = [standard_webhooks_post(trigger, body) for _ in range(3)]

    assert first.status_code == 202, first.content
    event_id = '{}:{alertname="HighLatency"}/2026-12-04T13:00:00.000Z'
    assert first.json() == {"run": first.json()["run"], "event_id": event_id, "duplicate": False}
    assert [(each.status_code, each.json()["run"]) for each in repeats] == [
        (200, first.json()["run"])
    ] * 2
    assert all(each.json()["duplicate"] for each in repeats)
    (run,) = AgentRun.objects.all()
    assert (run.submitted_by, run.submitted_via) == (owner["user"], "trigger")
    assert run.prompt.startswith("Alert HighLatency (firing) on api-1: look into it")
    shown = owner["api"].get(f"/api/runs/{run.pk}/").json()
    assert shown["fired_by"] == {
        "trigger": trigger["id"],
        "trigger_name": "alerts",
        "event_id": event_id,
    }
    detail = owner["api"].get(f"/api/triggers/{trigger['id']}/").json()
    assert [(each["event_id"], each["run"]) for each in detail["last_events"]] == [
        (event_id, str(run.pk))
    ]
    assert "secret" not in detail


def test_two_identical_deliveries_racing_start_one_run(owner):
    """Both are held at the insert of their event's row, each having found
    no such event yet; let go together, the unique (trigger, event id) lets
    one insert it and start the run, and the other answers with its run."""
    trigger = create_trigger(owner)
    body = json.dumps(ALERT_GROUP).encode()
    at = datetime.now(UTC)
    answers = []

    def deliver():
        try:
            answers.append(standard_webhooks_post(trigger, body, at=at, message_id="msg_same"))
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver) for _ in range(2)]
    with inserts_held(TriggerEvent, "true") as (waiting, _):
        for thread in threads:
            thread.start()
        wait_until(lambda: len(waiting()) == 2, what="both deliveries at the insert")
    for thread in threads:
        thread.join(timeout=60)

    assert sorted(each.status_code for each in answers) == [200, 202]
    assert len({each.json()["run"] for each in answers}) == 1
    assert (AgentRun.objects.count(), TriggerEvent.objects.count()) == (1, 1)


def test_a_bad_or_stale_signature_or_a_body_it_cannot_read_is_refused_storing_nothing(owner):
    trigger = create_trigger(
        owner, input_template="Severity ${alerts.0.labels.severity}: ${status}"
    )
    body = json.dumps(ALERT_GROUP).encode()
    other_secret = EventTrigger._meta.get_field("secret").default()

    forged = standard_webhooks_post(trigger, body, secret=other_secret)
    stale = standard_webhooks_post(trigger, body, at=datetime.now(UTC) - timedelta(minutes=10))
    unsigned = Client().post(
        trigger["url"].removeprefix("http://testserver"), body, content_type="application/json"
    )
    lacking = standard_webhooks_post(trigger, body)
    nested = standard_webhooks_post(trigger, b"[" * 100_000)

    for refused in (forged, stale, unsigned):
        assert (refused.status_code, refused.json()["code"]) == (401, "not_authenticated")
    assert lacking.status_code == 400
    assert lacking.json()["detail"].startswith("body.alerts.0.labels.severity: ")
    assert (nested.status_code, nested.json()["code"]) == (400, "invalid")
    assert nothing_stored()


def test_github_signs_the_body_and_a_repeated_delivery_id_is_dropped(owner):
    trigger = create_trigger(
        owner,
        scheme="github",
        secret="it's a secret to everybody",
        event_id_header="X-GitHub-Delivery",
        input_template="Issue ${issue.number} ${action}: ${issue.title}",
    )
    assert trigger["secret"] == "it's a secret to everybody"
    body = json.dumps(
        {"action": "opened", "issue": {"number": 1347, "title": "Checkout is slow"}}
    ).encode()
    signature = "sha256=" + hmac.new(trigger["secret"].encode(), body, hashlib.sha256).hexdigest()

    def deliver(delivery: str, signed: str = signature):
        return Client().post(
            trigger["url"].removeprefix("http://testserver"),
            body,
            content_type="application/json",
            headers={
                "X-GitHub-Event": "issues",
                "X-GitHub-Delivery": delivery,
                "X-Hub-Signature-256": signed,
            },
        )

    forged = deliver("72d3162e-cc78-11e3-81ab-4c9367dc0958", "sha256=" + "0" * 64)
    assert forged.status_code == 401 and nothing_stored()
    first = deliver("72d3162e-cc78-11e3-81ab-4c9367dc0958")
    redelivered = deliver("72d3162e-cc78-11e3-81ab-4c9367dc0958")
    another = deliver("9b2c6e5a-cc78-11e3-8f1d-4c9367dc0958")

    assert [first.status_code, redelivered.status_code, another.status_code] == [202, 200, 202]
    assert redelivered.json()["run"] == first.json()["run"] != another.json()["run"]
    assert AgentRun.objects.get(pk=first.json()["run"]).prompt.startswith(
        "Issue 1347 opened: Checkout is slow"
    )


def test_past_its_rate_an_event_is_a_429_with_retry_after_and_stores_nothing(owner):
    trigger = create_trigger(owner, max_events_per_minute=2)
    body = json.dumps(ALERT_GROUP).encode()

    answers = [standard_webhooks_post(trigger, body) for _ in range(3)]

    assert [each.status_code for each in answers] == [202, 202, 429]
    assert answers[2]["Retry-After"] == "60"
    assert answers[2].json()["code"] == "throttled"
    assert (AgentRun.objects.count(), TriggerEvent.objects.count()) == (2, 2)


def test_under_four_eyes_the_owner_may_not_approve_their_triggers_write(
    owner, approvals, settings, member, api_token, two_teams
):
    settings.NRLLM_APPROVAL_SECOND_PERSON = True
    trigger = create_trigger(owner)

    sent = standard_webhooks_post(trigger, json.dumps(ALERT_GROUP).encode())

    assert sent.status_code == 202, sent.content
    run = AgentRun.objects.get(pk=sent.json()["run"])
    assert (run.status, run.submitted_by) == (RunStatus.WAITING_FOR_APPROVAL, owner["user"])
    (waiting,) = ApprovalRequest.objects.filter(run=run)
    own = decide(owner["api"], waiting)
    assert (own.status_code, own.json()["code"]) == (403, "second_person_required")
    colleague = APIClient()
    colleague.credentials(HTTP_AUTHORIZATION=api_token(member("ada", two_teams[0])))
    assert decide(colleague, waiting).status_code == 200
