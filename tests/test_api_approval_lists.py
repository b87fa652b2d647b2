"""``GET /api/approvals/`` and the run record (G14): pending calls oldest
first with the call, its digest and the time left; decided ones with who,
when and why; filters, orders, cursors; who submitted a run, and which
calls a waiting run waits for, without a query per run."""

import base64
from urllib.parse import urlencode

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.approvals import actions as approval_actions
from runs.models import ApprovalRequest
from runs.models.vocabulary import RunStatus
from runs.runtime import enqueue
from tests.approval_requests import PLAN, TOOLS, listed, pending, waiting
from tests.drifting_model import NOTIFY, SEARCH, request_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals")]


@pytest.fixture(autouse=True)
def fresh_throttle():
    cache.clear()


def test_pending_requests_are_listed_oldest_first_with_the_call_and_its_digest(api):
    runs = [waiting()[0] for _ in range(3)]
    long_prompt = {"prompt": "p" * 500}
    long_run, long_request = waiting(**long_prompt)

    items = listed(api, "?status=pending")

    assert [item["run"] for item in items] == [str(r.pk) for r in [*runs, long_run]]
    item = items[-1]
    assert item["id"] == long_request.pk
    assert item["run_status"] == RunStatus.WAITING_FOR_APPROVAL
    assert item["run_prompt"] == "p" * 200 + "…"
    assert items[0]["run_prompt"] == "ship it"
    assert (item["tool_name"], item["effect"]) == ("send_notification", "non_idempotent_write")
    assert item["arguments"] == long_request.arguments
    assert (item["position"], item["turn_sequence"]) == ("2.1", long_request.turn_sequence)
    assert item["idempotency_key"] == long_request.idempotency_key
    assert item["digest"] == long_request.digest and len(item["digest"]) == 64
    assert (item["required_by"], item["status"]) == ("policy", "pending")
    assert 86400 - 60 < item["seconds_left"] <= 86400
    assert (item["decided_by"], item["decided_at"], item["note"]) == (None, None, "")
    assert item["by_submitter"] is False
    assert api.get(f"/api/approvals/{long_request.pk}/").json() == item


def test_decided_requests_are_listed_latest_decision_first_and_each_order_may_be_asked(
    api, operator
):
    requests = [waiting()[1] for _ in range(3)]
    for request in (requests[1], requests[0], requests[2]):
        assert approval_actions.deny(request, operator, digest=request.digest, note="no").ok
    later_run, later_request = waiting()
    ids = [r.pk for r in requests]

    assert [item["id"] for item in listed(api, "?status=denied")] == [ids[2], ids[0], ids[1]]
    newest_first = [later_request.pk, *reversed(ids)]
    assert [item["id"] for item in listed(api)] == newest_first
    assert [item["id"] for item in listed(api, "?ordering=requested_at")] == newest_first[::-1]
    # Ordered by decision, only decided requests: a pending one has no decided_at.
    assert [item["id"] for item in listed(api, "?ordering=-decided_at")] == [
        ids[2],
        ids[0],
        ids[1],
    ]
    decided = listed(api, "?status=denied")[0]
    assert (decided["decided_by"], decided["note"], decided["seconds_left"]) == (
        "olivia",
        "no",
        None,
    )
    assert decided["run_status"] == RunStatus.COMPLETED and decided["decided_at"]
    refused = api.get("/api/approvals/?ordering=-id")
    assert refused.status_code == 400 and "ordering" in refused.json()["detail"]


def test_a_cursor_walks_every_request_once_across_ties(api):
    """The calls of one turn share their requested_at: the cursor's
    tie-break (id) keeps a page boundary between them from losing one."""
    plan = [{"calls": [NOTIFY, NOTIFY, NOTIFY]}, {"answer": "ok"}]
    agent_run = enqueue(request_for("scripted", plan, TOOLS))
    expected = [r.pk for r in pending(agent_run)] + [waiting()[1].pk]
    assert len(set(ApprovalRequest.objects.values_list("requested_at", flat=True))) == 2

    for ordering in ("requested_at", "-requested_at"):
        seen, url = [], f"/api/approvals/?page_size=1&ordering={ordering}"
        while url:
            page = api.get(url).json()
            seen += [item["id"] for item in page["results"]]
            url = page["next"]
        assert seen == (expected if ordering == "requested_at" else expected[::-1])


def test_the_list_filters_by_run_tool_decider_and_requirement(api, operator, approver):
    first_run, first = waiting()
    _, second = waiting()
    asked_run = enqueue(
        {
            **request_for("scripted", [{"calls": [SEARCH]}, {"answer": "ok"}], TOOLS),
            "require_approval": ["search_notes"],
        }
    )
    (asked,) = pending(asked_run)
    assert approval_actions.deny(second, approver, digest=second.digest).ok

    def ids(query):
        return [item["id"] for item in listed(api, query)]

    assert ids(f"?run={first_run.pk}") == [first.pk]
    assert ids("?tool_name=search_notes") == [asked.pk]
    assert ids("?required_by=request") == [asked.pk]
    assert set(ids("?required_by=policy")) == {first.pk, second.pk}
    assert ids("?decided_by=ada") == [second.pk]
    assert ids("?decided_by=olivia") == []
    assert ids(f"?status=pending&run={asked_run.pk}") == [asked.pk]
    for bad in ("?status=maybe", "?run=not-a-uuid", "?required_by=someone", "?ordering=x"):
        response = api.get(f"/api/approvals/{bad}")
        assert response.status_code == 400, (bad, response.status_code)
        assert bad[1:].split("=")[0] in response.json()["detail"], response.json()


def test_a_waiting_run_shows_its_pending_approvals_without_a_query_per_run(api):
    agent_run, request = waiting()
    done = enqueue(request_for("scripted", [{"answer": "ok"}], TOOLS))

    shown = api.get(f"/api/runs/{agent_run.pk}/").json()

    assert (shown["status"], shown["pending_approvals"]) == ("waiting_for_approval", [request.pk])
    assert api.get(f"/api/runs/{done.pk}/").json()["pending_approvals"] == []
    with CaptureQueriesContext(connection) as two_runs:
        page = api.get("/api/runs/").json()["results"]
    assert [run["pending_approvals"] for run in page] == [[], [request.pk]]
    for _ in range(3):
        waiting()
    with CaptureQueriesContext(connection) as more_runs:
        page = api.get("/api/runs/?status=waiting_for_approval").json()["results"]
    assert len(page) == 4 and all(len(run["pending_approvals"]) == 1 for run in page)
    assert len(more_runs) == len(two_runs)


def test_the_run_record_shows_who_submitted_it(api):
    response = api.post("/api/runs/", request_for("scripted", PLAN, TOOLS), format="json")
    assert response.status_code == 201
    created = response.json()
    assert (created["submitted_by"], created["submitted_via"]) == ("olivia", "api")
    shown = api.get(f"/api/runs/{created['id']}/").json()
    assert (shown["submitted_by"], shown["submitted_via"]) == ("olivia", "api")
    (request,) = pending(created["id"])
    assert shown["pending_approvals"] == [request.pk]
    # A retry with the key returns the record as it stands: the run now waits.
    key = {"HTTP_IDEMPOTENCY_KEY": "notify-once"}
    first = api.post("/api/runs/", request_for("scripted", PLAN, TOOLS), format="json", **key)
    again = api.post("/api/runs/", request_for("scripted", PLAN, TOOLS), format="json", **key)
    assert (first.status_code, again.status_code) == (201, 200)
    replayed = again.json()
    assert (replayed["status"], replayed["submitted_by"]) == ("waiting_for_approval", "olivia")
    assert replayed["pending_approvals"] == [pending(replayed["id"])[0].pk]

    from_the_command_line = enqueue(request_for("scripted", [{"answer": "ok"}], TOOLS))
    shown = api.get(f"/api/runs/{from_the_command_line.pk}/").json()
    assert (shown["submitted_by"], shown["submitted_via"]) == (None, "command_line")


@pytest.mark.parametrize(
    ("position", "status"),
    [
        ("garbage", 404),
        ("2026-01-01 10:00:00", 404),  # no offset: no moment
        ("2026-13-01T10:00:00+00:00", 404),
        ("9999-12-31T23:59:59-15:00", 404),  # past year 9999 in UTC
        ("2026-01-01T10:00\x00", 404),
        ("2026-01-01T10:00:00-16:49", 200),  # Python's offset, not PostgreSQL's: as UTC
        ("2026-01-01 10:00:00.5+00:00", 200),
    ],
)
def test_a_crafted_cursor_on_any_list_is_a_404_never_a_500(api, position, status):
    waiting()
    cursor = base64.b64encode(urlencode({"p": position}).encode()).decode()
    api.raise_request_exception = False
    for route in ("/api/approvals/", "/api/runs/", "/api/dead-letters/"):
        response = api.get(route, {"cursor": cursor})
        assert response.status_code == status, (route, response.status_code)
