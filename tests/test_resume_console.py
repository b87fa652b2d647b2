"""What operators see of resume (G12), in the admin and through the API:
per attempt what was replayed and what ran live, the tokens replay saved,
and what a requeue or a restart will do before they confirm it."""

import pytest

from runs.models import AgentRun
from runs.runtime import enqueue
from tests.drifting_model import openai_request
from tests.fake_openai import error
from tests.helpers import answer, call, retried_when_due, scripted
from tools.models import OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/runs/agentrun/"
NOTIFY = call("send_notification", recipient="ops", message="v2 is out")


def retried_after_a_write(drifting_model):
    """A run that sent a notification, hit a 500, and resumed on the retry."""
    drifting_model.fail_turn(1, error(500))
    plan = [
        {
            "calls": [
                {"name": "send_notification", "arguments": {"recipient": "ops", "message": "v2"}}
            ]
        },
        {"answer": "sent (take {take})"},
    ]
    agent_run = enqueue(openai_request("notify", plan, ["send_notification"]))
    retried_when_due()
    return AgentRun.objects.get(pk=agent_run.pk)


def failed_after_a_write():
    agent_run = enqueue(
        scripted(NOTIFY, {"error": "auth", "attempts": 1}, answer(), tools=["send_notification"])
    )
    return AgentRun.objects.get(pk=agent_run.pk)


def test_the_run_page_shows_each_attempt_and_the_tokens_replay_saved(
    drifting_model, operator_client
):
    agent_run = retried_after_a_write(drifting_model)
    assert agent_run.status == "completed"
    page = operator_client.get(f"{RUNS}{agent_run.pk}/change/").content.decode()
    assert "Attempts (2)" in page
    assert "nothing: from the start" in page  # attempt 1
    assert (
        "resumed after step 3: 1 model turns and 1 tool results replayed (1 writes not repeated)"
        "; 18 model tokens saved" in page
    )
    assert "1 model turns, 0 tool calls (0 writes executed)" in page  # attempt 2, live
    assert "Replay saved 18 model tokens in all." in page
    assert OutboxNotification.objects.count() == 1


def test_the_requeue_and_restart_confirmations_say_what_each_will_do(operator_client):
    agent_run = failed_after_a_write()
    selected = {"_selected_action": [agent_run.pk]}
    requeue = operator_client.post(RUNS, {"action": "requeue_selected", **selected})
    page = requeue.content.decode()
    assert "resumes from its journal" in page
    assert "will be requeued: " in page
    assert "resumes after step 3; replays 1 writes without repeating them" in page
    restart = operator_client.post(RUNS, {"action": "restart_selected", **selected})
    page = restart.content.decode()
    assert "from the beginning" in page and "refused (non_idempotent_executed):" in page
    assert "step 3 executed the non_idempotent_write &#x27;send_notification&#x27;" in page

    # Confirmed, the requeue resumes; the notification is not sent again.
    done = operator_client.post(
        RUNS, {"action": "requeue_selected", "confirm": "yes", "note": "retry", **selected}
    )
    assert done.status_code == 302
    assert AgentRun.objects.get(pk=agent_run.pk).status == "completed"
    assert OutboxNotification.objects.count() == 1


def test_the_restart_button_restarts_a_run_that_is_safe_to_restart(operator_client):
    agent_run = AgentRun.objects.get(
        pk=enqueue(
            scripted(
                call("search_notes", query="x"),
                {"error": "auth", "attempts": 1},
                answer("found"),
                tools=["search_notes"],
            )
        ).pk
    )
    page = operator_client.get(f"{RUNS}{agent_run.pk}/change/").content.decode()
    assert 'id="restart-button"' in page and "safe to restart" in page
    # It failed on auth, which a restart meets again unless fixed: asked first.
    asked = operator_client.post(f"{RUNS}{agent_run.pk}/restart/", {"note": "fresh start"})
    assert asked.status_code == 200 and "Restart anyway" in asked.content.decode()
    assert not agent_run.steps.filter(kind="operator").exists()
    form = {"note": "fresh start", "confirm": "yes"}
    response = operator_client.post(f"{RUNS}{agent_run.pk}/restart/", form)
    assert response.status_code == 302
    agent_run.refresh_from_db()
    assert agent_run.status == "completed"
    operator_step = agent_run.steps.get(kind="operator")
    assert operator_step.result["action"] == "restart"
    assert agent_run.journal_begins_after == operator_step.sequence
    # Run from the beginning: the search ran again, and nothing was replayed.
    assert agent_run.steps.filter(kind="tool").count() == 2
    assert not agent_run.steps.filter(kind="resume").exists()


def test_a_viewer_may_not_restart(viewer_client):
    agent_run = failed_after_a_write()
    page = viewer_client.get(f"{RUNS}{agent_run.pk}/change/").content.decode()
    assert 'id="restart-button"' not in page
    assert viewer_client.post(f"{RUNS}{agent_run.pk}/restart/", {}).status_code == 403
    response = viewer_client.post(
        RUNS, {"action": "restart_selected", "_selected_action": [agent_run.pk]}
    )
    assert response.status_code == 403


def test_the_api_gives_each_verdict_and_restarts_only_what_is_safe(api, viewer, api_token):
    agent_run = failed_after_a_write()
    verdict = api.get(f"/api/runs/{agent_run.pk}/requeue/").json()
    assert verdict["allowed"] and verdict["code"] == "safe"
    assert verdict["journal"] == {
        "last_sequence": 3,
        "model_turns": 1,
        "tool_results": 1,
        "writes": 1,
    }
    assert verdict["reason"].startswith("resumes after step 3; replays 1 writes")
    restart = api.get(f"/api/runs/{agent_run.pk}/restart/").json()
    assert (restart["allowed"], restart["code"], restart["journal"]) == (
        False,
        "non_idempotent_executed",
        None,
    )
    refused = api.post(f"/api/runs/{agent_run.pk}/restart/", {}, format="json")
    assert refused.status_code == 409 and refused.json()["code"] == "non_idempotent_executed"
    assert api.get("/api/runs/nope/restart/").status_code == 404

    from rest_framework.test import APIClient

    looker = APIClient()
    looker.credentials(HTTP_AUTHORIZATION=api_token(viewer))
    assert looker.get(f"/api/runs/{agent_run.pk}/requeue/").status_code == 200
    assert looker.post(f"/api/runs/{agent_run.pk}/requeue/", {}, format="json").status_code == 403

    requeued = api.post(f"/api/runs/{agent_run.pk}/requeue/", {"note": "go"}, format="json")
    assert requeued.status_code == 202
    assert requeued.json()["detail"].startswith("requeued: resumes after step 3")
    run = api.get(f"/api/runs/{agent_run.pk}/").json()
    assert run["status"] == "completed" and run["journal_begins_after"] == 0
    assert OutboxNotification.objects.count() == 1
    kinds = [step["kind"] for step in api.get(f"/api/runs/{agent_run.pk}/steps/").json()["results"]]
    assert kinds == ["request", "llm", "tool", "operator", "request", "resume", "llm"]
