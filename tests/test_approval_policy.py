"""G14's policy: which calls wait for approval. The default follows the
tool's effect (code) and ``NRLLM_APPROVAL_REQUIRED_FOR``; operators may
require approval of any tool, and relax it for a write only with
``tools.relax_approval``, audited, in the admin and through the API alike
(``tools.approval_settings``); a run's request may add approvals, never
remove one. Runs here execute in-process (the embedded default)."""

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from rest_framework.test import APIClient

from runs.approvals import actions as approval_actions
from runs.models import AgentRun, ApprovalRequest
from runs.runtime import enqueue
from runs.vocabulary import ApprovalStatus, RunStatus
from tests.drifting_model import NOTIFY, SEARCH, request_for
from tests.helpers import fresh, manage, sqlite_env
from tools import approval_settings
from tools.models import Note, OutboxNotification, ToolSetting

pytestmark = pytest.mark.django_db(transaction=True)

TOOLS = ["search_notes", "send_notification", "upsert_note"]
NOTIFY_PLAN = [{"calls": [NOTIFY]}, {"answer": "sent"}]
UPSERT = {"name": "upsert_note", "arguments": {"slug": "release", "body": "v2 (take {take})"}}
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


def pending(agent_run) -> list[ApprovalRequest]:
    return list(ApprovalRequest.objects.filter(run=agent_run, status=ApprovalStatus.PENDING))


def log_messages(name: str) -> list[str]:
    """The admin log's entries for the tool ``name``, oldest first."""
    entries = LogEntry.objects.filter(object_id=name).order_by("id")
    return [entry.get_change_message() for entry in entries]


def approval_of(name: str) -> str:
    return ToolSetting.objects.get(name=name).approval


# --- the default ---------------------------------------------------------------


def test_the_shipped_default_makes_only_non_idempotent_writes_wait(tmp_path):
    """Read from the app's own settings in a process of their own: the
    suite's settings turn approvals off, so only this sees the default."""
    script = (
        "from django.conf import settings\n"
        "from tools.approval_policy import requires_approval\n"
        "from tools.registry import effect_for\n"
        "names = ['send_notification', 'post_webhook', 'upsert_note', 'search_notes']\n"
        "print(settings.NRLLM_APPROVAL_REQUIRED_FOR,"
        " *[requires_approval(effect_for(n), 'default') for n in names])\n"
    )
    env = sqlite_env(tmp_path / "db.sqlite3", DJANGO_SETTINGS_MODULE="nrllm_ops.settings")
    assert "NRLLM_APPROVAL_REQUIRED_FOR" not in env

    result = manage("shell", "-c", script, env=env)

    assert result.returncode == 0, result.stderr[-2000:]
    # The last line: the shell may first say what it imported.
    printed = result.stdout.strip().splitlines()[-1].split()
    assert printed == ["non_idempotent_write", "True", "True", "False", "False"]


def test_a_malformed_required_for_stops_start_up_naming_the_variable(tmp_path):
    env = sqlite_env(tmp_path / "db.sqlite3", NRLLM_APPROVAL_REQUIRED_FOR="writes")

    result = manage("check", env=env)

    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "NRLLM_APPROVAL_REQUIRED_FOR='writes' must be one of" in result.stderr


def test_required_for_write_makes_an_idempotent_write_wait(settings, operator):
    settings.NRLLM_APPROVAL_REQUIRED_FOR = "write"
    agent_run = enqueue(request_for("scripted", [{"calls": [UPSERT]}, {"answer": "ok"}], TOOLS))

    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    (request,) = pending(agent_run)
    assert (request.tool_name, request.effect, request.required_by) == (
        "upsert_note",
        "idempotent_write",
        "policy",
    )
    assert not Note.objects.exists()
    assert approval_actions.approve(request, operator, digest=request.digest).ok
    assert fresh(agent_run).status == RunStatus.COMPLETED
    assert Note.objects.get(slug="release").body == "v2 (take same)"


def test_required_for_none_makes_nothing_wait(settings):
    settings.NRLLM_APPROVAL_REQUIRED_FOR = "none"
    plan = [{"calls": [NOTIFY, UPSERT, SEARCH]}, {"answer": "ok"}]

    agent_run = enqueue(request_for("scripted", plan, TOOLS))

    assert fresh(agent_run).status == RunStatus.COMPLETED
    assert not ApprovalRequest.objects.exists()
    assert OutboxNotification.objects.count() == 1


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


# --- a run's request ---------------------------------------------------------------


@pytest.mark.usefixtures("approvals")
def test_a_request_cannot_ask_for_fewer_approvals(api):
    body = {**request_for("scripted", NOTIFY_PLAN, TOOLS), "require_approval": []}

    response = api.post("/api/runs/", body, format="json")

    assert response.status_code == 201, response.json()
    agent_run = AgentRun.objects.get(pk=response.json()["id"])
    assert agent_run.status == RunStatus.WAITING_FOR_APPROVAL
    assert [request.tool_name for request in pending(agent_run)] == ["send_notification"]
    for unknown in [{"approval": "none"}, {"require_approval": None}, {"skip_approval": True}]:
        response = api.post(
            "/api/runs/", {**request_for("scripted", NOTIFY_PLAN, TOOLS), **unknown}, format="json"
        )
        assert response.status_code == 400, (unknown, response.json())
        assert next(iter(unknown)) in response.json()["detail"]
    assert AgentRun.objects.count() == 1
    assert OutboxNotification.objects.count() == 0


@pytest.mark.usefixtures("approvals")
def test_require_approval_naming_a_tool_not_offered_is_a_400_naming_it(api):
    body = {
        **request_for("scripted", NOTIFY_PLAN, ["send_notification"]),
        "require_approval": ["search_notes"],
    }

    response = api.post("/api/runs/", body, format="json")

    assert response.status_code == 400
    assert "require_approval" in response.json()["detail"]
    assert "search_notes" in response.json()["detail"]
    assert not AgentRun.objects.exists()


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
