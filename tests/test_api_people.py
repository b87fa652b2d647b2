"""G24 through the REST API: an approver edits a waiting call (a new call,
with its own id and digest, that waits for its own approval — never the
editor's under four-eyes); a runner answers the agent's question; another
system completes a deferred call at its signed URL, once. Every refusal —
bad arguments, a bad answer, a bad completion — stores nothing. In-process,
as ``test_api_approvals.py``: a run waits right after ``enqueue``, and the
action that releases it runs it to its end inline."""

import json
import re
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from runs.models import ApprovalRequest
from runs.models.vocabulary import ApprovalStatus, RunStatus, StepKind, WaitKind
from runs.runtime import enqueue
from tests.approval_requests import client_with, decide, listed, pending, unchanged, waiting
from tests.conftest import APPROVER_PERMISSIONS, _user
from tests.deferred_tools import DEFERRED_TOOLS, hand_offs
from tests.drifting_model import NOTIFY, request_for
from tests.helpers import fresh
from tools.models import OutboxNotification

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals")]

EDITED = {"recipient": "ops", "message": "restarting db-2, not db-1"}
HOST_SCHEMA = {
    "type": "object",
    "properties": {"host": {"type": "string", "pattern": "^db-[0-9]+$"}},
    "required": ["host"],
    "additionalProperties": False,
}
ASK = {
    "name": "ask_person",
    "arguments": {"question": "Which host is broken (take {take})?", "answer_schema": HOST_SCHEMA},
}
OPEN_TICKET = {"name": "open_ticket", "arguments": {"title": "restart db-2 (take {take})"}}


@pytest.fixture(autouse=True)
def fresh_throttle():
    cache.clear()


@pytest.fixture
def client_of(api_token):
    """``client_of(user)`` → an API client with a token of that user's."""
    return lambda user: client_with(api_token(user))


@pytest.fixture
def deferred_tools(settings):
    """The deferred tools, their calls not waiting for an approval first."""
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, *DEFERRED_TOOLS]
    settings.NRLLM_APPROVAL_REQUIRED_FOR = "none"
    return settings


def model_name(model) -> str:
    return "scripted" if model is None else "drifting"


def edit(client, request, arguments, **body):
    body = {"digest": request.digest, "arguments": arguments, **body}
    return client.post(f"/api/approvals/{request.pk}/edit/", body, format="json")


def answer(client, request, value, **body):
    body = {"digest": request.digest, "answer": value, **body}
    return client.post(f"/api/approvals/{request.pk}/answer/", body, format="json")


def asking(model=None):
    """A run that waits for the answer to its question, and the question."""
    plan = [{"calls": [ASK]}, {"answer": "restarted {take}"}]
    agent_run = enqueue(request_for(model_name(model), plan, ["ask_person"]))
    (question,) = pending(agent_run)
    return fresh(agent_run), question


def handing_on(model=None):
    """A run whose ticket was handed to the desk, its request, and the
    completion URL the desk was given."""
    plan = [{"calls": [OPEN_TICKET]}, {"answer": "ticket done {take}"}]
    agent_run = enqueue(request_for(model_name(model), plan, ["open_ticket"]))
    (deferred,) = pending(agent_run)
    (hand_off,) = hand_offs(agent_run.pk)
    return fresh(agent_run), deferred, hand_off.message


def the_tool_steps(agent_run, tool_name):
    return list(agent_run.steps.filter(kind=StepKind.TOOL, tool_name=tool_name))


def told(model, text: str) -> bool:
    """Whether the drifting model's last conversation has a tool result with ``text``."""
    return any(
        message["role"] == "tool" and text in (message.get("content") or "")
        for message in model.conversations[-1]
    )


def still_asking(agent_run, question) -> None:
    """Nothing of the answer happened: the run waits as it did, the
    question is pending with no answer."""
    now = fresh(agent_run)
    assert (now.status, now.step_count) == (RunStatus.WAITING_FOR_INPUT, agent_run.step_count)
    question.refresh_from_db()
    assert (question.status, question.answer) == (ApprovalStatus.PENDING, None)


# Edit, then approve.


def test_an_edit_is_a_new_call_with_its_own_id_and_digest_and_replaces_the_old_one(api):
    agent_run, asked = waiting()

    response = edit(api, asked, EDITED, note="db-2 is the broken one")

    assert response.status_code == 200, response.content
    body = response.json()
    made = body["made"]
    assert (body["code"], body["run_status"]) == ("edited", RunStatus.WAITING_FOR_APPROVAL)
    assert made["id"] != asked.pk and made["digest"] != asked.digest
    assert made["idempotency_key"] != asked.idempotency_key
    assert (made["kind"], made["status"], made["arguments"]) == ("approval", "pending", EDITED)
    assert (made["replaces"], made["edited_by"], made["tool_name"]) == (
        asked.pk,
        "olivia",
        "send_notification",
    )
    assert (body["approval"]["status"], body["approval"]["replaced_by"]) == ("replaced", made["id"])
    shown = api.get(f"/api/approvals/{asked.pk}/").json()
    assert (shown["status"], shown["replaced_by"]) == ("replaced", made["id"])
    assert shown["replaces"] is None
    assert [row["id"] for row in listed(api, "?status=pending")] == [made["id"]]
    run = api.get(f"/api/runs/{agent_run.pk}/").json()
    assert run["pending_approvals"] == [made["id"]]
    assert run["waiting_for"] == [{"id": made["id"], "kind": "approval"}]
    # The replaced call is decided no more; its steps stay as they were.
    stale = decide(api, asked)
    assert (stale.status_code, stale.json()["code"]) == (409, "already_decided")
    assert OutboxNotification.objects.count() == 0


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"recipient": 5, "message": "x"}, "recipient"),
        ({"recipient": "ops"}, "message"),
        ({"recipient": "ops", "message": "x", "cc": "all"}, "cc"),
        (["ops", "x"], "arguments"),
        ("ops", "arguments"),
        (None, "arguments"),
    ],
)
def test_an_invalid_edit_is_a_400_naming_the_field_and_changes_nothing(api, arguments, named):
    agent_run, asked = waiting()
    count = ApprovalRequest.objects.count()

    response = edit(api, asked, arguments)

    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid_arguments", response.json()
    assert named in response.json()["detail"], response.json()
    assert ApprovalRequest.objects.count() == count
    unchanged(agent_run, asked)


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b"{not json",
        b'{"digest": "DIGEST"}',
        b'{"arguments": {"recipient": "ops", "message": "x"}}',
        b'{"digest": "DIGEST", "arguments": {}, "note": 5}',
        b'{"digest": "DIGEST", "arguments": {}, "approved": true}',
        b'{"digest": "DIGEST", "arguments": {"recipient": NaN, "message": "x"}}',
        b'{"digest": "DIGEST", "arguments": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"digest": "DIGEST", "arguments": {"recipient": ' + b"9" * 5000 + b"}}",
    ],
)
def test_a_malformed_edit_is_a_400_that_says_why_and_changes_nothing(api, body):
    agent_run, asked = waiting()
    body = body.replace(b"DIGEST", asked.digest.encode())

    response = api.post(f"/api/approvals/{asked.pk}/edit/", body, content_type="application/json")

    assert response.status_code == 400, (response.status_code, response.content[:300])
    assert response.json()["detail"], response.json()
    unchanged(agent_run, asked)


def test_an_edit_to_the_arguments_it_has_or_with_a_stale_digest_changes_nothing(api):
    agent_run, asked = waiting()

    same = edit(api, asked, asked.arguments)
    stale = edit(api, asked, EDITED, digest="0" * 64)

    assert (same.status_code, same.json()["code"]) == (400, "unchanged")
    assert (stale.status_code, stale.json()["code"]) == (409, "stale_digest")
    assert ApprovalRequest.objects.filter(run=agent_run).count() == 1
    unchanged(agent_run, asked)


@pytest.mark.parametrize("who", ["viewer", "outsider"])
def test_without_the_approver_role_an_edit_is_403_and_changes_nothing(request, who, client_of):
    agent_run, asked = waiting()

    response = edit(client_of(request.getfixturevalue(who)), asked, EDITED)

    assert response.status_code == 403, response.content
    unchanged(agent_run, asked)


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_four_eyes_the_editor_cannot_approve_the_edit_and_another_approver_runs_it_as_edited(
    model, settings, api, client_of
):
    settings.NRLLM_APPROVAL_SECOND_PERSON = True
    plan = [{"calls": [NOTIFY]}, {"answer": "done (take {take})"}]
    agent_run = enqueue(request_for(model_name(model), plan, ["send_notification"]))
    (asked,) = pending(agent_run)

    made = edit(api, asked, EDITED).json()["made"]
    edited = ApprovalRequest.objects.get(pk=made["id"])
    own = decide(api, edited)

    assert (own.status_code, own.json()["code"]) == (403, "second_person_required")
    assert "edited" in own.json()["detail"]
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    petra = _user("petra", staff=True, permissions=APPROVER_PERMISSIONS)
    other = decide(client_of(petra), edited)
    assert other.status_code == 200, other.content
    assert (other.json()["code"], other.json()["run_status"]) == ("approved", RunStatus.COMPLETED)
    assert other.json()["approval"]["decided_by"] == "petra"
    (notification,) = OutboxNotification.objects.all()
    assert {"recipient": notification.recipient, "message": notification.message} == EDITED
    assert notification.idempotency_key == edited.idempotency_key
    (ran,) = the_tool_steps(fresh(agent_run), "send_notification")
    assert ran.result["arguments"] == EDITED
    if model is not None:
        assert told(model, "edited")


# The agent asks a person.


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_an_answer_through_the_api_reaches_the_model_and_the_run_completes(model, api):
    agent_run, question = asking(model)
    shown = api.get(f"/api/approvals/{question.pk}/").json()
    assert (shown["kind"], shown["status"], shown["answer_schema"]) == (
        "question",
        "pending",
        HOST_SCHEMA,
    )
    assert shown["question"].startswith("Which host is broken") and shown["answer"] is None
    assert shown["required_by"] == ""  # a question needs no approval
    run = api.get(f"/api/runs/{agent_run.pk}/").json()
    assert (run["status"], run["pending_approvals"]) == ("waiting_for_input", [])
    assert run["waiting_for"] == [{"id": question.pk, "kind": "question"}]
    assert [row["id"] for row in listed(api, "?status=pending&kind=question")] == [question.pk]
    assert listed(api, "?status=pending&kind=approval") == []

    response = answer(api, question, {"host": "db-2"}, note="from the pager")

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["code"], body["run_status"]) == ("answered", RunStatus.COMPLETED)
    shown = body["approval"]
    assert (shown["status"], shown["answer"]) == ("answered", {"host": "db-2"})
    assert (shown["decided_by"], shown["note"]) == ("olivia", "from the pager")
    (asked,) = the_tool_steps(fresh(agent_run), "ask_person")
    assert asked.result == {"answer": {"host": "db-2"}, "answered_by": "olivia"}
    if model is not None:
        assert told(model, "db-2")
    again = answer(api, question, {"host": "db-3"})
    assert (again.status_code, again.json()["code"]) == (409, "already_answered")
    assert the_tool_steps(fresh(agent_run), "ask_person") == [asked]


@pytest.mark.parametrize(
    ("value", "place"),
    [
        ({"hostname": "db-2"}, "answer"),
        ({"host": 2}, "answer.host"),
        ({"host": "the second one"}, "answer.host"),
        ("db-2", "answer"),
        (None, "answer"),
        ([{"host": "db-2"}], "answer"),
    ],
)
def test_an_answer_that_fails_its_schema_is_400_and_stores_nothing(api, value, place):
    agent_run, question = asking()

    response = answer(api, question, value)

    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid_answer", response.json()
    assert response.json()["detail"].startswith(place), response.json()
    still_asking(agent_run, question)
    assert the_tool_steps(fresh(agent_run), "ask_person") == []


@pytest.mark.parametrize(
    "body",
    [
        b"null",
        b'{"digest": "DIGEST"}',
        b'{"answer": {"host": "db-2"}}',
        b'{"digest": "DIGEST", "answer": {"host": "db-2"}, "by": "me"}',
        b'{"digest": "DIGEST", "answer": {"host": "db-2"}, "note": ["x"]}',
        b'{"digest": "DIGEST", "answer": Infinity}',
        b'{"digest": "DIGEST", "answer": {"host": "' + b"\\ud800" + b'"}}',
    ],
)
def test_a_malformed_answer_is_a_400_that_says_why_and_stores_nothing(api, body):
    agent_run, question = asking()
    body = body.replace(b"DIGEST", question.digest.encode())

    response = api.post(
        f"/api/approvals/{question.pk}/answer/", body, content_type="application/json"
    )

    assert response.status_code == 400, (response.status_code, response.content[:300])
    assert response.json()["detail"], response.json()
    still_asking(agent_run, question)


def test_a_question_is_answered_not_decided_and_a_call_decided_not_answered(api):
    agent_run, question = asking()
    waiting_run, asked = waiting()

    for action in ("approve", "deny"):
        response = decide(api, question, action)
        assert (response.status_code, response.json()["code"]) == (400, "not_an_approval")
    edited = edit(api, question, {"question": "which one?"})
    answered = answer(api, asked, {"host": "db-2"})

    assert (edited.status_code, edited.json()["code"]) == (400, "not_an_approval")
    assert (answered.status_code, answered.json()["code"]) == (400, "not_a_question")
    still_asking(agent_run, question)
    unchanged(waiting_run, asked)


@pytest.mark.parametrize("who", ["viewer", "outsider"])
def test_without_the_runner_role_an_answer_is_403_and_stores_nothing(request, who, client_of):
    agent_run, question = asking()

    response = answer(client_of(request.getfixturevalue(who)), question, {"host": "db-2"})

    assert response.status_code == 403, response.content
    assert "runs.add_agentrun" in response.json()["detail"]
    still_asking(agent_run, question)


def test_a_stale_or_expired_question_is_409_and_stores_nothing(api):
    agent_run, question = asking()

    stale = answer(api, question, {"host": "db-2"}, digest="0" * 64)
    ApprovalRequest.objects.filter(pk=question.pk).update(
        expires_at=timezone.now() - timedelta(seconds=5)
    )
    late = answer(api, question, {"host": "db-2"})

    assert (stale.status_code, stale.json()["code"]) == (409, "stale_digest")
    assert (late.status_code, late.json()["code"]) == (409, "expired")
    still_asking(agent_run, question)


def test_the_list_filters_by_kind_and_refuses_an_unknown_one(api):
    asking()
    waiting()

    kinds = {row["kind"] for row in listed(api, "?status=pending")}
    bad = api.get("/api/approvals/?kind=bogus")

    assert kinds == {"approval", "question"}
    assert [row["kind"] for row in listed(api, "?kind=approval")] == ["approval"]
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid")
    assert bad.json()["detail"].startswith("kind:"), bad.json()


# A call completed by another system.


def complete(url, body, **extra):
    """POST ``body`` (an object, or bytes as sent) to a completion URL, as
    another system would: no session, no token."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Client(raise_request_exception=False).post(
        url, data, content_type="application/json", **extra
    )


@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_a_completion_posted_twice_gives_one_result(model, deferred_tools, api):
    agent_run, deferred, url = handing_on(model)
    shown = api.get(f"/api/approvals/{deferred.pk}/").json()
    assert (shown["kind"], shown["status"], shown["question"]) == ("deferred", "pending", None)
    assert shown["reference"].startswith("TICKET-")
    run = api.get(f"/api/runs/{agent_run.pk}/").json()
    assert run["waiting_for"] == [{"id": deferred.pk, "kind": "deferred"}]
    assert [row["id"] for row in listed(api, "?status=pending&kind=deferred")] == [deferred.pk]

    first = complete(url, {"result": {"restarted": "db-2"}})
    again = complete(url, {"result": {"restarted": "db-2"}})
    other = complete(url, {"result": {"restarted": "db-1"}})

    assert (first.status_code, first.json()["status"]) == (200, "completed"), first.content
    assert (again.status_code, again.json()["status"]) == (200, "unchanged"), again.content
    assert (other.status_code, other.json()["code"]) == (409, "conflict"), other.content
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    (outcome,) = the_tool_steps(agent_run, "open_ticket")
    assert outcome.result == {"restarted": "db-2"}
    assert api.get(f"/api/approvals/{deferred.pk}/").json()["answer"] == {
        "result": {"restarted": "db-2"}
    }
    assert len(hand_offs(agent_run.pk)) == 1
    if model is not None:
        assert told(model, "db-2")


def test_a_completion_reporting_an_error_tells_the_model_of_it(deferred_tools):
    agent_run, deferred, url = handing_on()

    response = complete(url, {"error": "the desk refused the ticket"})

    assert (response.status_code, response.json()["status"]) == (200, "completed")
    (outcome,) = the_tool_steps(fresh(agent_run), "open_ticket")
    assert "the desk refused the ticket" in outcome.error


def test_a_url_not_signed_here_is_a_404_said_as_for_no_call(deferred_tools):
    agent_run, deferred, url = handing_on()
    key, signature = re.search(r"/api/completions/(\w+)/([\w-]+)/$", url).groups()
    others = [
        url.rstrip("/") + "x/",
        url.replace(signature, "A" * len(signature)),
        url.replace(key, "0" * 64),
        url.replace(key, "not-a-key"),
        url.replace(key, key.upper()),
        url.replace(signature, "s" * 300),
    ]

    answers = [complete(other, {"result": "done"}) for other in others]
    # Refused by the site before any view (test_http_guard): a 404 too.
    with_a_nul = complete(url.replace(signature, "%00"), {"result": "done"})

    assert {(each.status_code, each.content) for each in answers} == {
        (404, b'{"code":"not_found","detail":"no such deferred call"}')
    }
    assert with_a_nul.status_code == 404
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_INPUT
    assert pending(agent_run) == [deferred]


def test_a_completion_for_a_call_not_yet_parked_is_409_with_retry_after(deferred_tools):
    agent_run, deferred, url = handing_on()
    ApprovalRequest.objects.filter(pk=deferred.pk).delete()

    response = complete(url, {"result": "done"})

    assert (response.status_code, response.json()["code"]) == (409, "not_waiting")
    assert response["Retry-After"] == "1"


def test_a_completion_past_its_deadline_is_409_even_before_the_reaper_ends_the_wait(
    deferred_tools,
):
    agent_run, deferred, url = handing_on()
    ApprovalRequest.objects.filter(pk=deferred.pk).update(
        expires_at=timezone.now() - timedelta(seconds=5)
    )

    response = complete(url, {"result": "done"})

    assert (response.status_code, response.json()["code"]) == (409, "expired"), response.content
    assert pending(agent_run) == [deferred]
    assert the_tool_steps(fresh(agent_run), "open_ticket") == []


def test_a_completion_after_its_wait_ended_is_409_and_stores_nothing(deferred_tools, api):
    agent_run, deferred, url = handing_on()
    assert api.post(f"/api/runs/{agent_run.pk}/cancel/", {}, format="json").status_code == 202

    response = complete(url, {"result": "done"})

    assert (response.status_code, response.json()["code"]) == (409, "withdrawn"), response.content
    assert the_tool_steps(fresh(agent_run), "open_ticket") == []


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{not json",
        b"\xff\xfe",
        b"[]",
        b"null",
        b'"done"',
        b"{}",
        b'{"result": 1, "error": "x"}',
        b'{"outcome": 1}',
        b'{"error": 5}',
        b'{"error": " "}',
        b'{"error": "' + b"x" * 10_001 + b'"}',
        b'{"result": "' + b"x" * 40_000 + b'"}',
        b'{"result": NaN}',
        b'{"result": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"result": ' + b"9" * 5000 + b"}",
    ],
)
def test_a_malformed_completion_is_a_400_that_names_the_problem_and_stores_nothing(
    deferred_tools, body
):
    agent_run, deferred, url = handing_on()

    response = complete(url, body)

    assert response.status_code == 400, (response.status_code, response.content[:300])
    assert response.json()["code"] == "invalid_completion", response.json()
    assert response.json()["detail"], response.json()
    assert pending(agent_run) == [deferred]
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_INPUT


def test_an_oversized_completion_is_413_before_it_is_read(deferred_tools):
    agent_run, deferred, url = handing_on()

    response = complete(url, b'{"result": "' + b"x" * 300_000 + b'"}')

    assert (response.status_code, response.json()["code"]) == (413, "too_large")
    assert pending(agent_run) == [deferred]


def test_a_completion_needs_no_session_nor_token_and_takes_no_get(deferred_tools):
    agent_run, deferred, url = handing_on()

    looked = Client().get(url)
    ignored_accept = complete(url, {"result": "done"}, HTTP_ACCEPT="text/html")

    assert looked.status_code == 405
    assert (ignored_accept.status_code, ignored_accept.json()["status"]) == (200, "completed")
    assert deferred.kind == WaitKind.DEFERRED
