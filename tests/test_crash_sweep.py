"""A crash at every step boundary (G4–G7, G12), against a model that words
every answer differently.

One run mixes a read, an idempotent write, a non-idempotent webhook, and a
turn with a notification and an idempotent note: eleven steps. For each
boundary in turn a real rqworker is SIGKILLed while it waits on what comes
after a durable step — a model call, a tool's HTTP call, or the record of a
write that has just run (held by a database lock) — then the reaper acts
and another worker finishes. At every crash point: no non-idempotent call
ran twice, no recorded model turn was asked for again, and the run ended
``completed`` or, if a non-idempotent write was in flight, dead-lettered
``write_interrupted``.
"""

import contextlib
from datetime import timedelta

import pytest
from django.utils import timezone

from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from tests.drifting_model import openai_request
from tests.helpers import step_inserts_held, wait_until
from tools.models import Note, OutboxNotification

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.slow]

TOOLS = ["http_get", "put_webhook", "post_webhook", "send_notification", "upsert_note"]

# (where the worker is when it is killed, how the run must end)
CRASH_POINTS = [
    ("model turn 0", "completed"),
    ("http_get", "completed"),
    ("model turn 1", "completed"),
    ("put_webhook", "completed"),
    ("model turn 2", "completed"),
    ("post_webhook", "write_interrupted"),
    ("model turn 3", "completed"),
    ("record of send_notification", "write_interrupted"),
    ("record of upsert_note", "completed"),
    ("model turn 4", "completed"),
]


def plan_for(http_server, crash_point: str) -> list[dict]:
    """The plan; the HTTP call the crash point names goes to the server's
    holding path, the others are answered at once."""

    def url(tool, path):
        return http_server.url(f"/hold{path}" if crash_point == tool else path)

    return [
        {"calls": [{"name": "http_get", "arguments": {"url": url("http_get", "/read")}}]},
        {
            "calls": [
                {
                    "name": "put_webhook",
                    "arguments": {"url": url("put_webhook", "/put"), "payload": "take {take}"},
                }
            ]
        },
        {
            "calls": [
                {
                    "name": "post_webhook",
                    "arguments": {"url": url("post_webhook", "/post"), "payload": "take {take}"},
                }
            ]
        },
        {
            "calls": [
                {
                    "name": "send_notification",
                    "arguments": {"recipient": "ops", "message": "take {take}"},
                },
                {"name": "upsert_note", "arguments": {"slug": "sweep", "body": "take {take}"}},
            ]
        },
        {"answer": "done (take {take})"},
    ]


@pytest.mark.parametrize(("crash_point", "expected"), CRASH_POINTS)
def test_a_sigkill_at_each_step_boundary_never_repeats_a_write_nor_a_recorded_turn(
    crash_point, expected, drifting_model, http_server, workers, settings
):
    settings.NRLLM_TOOLS = ["tests.tools_for_tests.IdempotentWebhook"]
    agent_run = enqueue(openai_request("sweep", plan_for(http_server, crash_point), TOOLS))
    held_turn = None
    with contextlib.ExitStack() as stack:
        if crash_point.startswith("model turn"):
            held_turn = int(crash_point.rsplit(" ", 1)[1])
            drifting_model.hold_turn(held_turn)
        elif crash_point.startswith("record of"):
            tool = crash_point.removeprefix("record of ")
            waiting, end_the_wait = stack.enter_context(
                step_inserts_held(f"NEW.tool_name = '{tool}'")
            )
        worker = workers.start(NRLLM_LEASE_SECONDS=2)
        if held_turn is not None:
            assert drifting_model.held.wait(timeout=30), f"{crash_point} never came"
        elif crash_point.startswith("record of"):
            wait_until(waiting, timeout=30, what=f"the {crash_point} waiting")
        else:
            assert http_server.held.wait(timeout=30), f"{crash_point} never reached the server"
        workers.kill(worker)
        if crash_point.startswith("record of"):
            end_the_wait()
    drifting_model.release.set()
    http_server.release.set()

    reap_stale_runs(as_of=timezone.now() + timedelta(hours=1))
    workers.run_burst()

    agent_run.refresh_from_db()
    outcome = agent_run.status if agent_run.status == "completed" else agent_run.termination_reason
    assert outcome == expected, (agent_run.status, agent_run.termination_reason)
    requests = {path: 0 for path in ("/read", "/put", "/post")}
    for received in http_server.received:
        requests[received.path.removeprefix("/hold")] += 1
    notifications = OutboxNotification.objects.filter(run_id=agent_run.pk).count()
    # Never twice: the non-idempotent calls, whatever the wording of the retry.
    assert requests["/post"] <= 1 and notifications <= 1
    # No recorded model turn is asked for again; only the one in flight is.
    for turn, count in drifting_model.requests_by_turn.items():
        assert count <= (2 if turn == held_turn else 1), drifting_model.requests_by_turn
    if expected == "completed":
        assert requests["/post"] == 1 and notifications == 1
        assert Note.objects.get(slug="sweep").body.startswith("take ")
        # An idempotent write interrupted mid-call runs again with the same key.
        keys = {r.headers["Idempotency-Key"] for r in http_server.received if "/put" in r.path}
        assert len(keys) == 1
        assert agent_run.steps.filter(kind="llm").count() == 5
