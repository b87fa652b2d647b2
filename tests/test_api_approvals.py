"""G14 through the REST API: approve and deny carry the digest the client
saw. Approved, the call executes once and the run completes; denied, it
never executes and the model is told. Every refusal — the permission,
four-eyes, a stale digest, a database that refuses the record, bad input
— changes nothing. In-process, as ``test_approvals.py``: a run waits right
after ``enqueue``, and the decision that releases it runs it to its end
inline."""

import threading
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.core.cache import cache
from django.db import connection
from django.utils import timezone

from runs.models import AgentRun, ApprovalRequest
from runs.models.faults import step_inserts_refused
from runs.models.vocabulary import RunStatus, StepKind
from tests.approval_requests import (
    PLAN,
    TOOLS,
    client_with,
    decide,
    pending,
    unchanged,
    waiting,
)
from tests.conftest import _user
from tests.drifting_model import request_for
from tests.helpers import fresh
from tools.models import OutboxNotification

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals")]


@pytest.fixture(autouse=True)
def fresh_throttle():
    cache.clear()


@pytest.fixture
def client_of(api_token):
    """``client_of(user)`` → an API client with a token of that user's."""
    return lambda user: client_with(api_token(user))


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_approved_through_the_api_the_write_executes_once_and_the_run_completes(model, api):
    agent_run, request = waiting("scripted" if model is None else "drifting")
    assert api.get(f"/api/runs/{agent_run.pk}/").json()["pending_approvals"] == [request.pk]

    response = decide(api, request, note="checked")

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["code"], body["run_status"]) == ("approved", RunStatus.COMPLETED)
    assert body["approval"]["status"] == "approved"
    assert (body["approval"]["decided_by"], body["approval"]["note"]) == ("olivia", "checked")
    assert fresh(agent_run).status == RunStatus.COMPLETED
    (notification,) = OutboxNotification.objects.all()
    assert notification.idempotency_key == request.idempotency_key
    assert notification.message == request.arguments["message"]
    decision = agent_run.steps.filter(kind=StepKind.APPROVAL).order_by("sequence").last()
    assert (decision.result["action"], decision.result["digest"]) == ("approved", request.digest)
    assert LogEntry.objects.filter(object_id=str(agent_run.pk)).count() == 1
    assert api.get(f"/api/runs/{agent_run.pk}/").json()["pending_approvals"] == []
    again = decide(api, request)
    assert (again.status_code, again.json()["code"]) == (409, "already_decided")
    assert OutboxNotification.objects.count() == 1


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_denied_through_the_api_the_call_never_executes_and_the_model_is_told(
    model, api, fake_openai
):
    agent_run, request = waiting("scripted" if model is None else "drifting")

    response = decide(api, request, "deny", note="not on a Friday")

    assert response.status_code == 200, response.content
    assert (response.json()["code"], response.json()["run_status"]) == ("denied", "completed")
    assert fresh(agent_run).status == RunStatus.COMPLETED
    assert OutboxNotification.objects.count() == 0
    denial = agent_run.steps.get(kind=StepKind.TOOL, tool_name="send_notification")
    assert "denied" in denial.error and "not on a Friday" in denial.error
    if model is not None:
        told = fake_openai.tool_results_told()
        assert any("olivia" in content and "not on a Friday" in content for content in told)


def test_a_stale_digest_is_409_and_changes_nothing(api):
    agent_run, request = waiting()

    for action in ("approve", "deny"):
        response = decide(api, request, action, digest="0" * 64)
        assert response.status_code == 409
        assert response.json()["code"] == "stale_digest", response.json()

    unchanged(agent_run, request)
    assert LogEntry.objects.count() == 0


def test_an_expired_request_is_409_even_before_the_reaper_ends_its_run(api):
    agent_run, request = waiting()
    ApprovalRequest.objects.filter(pk=request.pk).update(
        expires_at=timezone.now() - timedelta(seconds=5)
    )

    response = decide(api, request)

    assert (response.status_code, response.json()["code"]) == (409, "expired")
    assert api.get(f"/api/approvals/{request.pk}/").json()["seconds_left"] == 0
    unchanged(agent_run, request)


@pytest.fixture
def looker(db):
    """Luke, who may look at runs and nothing else."""
    return _user("luke", staff=True, permissions=["runs.view_agentrun"])


@pytest.mark.parametrize("who", ["viewer", "looker", "outsider"])
def test_without_the_permission_a_decision_is_403_and_changes_nothing(request, who, client_of):
    user = request.getfixturevalue(who)
    agent_run, approval = waiting()

    for action in ("approve", "deny"):
        response = decide(client_of(user), approval, action)
        assert response.status_code == 403, response.content
        assert "runs.approve_write" in response.json()["detail"]

    unchanged(agent_run, approval)
    assert LogEntry.objects.count() == 0


def test_four_eyes_the_submitter_is_refused_403_and_another_approver_may(
    settings, api, approver, client_of
):
    settings.NRLLM_APPROVAL_SECOND_PERSON = True
    created = api.post("/api/runs/", request_for("scripted", PLAN, TOOLS), format="json").json()
    agent_run = AgentRun.objects.get(pk=created["id"])
    (request,) = pending(agent_run)

    own = decide(api, request)

    assert (own.status_code, own.json()["code"]) == (403, "second_person_required")
    unchanged(agent_run, request)
    other = decide(client_of(approver), request)
    assert other.status_code == 200, other.content
    assert (other.json()["approval"]["decided_by"], other.json()["approval"]["by_submitter"]) == (
        "ada",
        False,
    )
    assert OutboxNotification.objects.count() == 1


def test_four_eyes_the_submitter_may_deny_and_the_record_says_it_was_theirs(settings, api):
    settings.NRLLM_APPROVAL_SECOND_PERSON = True
    created = api.post("/api/runs/", request_for("scripted", PLAN, TOOLS), format="json").json()
    (request,) = pending(created["id"])

    response = decide(api, request, "deny")

    assert response.status_code == 200, response.content
    assert response.json()["approval"]["by_submitter"] is True
    assert OutboxNotification.objects.count() == 0


def test_a_decision_the_database_refuses_is_503_and_the_run_still_waits(api):
    agent_run, request = waiting()

    with step_inserts_refused(kind=StepKind.APPROVAL):
        response = decide(api, request)

    assert (response.status_code, response.json()["code"]) == (503, "database_unavailable")
    unchanged(agent_run, request)
    assert LogEntry.objects.count() == 0
    assert decide(api, request).status_code == 200
    assert OutboxNotification.objects.count() == 1


def test_cancelled_through_the_api_a_waiting_run_ends_and_its_request_is_withdrawn(api):
    agent_run, request = waiting()

    response = api.post(f"/api/runs/{agent_run.pk}/cancel/", {"note": "not now"}, format="json")

    assert response.status_code == 202, response.content
    assert fresh(agent_run).status == RunStatus.CANCELLED
    shown = api.get(f"/api/approvals/{request.pk}/").json()
    assert (shown["status"], shown["run_status"], shown["seconds_left"]) == (
        "withdrawn",
        "cancelled",
        None,
    )
    late = decide(api, request)
    assert (late.status_code, late.json()["code"]) == (409, "already_decided")
    assert "withdrawn" in late.json()["detail"]
    assert OutboxNotification.objects.count() == 0


def test_two_approvers_at_once_one_wins_and_the_write_executes_once(operator, approver, api_token):
    agent_run, request = waiting()
    headers = {"olivia": api_token(operator), "ada": api_token(approver)}
    barrier = threading.Barrier(len(headers))
    answers = {}

    def approve(name):
        try:
            client = client_with(headers[name])
            barrier.wait(timeout=10)
            response = decide(client, request, note=f"by {name}")
            answers[name] = (response.status_code, response.json()["code"])
        finally:
            connection.close()

    threads = [threading.Thread(target=approve, args=(name,)) for name in headers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert sorted(answers.values()) == [(200, "approved"), (409, "already_decided")], answers
    (winner,) = [name for name, (status, _) in answers.items() if status == 200]
    request.refresh_from_db()
    assert (request.decided_by.username, request.note) == (winner, f"by {winner}")
    assert OutboxNotification.objects.count() == 1
    assert fresh(agent_run).status == RunStatus.COMPLETED
    decisions = agent_run.steps.filter(kind=StepKind.APPROVAL, result__action="approved")
    assert decisions.count() == 1


MALFORMED_IDS = [
    "not-a-number",
    "%00",
    "x" * 300,
    "99999999999999999999",
    "9223372036854775808",
    "0",
    "-1",
    "1.5",
    "+1",
    "1_0",
    "%EF%BC%91",  # a fullwidth 1, which int() would take
    "a%2Fb",
    "'",
]


def test_a_malformed_or_unknown_id_is_a_404_that_says_why(api):
    agent_run, request = waiting()
    api.raise_request_exception = False
    for bad in [*MALFORMED_IDS, str(request.pk + 1000)]:
        for method, route in [
            ("get", "/api/approvals/{}/"),
            ("post", "/api/approvals/{}/approve/"),
            ("post", "/api/approvals/{}/deny/"),
        ]:
            response = getattr(api, method)(
                route.format(bad), {"digest": request.digest}, format="json"
            )
            assert response.status_code == 404, (method, route, bad, response.status_code)
            assert response.json()["code"] == "not_found", (method, route, bad)
    detail = api.get("/api/approvals/abc/").json()["detail"]
    assert "'abc' is not an approval request id" in detail
    assert api.get(f"/api/approvals/{request.pk + 1000}/").json()["detail"] == (
        f"no approval request {request.pk + 1000}"
    )
    unchanged(agent_run, request)


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b"null",
        b'"approve"',
        b"{not json",
        b"{}",
        b'{"note": "ok"}',
        b'{"digest": null}',
        b'{"digest": 5}',
        b'{"digest": "abc"}',
        b'{"digest": "' + b"g" * 64 + b'"}',
        b'{"digest": "' + b"A" * 64 + b'"}',
        b'{"digest": "' + b"a" * 65 + b'"}',
        b'{"digest": " "}',
        b'{"digest": "' + b"a" * 64 + b'\\u0000"}',
        b'{"digest": "DIGEST", "note": 5}',
        b'{"digest": "DIGEST", "note": null}',
        b'{"digest": "DIGEST", "note": "' + b"x" * 10_001 + b'"}',
        b'{"digest": "DIGEST", "note": "a\\u0000b"}',
        b'{"digest": "DIGEST", "note": "\\ud800"}',
        b'{"digest": "DIGEST", "approved": true}',
    ],
)
def test_a_bad_body_is_a_400_that_names_the_problem_and_changes_nothing(api, body):
    agent_run, request = waiting()
    body = body.replace(b"DIGEST", request.digest.encode())

    for action in ("approve", "deny"):
        response = api.post(
            f"/api/approvals/{request.pk}/{action}/", body, content_type="application/json"
        )
        assert response.status_code == 400, (action, response.status_code, response.content[:300])
        assert response.json()["code"] in ("invalid", "parse_error"), response.json()
        assert response.json()["detail"], response.json()

    unchanged(agent_run, request)
