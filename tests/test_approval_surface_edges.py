"""G14 at its edges, where operators and integrators touch it — the API of
approvals, the inbox, the tool settings: permissions through groups and
sessions, digests of the wrong form, bad input, escaping, query counts.
Real PostgreSQL, the Django test client and DRF's APIClient; nothing of the
code under test is mocked. The webhook's edges are in
``test_approval_webhook.py``."""

import html

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, Permission
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from runs.models import ApprovalRequest, RunStep
from runs.models.vocabulary import ApprovalStatus, RunStatus, StepKind
from runs.runtime import enqueue
from tests.approval_requests import TOOLS, client_with, decide, pending, unchanged, waiting
from tests.conftest import _user
from tests.drifting_model import NOTIFY, request_for
from tests.helpers import fresh
from tools.models import ToolSetting

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals")]

INBOX = "/admin/runs/agentrun/approvals/"
ONE_CALL = [{"calls": [NOTIFY]}, {"answer": "sent"}]
XSS = "<img src=x onerror=alert(1)>"


@pytest.fixture(autouse=True)
def fresh_throttle():
    cache.clear()


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def status_of(request) -> str:
    return ApprovalRequest.objects.get(pk=request.pk).status


def one_waiting():
    agent_run = enqueue(request_for("scripted", ONE_CALL, TOOLS))
    (request,) = pending(agent_run)
    return fresh(agent_run), request


# --- bad input: the API's lists ------------------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        "?tool_name=send%00notification",
        "?decided_by=ol%00ivia",
        "?run=not-a-uuid",
        "?status=bogus",
        "?required_by=nobody",
        "?ordering=id",
        "?page_size=abc",
        "?page_size=-1",
        "?status=pending&ordering=-decided_at",
    ],
)
def test_bad_list_queries_are_4xx_or_empty_never_500(api, query):
    waiting()
    response = api.get(f"/api/approvals/{query}")
    assert response.status_code in (200, 400, 404), response.content[:300]


# --- bad input: the API's decisions --------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"note": "nul \x00 in it"},
        {"digest": None},
        {"note": None},
        {"note": ["a"]},
    ],
)
def test_bad_decision_bodies_are_400_and_change_nothing(api, body):
    agent_run, request = waiting()
    response = decide(api, request, **body)
    assert response.status_code == 400, response.content[:300]
    unchanged(agent_run, request)


def test_an_uppercase_or_cut_digest_decides_nothing(api):
    agent_run, request = waiting()
    for digest in [request.digest.upper(), request.digest[:-1], request.digest + "0"]:
        response = api.post(
            f"/api/approvals/{request.pk}/approve/", {"digest": digest}, format="json"
        )
        assert response.status_code == 400, (digest, response.content[:300])
    unchanged(agent_run, request)


def test_a_digest_of_another_call_of_the_same_run_decides_nothing(api):
    two = [{"calls": [NOTIFY, {**NOTIFY, "arguments": {"recipient": "ops", "message": "b"}}]}]
    agent_run = enqueue(request_for("scripted", [*two, {"answer": "ok"}], TOOLS))
    first, second = sorted(pending(agent_run), key=lambda r: r.position)
    response = api.post(
        f"/api/approvals/{first.pk}/approve/", {"digest": second.digest}, format="json"
    )
    assert (response.status_code, response.json()["code"]) == (409, "stale_digest")
    assert len(pending(agent_run)) == 2


# --- the inbox: bad input, permissions, four-eyes --------------------------------


def test_the_inbox_decide_view_refuses_an_offsite_next(approver):
    agent_run, request = one_waiting()
    response = browser(approver).post(
        f"{INBOX}{request.pk}/decide/",
        {"decision": "deny", "digest": request.digest, "next": "https://evil.example/x"},
    )
    assert response.status_code == 302
    assert response["Location"] == INBOX


def test_a_get_of_the_decide_view_decides_nothing(approver):
    agent_run, request = one_waiting()
    response = browser(approver).get(
        f"{INBOX}{request.pk}/decide/?decision=approve&digest={request.digest}"
    )
    assert response.status_code == 302
    assert status_of(request) == ApprovalStatus.PENDING


def test_a_huge_approval_id_in_the_inbox_is_not_a_500(approver):
    response = browser(approver).post(
        f"{INBOX}{10**30}/decide/", {"decision": "deny", "digest": "0" * 64}
    )
    assert response.status_code in (302, 400, 404)


def test_a_permission_held_through_a_group_may_decide(db):
    group = Group.objects.create(name="approvers")
    # An approver releases only writes they could make: start runs too (G22).
    for codename in ["view_agentrun", "approve_write", "add_agentrun"]:
        group.permissions.add(Permission.objects.get(codename=codename))
    gina = _user("gina", staff=True, permissions=[])
    gina.groups.add(group)
    agent_run, request = one_waiting()
    response = browser(gina).post(
        f"{INBOX}{request.pk}/decide/", {"decision": "approve", "digest": request.digest}
    )
    assert response.status_code == 302
    assert status_of(request) == ApprovalStatus.APPROVED


def test_a_user_who_may_approve_but_not_view_cannot_decide_in_the_inbox(db):
    blind = _user("blind", staff=True, permissions=["runs.approve_write"])
    agent_run, request = one_waiting()
    response = browser(blind).post(
        f"{INBOX}{request.pk}/decide/", {"decision": "approve", "digest": request.digest}
    )
    assert response.status_code == 403
    assert status_of(request) == ApprovalStatus.PENDING


def test_four_eyes_holds_for_a_superuser_who_submitted_through_a_session(settings, db):
    settings.NRLLM_APPROVAL_SECOND_PERSON = True
    boss = _user("boss", staff=True, permissions=[])
    boss.is_superuser = True
    boss.save()
    session = browser(boss)
    created = session.post(
        "/api/runs/", request_for("scripted", ONE_CALL, TOOLS), content_type="application/json"
    )
    assert created.status_code == 201, created.content[:300]
    (request,) = pending(created.json()["id"])
    # The session's API needs the CSRF token it would have in a browser.
    api_session = Client(enforce_csrf_checks=False)
    api_session.force_login(boss)
    response = api_session.post(
        f"/api/approvals/{request.pk}/approve/",
        {"digest": request.digest},
        content_type="application/json",
    )
    assert response.status_code == 403
    inbox = session.post(
        f"{INBOX}{request.pk}/decide/", {"decision": "approve", "digest": request.digest}
    )
    assert inbox.status_code == 302
    assert status_of(request) == ApprovalStatus.PENDING


# --- the inbox: notes -------------------------------------------------------------


def test_the_inbox_refuses_a_note_longer_than_the_api_takes(approver):
    """The API refuses a note over 10,000 characters (a denial's note is
    the model's tool result, and goes into the step and the admin log);
    the inbox took any size the form could carry."""
    agent_run, request = one_waiting()
    response = browser(approver).post(
        f"{INBOX}{request.pk}/decide/",
        {"decision": "deny", "digest": request.digest, "note": "n" * 10_001},
        follow=True,
    )
    assert response.status_code == 200
    assert "10000 characters" in response.content.decode()
    assert status_of(request) == ApprovalStatus.PENDING
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL


def test_an_operators_note_is_escaped_in_the_inbox_and_the_run_page(approver, operator):
    agent_run, request = one_waiting()
    browser(approver).post(
        f"{INBOX}{request.pk}/decide/", {"decision": "deny", "digest": request.digest, "note": XSS}
    )
    assert status_of(request) == ApprovalStatus.DENIED
    for page in [INBOX, f"/admin/runs/agentrun/{agent_run.pk}/change/"]:
        content = browser(operator).get(page).content.decode()
        assert XSS not in content, page
        assert html.escape(XSS) in content or html.escape(XSS, quote=False) in content, page


# --- query counts -----------------------------------------------------------------


def _queries(client, url) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    return len(queries)


def test_the_api_list_does_not_grow_with_pending_requests(api):
    one_waiting()
    one = _queries(api, "/api/approvals/?status=pending")
    for _ in range(19):
        one_waiting()
    assert _queries(api, "/api/approvals/?status=pending") == one


def test_four_eyes_adds_no_query_per_call_to_the_inbox(settings, approver):
    """The inbox's own docstring counts one query per group (its steps);
    with NRLLM_APPROVAL_SECOND_PERSON it also made one per call, to read a
    submitter its query had already joined (``run__submitted_by``)."""
    client = browser(approver)
    for _ in range(20):
        one_waiting()
    settings.NRLLM_APPROVAL_SECOND_PERSON = False
    without = _queries(client, INBOX)
    settings.NRLLM_APPROVAL_SECOND_PERSON = True
    with_four_eyes = _queries(client, INBOX)
    assert with_four_eyes == without, (without, with_four_eyes)


# --- tool settings: relaxation and its audit ------------------------------------------


@pytest.fixture
def tool_keeper(db):
    """Tess: may view and change tool settings, not relax approval."""
    return _user(
        "tess", staff=True, permissions=["tools.view_toolsetting", "tools.change_toolsetting"]
    )


def _notify_setting():
    return ToolSetting.objects.get(name="send_notification")


def test_the_list_edit_cannot_set_the_approval_policy(tool_keeper):
    setting = _notify_setting()
    client = browser(tool_keeper)
    page = client.get("/admin/tools/toolsetting/")
    assert page.status_code == 200
    settings_shown = list(ToolSetting.objects.order_by("name"))
    data = {
        "form-TOTAL_FORMS": str(len(settings_shown)),
        "form-INITIAL_FORMS": str(len(settings_shown)),
        "form-MIN_NUM_FORMS": "0",
        "form-MAX_NUM_FORMS": "1000",
        "_save": "Save",
    }
    for index, each in enumerate(settings_shown):
        data[f"form-{index}-id"] = str(each.pk)
        if each.enabled:
            data[f"form-{index}-enabled"] = "on"
        data[f"form-{index}-approval"] = "not_required"
    client.post("/admin/tools/toolsetting/", data)
    assert _notify_setting().approval == setting.approval


def test_a_relaxation_through_the_api_without_the_permission_undoes_the_switch_too(
    tool_keeper, api_token
):
    before = LogEntry.objects.count()
    setting = _notify_setting()
    client = client_with(api_token(tool_keeper))
    response = client.patch(
        "/api/tools/send_notification/",
        {"enabled": not setting.enabled, "approval": "not_required"},
        format="json",
    )
    assert (response.status_code, response.json()["code"]) == (403, "relax_permission_required")
    now = _notify_setting()
    assert (now.enabled, now.approval) == (setting.enabled, setting.approval)
    assert LogEntry.objects.count() == before


@pytest.mark.parametrize(
    "body",
    [
        {"approval": ["required"]},
        {"approval": {"x": 1}},
        {"approval": "required", "note": "\x00"},
        {"approval": "required", "note": "n" * 2001},
        {"enabled": True, "note": 5},
        {"note": "only a note"},
        {"approval": "Required"},
    ],
)
def test_bad_tool_patches_are_400_and_change_nothing(tool_keeper, api_token, body):
    before = LogEntry.objects.count()
    setting = _notify_setting()
    response = client_with(api_token(tool_keeper)).patch(
        "/api/tools/send_notification/", body, format="json"
    )
    assert response.status_code == 400, response.content[:300]
    now = _notify_setting()
    assert (now.enabled, now.approval) == (setting.enabled, setting.approval)
    assert LogEntry.objects.count() == before


def test_a_decision_is_in_the_admin_log_and_on_the_step_stream(api, operator):
    agent_run, request = waiting()
    before = LogEntry.objects.count()
    response = decide(api, request, "deny", note="no")
    assert response.status_code == 200
    assert LogEntry.objects.count() == before + 1
    assert RunStep.objects.filter(run=agent_run, kind=StepKind.APPROVAL).count() == 2


def test_the_decided_list_does_not_show_the_submitter_approval_as_anyone_elses(api, operator):
    agent_run, request = waiting()
    response = decide(api, request)
    assert response.status_code == 200
    shown = api.get(f"/api/approvals/{request.pk}/").json()
    assert shown["decided_by"] == "olivia"
    assert shown["status"] == ApprovalStatus.APPROVED
    assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.APPROVED


def test_a_lone_surrogate_in_a_decision_note_is_400_and_changes_nothing(api):
    agent_run, request = waiting()
    response = api.post(
        f"/api/approvals/{request.pk}/deny/",
        b'{"digest": "%s", "note": "\\ud800"}' % request.digest.encode(),
        content_type="application/json",
    )
    assert response.status_code == 400, response.content[:300]
    unchanged(agent_run, request)


def test_a_nul_in_the_inbox_form_is_400_and_decides_nothing(approver):
    agent_run, request = one_waiting()
    response = browser(approver).post(
        f"{INBOX}{request.pk}/decide/",
        {"decision": "deny", "digest": request.digest, "note": "a\x00b"},
    )
    assert response.status_code == 400
    assert status_of(request) == ApprovalStatus.PENDING
