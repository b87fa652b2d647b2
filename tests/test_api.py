"""The REST API: the same verdicts and actions as the admin, tokens, and bad
input answered with a 4xx that names the problem and stores nothing. Its
tools are ``test_api_tools.py``'s."""

import io
import json
import threading

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.db import connection
from knox.models import AuthToken
from rest_framework.test import APIClient

from runs.models import AgentRun, DeadLetter
from runs.models.faults import step_inserts_refused
from tests.helpers import answer, call, scripted
from tools.models import OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)

GOOD = scripted(call("search_notes", query="x"), answer("found"), tools=["search_notes"])


@pytest.fixture(autouse=True)
def fresh_throttle():
    cache.clear()


def post_run(api, body=GOOD, **headers):
    return api.post("/api/runs/", body, format="json", **headers)


def test_create_a_run_and_follow_it(api):
    response = post_run(api)
    assert response.status_code == 201
    run_id = response.json()["id"]
    assert api.get(f"/api/runs/{run_id}/").json()["status"] == "completed"
    steps = api.get(f"/api/runs/{run_id}/steps/").json()
    assert [step["kind"] for step in steps["results"]] == ["request", "llm", "tool", "llm"]
    later = api.get(f"/api/runs/{run_id}/steps/?after=2&limit=1").json()
    assert [step["sequence"] for step in later["results"]] == [3] and later["next_after"] == 3
    assert api.get(f"/api/runs/{run_id}/steps/?after=4").json() == {
        "results": [],
        "next_after": None,
    }


def test_an_idempotency_key_makes_a_retry_safe(api):
    first = post_run(api, HTTP_IDEMPOTENCY_KEY="order-42")
    again = post_run(api, HTTP_IDEMPOTENCY_KEY="order-42")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    other = post_run(api, {**GOOD, "prompt": "different"}, HTTP_IDEMPOTENCY_KEY="order-42")
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"
    assert AgentRun.objects.count() == 1


def test_a_created_run_is_answered_as_it_is_after_the_request_not_as_it_was_created(api):
    # Without Redis (the embedded default) the run executes in the request.
    created = post_run(api)
    assert created.status_code == 201
    body = created.json()
    assert (body["status"], body["output"], body["step_count"]) == ("completed", "found", 4)
    assert body == api.get(f"/api/runs/{body['id']}/").json()
    keyed = post_run(api, HTTP_IDEMPOTENCY_KEY="order-7")
    again = post_run(api, HTTP_IDEMPOTENCY_KEY="order-7")
    assert (keyed.status_code, again.status_code) == (201, 200)
    assert keyed.json()["status"] == again.json()["status"] == "completed"


def test_a_created_run_that_parked_for_approval_is_answered_waiting_with_its_requests(
    api, approvals
):
    from runs.models import ApprovalRequest

    body = scripted(
        call("send_notification", recipient="ops", message="hi"),
        answer(),
        tools=["send_notification"],
    )
    created = post_run(api, body)
    assert created.status_code == 201
    (request,) = ApprovalRequest.objects.all()
    assert created.json()["status"] == "waiting_for_approval"
    assert created.json()["pending_approvals"] == [request.pk]


def test_a_queued_run_no_worker_took_yet_is_answered_queued(api, queue):
    created = post_run(api)
    assert created.status_code == 201
    assert (created.json()["status"], created.json()["lease_owner"]) == ("queued", "")


def test_a_concurrent_double_post_with_one_key_creates_one_run(operator, api_token):
    from django.contrib.auth.models import Permission

    operator.user_permissions.add(Permission.objects.get(codename="add_agentrun"))
    header = api_token(operator)
    barrier = threading.Barrier(2)
    statuses = []

    def client_retry():
        try:
            client = APIClient()
            client.credentials(HTTP_AUTHORIZATION=header)
            barrier.wait()
            statuses.append(post_run(client, HTTP_IDEMPOTENCY_KEY="twice").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=client_retry) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [200, 201]
    assert AgentRun.objects.count() == 1


@pytest.mark.parametrize(
    ("body", "content_type", "status", "mentions"),
    [
        ('{"prompt": ', "application/json", 400, "JSON parse error"),
        ("[1, 2]", "application/json", 400, "must be a JSON object"),
        (json.dumps({**GOOD, "prompt": 5}), "application/json", 400, "prompt: 5 is not of type"),
        (json.dumps({**GOOD, "extra": 1}), "application/json", 400, '"extra" was unexpected'),
        (json.dumps({**GOOD, "tools": ["nope"]}), "application/json", 400, "unknown tool(s)"),
        (
            json.dumps({**GOOD, "prompt": "x" * 2_000_000}),
            "application/json",
            413,
            "over the limit",
        ),
        ("prompt=x", "application/x-www-form-urlencoded", 415, "Unsupported media type"),
    ],
)
def test_bad_input_is_refused_naming_the_problem_and_stores_nothing(
    api, body, content_type, status, mentions
):
    response = api.generic("POST", "/api/runs/", body, content_type=content_type)
    assert response.status_code == status, response.content
    assert mentions in response.json()["detail"]
    assert AgentRun.objects.count() == 0


@pytest.mark.parametrize(
    ("url", "status", "mentions"),
    [
        ("/api/runs/not-a-uuid/", 404, "is not a run id"),
        ("/api/runs/00000000-0000-0000-0000-000000000000/", 404, "no run"),
        ("/api/runs/?status=bogus", 400, "status"),
        ("/api/runs/?cursor=tampered", 404, "Invalid cursor"),
        ("/api/runs/?created_after=yesterday", 400, "created_after"),
        ("/api/runs/x/steps/?after=-1", 404, "is not a run id"),
        ("/api/tools/no_such_tool/", 404, "no tool 'no_such_tool'"),
        # Found by schemathesis: an offset PostgreSQL refuses was a 500.
        ("/api/runs/?created_after=0001-01-01T00:00:00%2B16:49", 400, "out of range"),
    ],
)
def test_bad_urls_get_a_4xx_that_names_the_problem(api, url, status, mentions):
    response = api.get(url)
    assert response.status_code == status
    assert mentions in json.dumps(response.json())


def test_list_filters_and_cursor_pagination(api):
    for index in range(3):
        post_run(api, {**GOOD, "prompt": f"run {index}"})
    post_run(api, scripted({"error": "auth"}, tools=["send_notification"]))
    page = api.get("/api/runs/?page_size=2").json()
    assert [run["request"]["prompt"] for run in page["results"]] == ["test prompt", "run 2"]
    rest = api.get(page["next"]).json()
    assert [run["request"]["prompt"] for run in rest["results"]] == ["run 1", "run 0"]
    failed = api.get("/api/runs/?status=failed&failure_class=auth&mode=queued").json()["results"]
    assert len(failed) == 1
    assert len(api.get("/api/runs/?tool=send_notification").json()["results"]) == 1
    assert len(api.get("/api/runs/?write_in_doubt=true").json()["results"]) == 0


def test_unauthenticated_401_without_permission_403(viewer, api_token):
    anonymous = APIClient()
    response = anonymous.get("/api/runs/")
    assert response.status_code == 401 and response.json()["code"] == "not_authenticated"
    viewer_api = APIClient()
    viewer_api.credentials(HTTP_AUTHORIZATION=api_token(viewer))
    assert viewer_api.get("/api/runs/").status_code == 200
    for path in ["/api/runs/", "/api/runs/00000000-0000-0000-0000-000000000000/requeue/"]:
        response = viewer_api.post(path, GOOD, format="json")
        assert response.status_code == 403 and "permission" in response.json()["detail"]
    response = viewer_api.patch("/api/tools/read_note/", {"enabled": False}, format="json")
    assert response.status_code == 403
    assert AgentRun.objects.count() == 0


def test_tokens_are_created_once_stored_hashed_and_revocable(operator):
    out = io.StringIO()
    call_command("create_api_token", "olivia", stdout=out)
    token = out.getvalue().strip()
    stored = AuthToken.objects.get(user=operator)
    assert token not in (stored.digest, stored.token_key) and len(token) > 40
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/runs/").status_code == 200
    stored.delete()
    assert client.get("/api/runs/").status_code == 401


def test_throttled_per_token(api, settings):
    settings.NRLLM_API_THROTTLE_RATE = "3/minute"
    statuses = [api.get("/api/tools/").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    assert api.get("/api/tools/").json()["code"] == "throttled"


def test_cancel_and_requeue_answer_202_or_409_with_the_verdict(api):
    with step_inserts_refused("send_notification"):
        unsafe = post_run(
            api,
            scripted(
                call("send_notification", recipient="a", message="b"),
                answer(),
                tools=["send_notification"],
            ),
        ).json()["id"]
    refused = api.post(f"/api/runs/{unsafe}/requeue/", {}, format="json")
    assert refused.status_code == 409
    assert refused.json()["code"] == "write_in_doubt"
    assert "reconcile it first" in refused.json()["detail"]
    cancel = api.post(f"/api/runs/{unsafe}/cancel/", {}, format="json")
    assert cancel.status_code == 409 and cancel.json()["code"] == "not_cancellable"

    audits = api.get("/api/write-audits/").json()
    assert [item["run"]["id"] for item in audits] == [unsafe]
    assert audits[0]["tool"] == "send_notification"
    bad = api.post(
        f"/api/write-audits/{unsafe}/reconcile/", {"outcome": "not_applied"}, format="json"
    )
    assert bad.status_code == 400 and "note" in bad.json()["detail"]
    done = api.post(
        f"/api/write-audits/{unsafe}/reconcile/",
        {"outcome": "not_applied", "note": "never arrived"},
        format="json",
    )
    assert done.status_code == 200
    requeued = api.post(f"/api/runs/{unsafe}/requeue/", {"note": "resend"}, format="json")
    assert requeued.status_code == 202 and requeued.json()["code"] == "requeued"
    assert AgentRun.objects.get(pk=unsafe).status == "completed"
    assert OutboxNotification.objects.count() == 2


def test_dead_letters_list(api):
    post_run(api, scripted({"error": "auth"}))
    letters = api.get("/api/dead-letters/?open=true").json()["results"]
    assert [letter["reason"] for letter in letters] == ["not_retryable"]
    assert api.get("/api/dead-letters/?open=false").json()["results"] == []
    assert DeadLetter.objects.count() == 1


def test_schema_and_docs(api):
    schema = APIClient().get("/api/schema/?format=json")
    assert schema.status_code == 200
    paths = json.loads(schema.content)["paths"]
    assert {"/api/runs/", "/api/runs/{id}/requeue/", "/api/tools/{name}/"} <= set(paths)
    assert "409" in paths["/api/runs/{id}/requeue/"]["post"]["responses"]
    assert APIClient().get("/api/docs/").status_code == 200


def test_an_offset_postgresql_cannot_store_is_compared_in_utc(api):
    response = api.get("/api/runs/?created_after=2026-01-01T10:00:00-16:49")
    assert response.status_code == 200


def test_action_bodies_refuse_unknown_fields(api):
    run_id = post_run(api).json()["id"]
    response = api.post(f"/api/runs/{run_id}/cancel/", {"reason": "x"}, format="json")
    assert response.status_code == 400 and "reason: unknown field" in response.json()["detail"]
