"""The REST API's tools: their declared effect shown, never changed; only
``enabled`` switched, each switch in the admin log, a switch whose entry
cannot be written refused, and a tool deleted under a switch a 404."""

import contextlib
import json
import threading
import time

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import connection, transaction
from rest_framework.test import APIClient

from tests.test_api import fresh_throttle  # noqa: F401  (autouse: each test's own throttle)
from tools.models import ToolSetting

pytestmark = pytest.mark.django_db(transaction=True)


def test_tools_show_their_effect_and_only_enabled_changes(api):
    tools = {tool["name"]: tool for tool in api.get("/api/tools/").json()}
    assert tools["post_webhook"]["effect"] == "non_idempotent_write"
    response = api.patch("/api/tools/post_webhook/", {"effect": "read_only"}, format="json")
    assert response.status_code == 400 and "effect is read-only" in response.json()["detail"]
    response = api.patch(
        "/api/tools/post_webhook/", {"enabled": False, "effect": "read_only"}, format="json"
    )
    assert response.status_code == 400
    assert ToolSetting.objects.get(name="post_webhook").enabled is True
    response = api.patch("/api/tools/post_webhook/", {"colour": "red"}, format="json")
    assert response.status_code == 400 and "unknown field 'colour'" in response.json()["detail"]
    response = api.patch("/api/tools/post_webhook/", {"enabled": "no"}, format="json")
    assert response.status_code == 400
    response = api.patch("/api/tools/post_webhook/", {"enabled": False}, format="json")
    assert response.status_code == 200 and response.json()["enabled"] is False
    assert response.json()["effect"] == "non_idempotent_write"


def test_a_tool_no_longer_registered_is_a_non_idempotent_write_marked_not_registered(api):
    # A setting outlives its tool's removal from the code (or NRLLM_TOOLS).
    ToolSetting.objects.create(name="retired_tool", enabled=True)
    tools = {tool["name"]: tool for tool in api.get("/api/tools/").json()}
    assert tools["retired_tool"]["effect"] == "non_idempotent_write"
    assert tools["retired_tool"]["registered"] is False
    assert tools["search_notes"]["registered"] is True
    assert tools["search_notes"]["effect"] == "read_only"
    detail = api.get("/api/tools/retired_tool/").json()
    assert (detail["effect"], detail["registered"]) == ("non_idempotent_write", False)
    response = api.patch("/api/tools/retired_tool/", {"registered": True}, format="json")
    assert response.status_code == 400 and "registered is read-only" in response.json()["detail"]
    schema = json.loads(APIClient().get("/api/schema/?format=json").content)
    tool_schema = schema["components"]["schemas"]["Tool"]
    assert "registered" in tool_schema["required"]
    assert tool_schema["properties"]["registered"]["type"] == "boolean"


def test_a_tool_switched_through_the_api_is_in_the_admin_log(api, operator):
    response = api.patch("/api/tools/post_webhook/", {"enabled": False}, format="json")
    assert response.status_code == 200
    [entry] = LogEntry.objects.filter(
        content_type=ContentType.objects.get_for_model(ToolSetting), object_id="post_webhook"
    )
    assert (entry.user, entry.action_flag) == (operator, CHANGE)
    assert entry.get_change_message() == "Changed enabled through the API: true → false."
    # A refused request logs nothing; nor does a change whose entry cannot be written.
    api.patch("/api/tools/post_webhook/", {"enabled": "no"}, format="json")
    assert LogEntry.objects.count() == 1
    with admin_log_inserts_refused():
        refused = api.patch("/api/tools/post_webhook/", {"enabled": True}, format="json")
    assert (refused.status_code, refused.json()["code"]) == (503, "database_unavailable")
    assert ToolSetting.objects.get(name="post_webhook").enabled is False


def test_a_tool_deleted_while_its_patch_waits_for_the_lock_is_a_404(operator, api_token):
    """The PATCH finds the setting, then waits for its row lock; the holder
    deletes the row. The lock then finds nothing: 404, and no log entry."""
    ToolSetting.objects.update_or_create(name="post_webhook", defaults={"enabled": True})
    header = api_token(operator)
    responses = []

    def patch():
        try:
            client = APIClient(raise_request_exception=False)
            client.credentials(HTTP_AUTHORIZATION=header)
            responses.append(
                client.patch("/api/tools/post_webhook/", {"enabled": False}, format="json")
            )
        finally:
            connection.close()

    with transaction.atomic():
        ToolSetting.objects.select_for_update().get(name="post_webhook")
        thread = threading.Thread(target=patch)
        thread.start()
        _wait_for_a_row_lock_waiter()
        ToolSetting.objects.filter(name="post_webhook").delete()
    thread.join(timeout=30)
    [response] = responses
    assert (response.status_code, response.json()["code"]) == (404, "not_found")
    assert not LogEntry.objects.exists()


def _wait_for_a_row_lock_waiter(timeout=10.0):
    """Until another backend of this database waits on a lock (the PATCH's
    ``SELECT ... FOR UPDATE``)."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            # Inside a transaction pg_stat_activity is a snapshot: clear it.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.01)
    raise AssertionError("the PATCH never waited for the row lock")


@contextlib.contextmanager
def admin_log_inserts_refused():
    """A trigger refuses every insert into the admin log (dropped after: the
    test is transactional, DDL would outlive it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION refuse_log() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'admin log refused'; END $$; "
            "CREATE TRIGGER refuse_log BEFORE INSERT ON django_admin_log "
            "FOR EACH ROW EXECUTE FUNCTION refuse_log()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "DROP TRIGGER refuse_log ON django_admin_log; DROP FUNCTION refuse_log()"
            )
