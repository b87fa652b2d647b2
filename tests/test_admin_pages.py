"""The read-only admin pages render, and history cannot be edited from them."""

import pytest
from django.db import transaction

from runs import transitions
from runs.models import AgentRun
from runs.models.faults import step_inserts_refused
from runs.runtime import enqueue, run
from tests.helpers import answer, call, scripted

pytestmark = pytest.mark.django_db


@pytest.fixture
def runs_of_every_kind(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        run(
            scripted(
                call("search_notes", query="<script>alert(1)</script>"),
                answer("ok"),
                tools=["search_notes"],
            )
        )
        with step_inserts_refused("send_notification"):
            run(
                scripted(
                    call("send_notification", recipient="a", message="b"),
                    answer(),
                    tools=["send_notification"],
                )
            )
        enqueue(scripted({"error": "auth"}))
    with transaction.atomic():
        cancelled = enqueue(scripted(answer()))
        transitions.cancel(cancelled.pk)
    return AgentRun.objects.all()


def test_run_pages_render_and_escape_what_a_model_or_tool_produced(
    admin_client, runs_of_every_kind
):
    listing = admin_client.get("/admin/runs/agentrun/")
    assert listing.status_code == 200
    for agent_run in runs_of_every_kind:
        page = admin_client.get(f"/admin/runs/agentrun/{agent_run.pk}/change/")
        assert page.status_code == 200
        assert b"<script>alert(1)</script>" not in page.content
    assert admin_client.get("/admin/runs/deadletter/").status_code == 200
    assert admin_client.get("/admin/tools/toolsetting/").status_code == 200


def test_runs_and_steps_cannot_be_added_changed_or_deleted(admin_client, runs_of_every_kind):
    agent_run = runs_of_every_kind[0]
    assert admin_client.get("/admin/runs/agentrun/add/").status_code == 403
    assert admin_client.get(f"/admin/runs/agentrun/{agent_run.pk}/delete/").status_code == 403
    response = admin_client.post(
        f"/admin/runs/agentrun/{agent_run.pk}/change/", {"status": "completed"}
    )
    assert response.status_code == 403
    assert AgentRun.objects.get(pk=agent_run.pk).status == agent_run.status
