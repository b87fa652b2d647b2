"""G14's policy: which calls wait for approval. The default follows the
tool's effect (code) and ``NRLLM_APPROVAL_REQUIRED_FOR``; a run's request may
add approvals, never remove one. Operators' settings of it, per tool, are
``test_approval_settings.py``'s. Runs here execute in-process (the embedded
default)."""

import pytest

from runs.approvals import actions as approval_actions
from runs.models import AgentRun, ApprovalRequest
from runs.models.vocabulary import RunStatus
from runs.runtime import enqueue
from tests.approval_requests import pending
from tests.drifting_model import NOTIFY, SEARCH, request_for
from tests.helpers import fresh, manage, sqlite_env
from tools.models import Note, OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)

TOOLS = ["search_notes", "send_notification", "upsert_note"]
NOTIFY_PLAN = [{"calls": [NOTIFY]}, {"answer": "sent"}]
UPSERT = {"name": "upsert_note", "arguments": {"slug": "release", "body": "v2 (take {take})"}}


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
