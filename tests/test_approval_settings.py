"""G14's policy as operators set it, per tool (``tools.approval_settings``):
any tool may be made to wait, and a write relaxed only with
``tools.relax_approval``, audited, in the admin and through the API alike;
both show the setting and the policy in effect. What the policy is without
them is ``test_approval_policy.py``'s. Runs here execute in-process (the
embedded default)."""

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from rest_framework.test import APIClient

from runs.models import ApprovalRequest
from runs.models.vocabulary import RunStatus
from runs.runtime import enqueue
from tests.approval_requests import pending
from tests.drifting_model import SEARCH, request_for
from tests.helpers import fresh
from tests.test_approval_policy import NOTIFY_PLAN, TOOLS
from tools import approval_settings
from tools.models import OutboxNotification, ToolSetting

pytestmark = pytest.mark.django_db(transaction=True)

CHANGE_PAGE = "/admin/tools/toolsetting/send_notification/change/"


@pytest.fixture
def tool_keeper(db):
    """Rita, staff, who may switch tools and require approval, but not relax it."""
    user = get_user_model().objects.create_user("rita", password="pw", is_staff=True)
    for codename in ["view_toolsetting", "change_toolsetting", "view_agentrun"]:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def api_for(user, api_token) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=api_token(user))
    return client


def log_messages(name: str) -> list[str]:
    """The admin log's entries for the tool ``name``, oldest first."""
    entries = LogEntry.objects.filter(object_id=name).order_by("id")
    return [entry.get_change_message() for entry in entries]


def approval_of(name: str) -> str:
    return ToolSetting.objects.get(name=name).approval


# --- operators' settings ---------------------------------------------------------


@pytest.mark.usefixtures("approvals")
def test_required_on_a_read_tool_makes_it_wait(tool_keeper, operator):
    setting = ToolSetting.objects.get(name="search_notes")
    result = approval_settings.set_approval_policy(setting, tool_keeper, "required")
    assert (result.ok, result.code) == (True, "changed"), result

    agent_run = enqueue(request_for("scripted", [{"calls": [SEARCH]}, {"answer": "ok"}], TOOLS))

    (request,) = pending(agent_run)
    assert (request.tool_name, request.effect, request.required_by) == (
        "search_notes",
        "read_only",
        "policy",
    )
    assert log_messages("search_notes") == [
        "Changed approval in the admin: default → required. "
        "Every call of search_notes now waits for an operator's approval."
    ]


@pytest.mark.usefixtures("approvals")
def test_the_api_shows_the_setting_and_the_effective_policy(settings, viewer, api_token):
    api = api_for(viewer, api_token)
    ToolSetting.objects.filter(name="search_notes").update(approval="required")

    tools = {tool["name"]: tool for tool in api.get("/api/tools/").json()}

    assert (
        tools["send_notification"]["approval"],
        tools["send_notification"]["approval_required"],
    ) == (
        "default",
        True,
    )
    assert (tools["upsert_note"]["approval"], tools["upsert_note"]["approval_required"]) == (
        "default",
        False,
    )
    assert (tools["search_notes"]["approval"], tools["search_notes"]["approval_required"]) == (
        "required",
        True,
    )
    settings.NRLLM_APPROVAL_REQUIRED_FOR = "write"
    detail = api.get("/api/tools/upsert_note/").json()
    assert (detail["approval"], detail["approval_required"]) == ("default", True)
    assert "note" not in detail  # written, never shown


@pytest.mark.usefixtures("approvals")
def test_requiring_approval_needs_only_the_change_permission_and_is_audited(tool_keeper, api_token):
    api = api_for(tool_keeper, api_token)

    response = api.patch(
        "/api/tools/upsert_note/", {"approval": "required", "note": "new tool"}, format="json"
    )

    assert response.status_code == 200, response.json()
    assert (response.json()["approval"], response.json()["approval_required"]) == (
        "required",
        True,
    )
    assert approval_of("upsert_note") == "required"
    assert log_messages("upsert_note") == [
        "Changed approval through the API: default → required. "
        "Every call of upsert_note now waits for an operator's approval. Note: new tool"
    ]


@pytest.mark.usefixtures("approvals")
def test_relaxing_through_the_api_without_the_permission_is_refused_and_nothing_changes(
    tool_keeper, api_token
):
    api = api_for(tool_keeper, api_token)

    for body in [{"approval": "not_required"}, {"approval": "not_required", "enabled": False}]:
        response = api.patch("/api/tools/send_notification/", body, format="json")
        assert response.status_code == 403, response.json()
        assert response.json()["code"] == "relax_permission_required"
        assert "tools.relax_approval" in response.json()["detail"]

    setting = ToolSetting.objects.get(name="send_notification")
    assert (setting.approval, setting.enabled) == ("default", True)
    assert not LogEntry.objects.exists()
    # Where the default asks for nothing, not_required relaxes nothing.
    response = api.patch("/api/tools/search_notes/", {"approval": "not_required"}, format="json")
    assert response.status_code == 200


@pytest.mark.usefixtures("approvals")
def test_relaxing_in_the_admin_without_the_permission_is_refused_and_nothing_changes(
    tool_keeper,
):
    client = client_for(tool_keeper)

    response = client.post(
        CHANGE_PAGE, {"enabled": "on", "approval": "not_required", "note": "trust me"}
    )

    assert response.status_code == 200  # the form again, with the refusal on it
    errors = response.context["adminform"].form.errors["approval"]
    assert "tools.relax_approval" in errors[0]
    assert approval_of("send_notification") == "default"
    assert not LogEntry.objects.exists()
    # The list's inline edit has no approval field: a crafted one is ignored.
    response = client.post(
        "/admin/tools/toolsetting/",
        {
            "form-TOTAL_FORMS": "1",
            "form-INITIAL_FORMS": "1",
            "form-MIN_NUM_FORMS": "0",
            "form-MAX_NUM_FORMS": "1000",
            "form-0-name": "send_notification",
            "form-0-enabled": "on",
            "form-0-approval": "not_required",
            "_save": "Save",
        },
    )
    assert response.status_code == 302
    assert approval_of("send_notification") == "default"
    assert not LogEntry.objects.exists()


@pytest.mark.usefixtures("approvals")
def test_a_relaxation_through_the_api_is_audited_and_the_write_then_runs_unattended(api):
    response = api.patch(
        "/api/tools/send_notification/",
        {"approval": "not_required", "note": "the team channel only"},
        format="json",
    )

    assert response.status_code == 200, response.json()
    assert (response.json()["approval"], response.json()["approval_required"]) == (
        "not_required",
        False,
    )
    assert log_messages("send_notification") == [
        "Changed approval through the API: default → not_required. send_notification "
        "(non_idempotent_write) now runs its writes unattended: no operator approves them. "
        "Note: the team channel only"
    ]
    agent_run = enqueue(request_for("scripted", NOTIFY_PLAN, TOOLS))
    assert fresh(agent_run).status == RunStatus.COMPLETED
    assert not ApprovalRequest.objects.exists()
    assert OutboxNotification.objects.count() == 1


@pytest.mark.usefixtures("approvals")
def test_a_relaxation_in_the_admin_is_audited_once(operator_client, tool_keeper):
    response = operator_client.post(
        CHANGE_PAGE, {"enabled": "on", "approval": "not_required", "note": "trusted"}
    )

    assert response.status_code == 302
    assert approval_of("send_notification") == "not_required"
    assert log_messages("send_notification") == [
        "Changed approval in the admin: default → not_required. send_notification "
        "(non_idempotent_write) now runs its writes unattended: no operator approves them. "
        "Note: trusted"
    ]
    # Keeping a relaxation someone allowed is no relaxation: Rita may switch the tool.
    response = client_for(tool_keeper).post(CHANGE_PAGE, {"approval": "not_required"})
    assert response.status_code == 302
    assert ToolSetting.objects.get(name="send_notification").enabled is False
    assert approval_of("send_notification") == "not_required"
    assert log_messages("send_notification")[-1] == "Changed Enabled."
    # A note with no change of approval is refused, not dropped.
    response = operator_client.post(CHANGE_PAGE, {"approval": "not_required", "note": "hm"})
    assert response.status_code == 200
    assert "approval setting" in response.context["adminform"].form.errors["note"][0]


@pytest.mark.usefixtures("approvals")
def test_a_bad_approval_value_or_note_is_a_400_naming_it(api):
    for body, named in [
        ({"approval": "never"}, "approval"),
        ({"approval": None}, "approval"),
        ({"approval": ["required"]}, "approval"),
        ({"approval": "required", "note": 3}, "note"),
        ({"approval": "required", "note": "a\x00b"}, "note"),
        ({"approval": "required", "note": "x" * 2001}, "note"),
        ({"approval_required": False}, "approval_required"),
        ({}, "body"),
    ]:
        response = api.patch("/api/tools/send_notification/", body, format="json")
        assert response.status_code == 400, (body, response.json())
        assert response.json()["detail"].startswith(f"{named}: "), response.json()
    assert approval_of("send_notification") == "default"
    assert not LogEntry.objects.exists()


# --- the admin shows it ------------------------------------------------------------


@pytest.mark.usefixtures("approvals")
def test_the_admin_shows_the_effective_policy(operator_client, viewer_client):
    ToolSetting.objects.filter(name="search_notes").update(approval="required")
    ToolSetting.objects.filter(name="post_webhook").update(approval="not_required")

    listing = operator_client.get("/admin/tools/toolsetting/").content.decode()

    assert "required (the default for non_idempotent_write)" in listing
    assert "not required (the default for idempotent_write)" in listing
    assert "required (set by an operator; the default for read_only is not required)" in listing
    assert "not required: its writes run unattended" in listing
    page = operator_client.get(CHANGE_PAGE)
    assert "required (the default for non_idempotent_write)" in page.content.decode()
    assert "approval" in page.context["adminform"].form.fields
    assert "effect" not in page.context["adminform"].form.fields
    seen = viewer_client.get(CHANGE_PAGE)
    assert seen.status_code == 200
    assert "required (the default for non_idempotent_write)" in seen.content.decode()
    assert "Note:" in page.content.decode() and "Note:" not in seen.content.decode()


def test_not_required_on_a_write_is_a_relaxation_even_when_the_default_asks_nothing(
    settings, operator
):
    # Under NRLLM_APPROVAL_REQUIRED_FOR=none the setting changes nothing today,
    # but the day the default is tightened it would let the write run
    # unattended: granted by nobody, unless setting it needed the permission.
    set_approval_policy = approval_settings.set_approval_policy
    settings.NRLLM_APPROVAL_REQUIRED_FOR = "none"
    operator.user_permissions.remove(Permission.objects.get(codename="relax_approval"))
    operator = get_user_model().objects.get(pk=operator.pk)  # a fresh permission cache
    setting = ToolSetting.objects.get(name="upsert_note")

    refused = set_approval_policy(setting, operator, "not_required")

    assert (refused.ok, refused.code) == (False, "relax_permission_required")
    assert ToolSetting.objects.get(name="upsert_note").approval == "default"
    # A read is no relaxation: there is no write to run unattended.
    read = ToolSetting.objects.get(name="search_notes")
    assert set_approval_policy(read, operator, "not_required").ok
