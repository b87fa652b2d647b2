"""G19: a run's end is told at least once. The event is recorded by the
database in the statement that changes the run's status, whichever path
changes it; the process that ended the run tries it once, and every reaper
pass delivers what is due, with backoff, until a 2xx answer or the last
attempt. The receiver is a real local HTTP server, reached through the SSRF
guard with its address allowed literally; the workers are real rqworkers.
Retries are driven by the reaper's ``as_of``, never by sleeping."""

import contextlib
import hashlib
import hmac
import json
import sqlite3

import pytest
import schemathesis

from nrllm_ops.wsgi import application
from runs import transitions
from runs.approvals import actions as approval_actions
from runs.models import ApprovalRequest, RunEvent
from runs.models.vocabulary import ApprovalStatus, RunStatus
from runs.operators import actions as operator_actions
from runs.reaper import reap_stale_runs
from runs.run_webhooks import outbox
from runs.runtime import enqueue
from tests.drifting_model import NOTIFY, request_for
from tests.helpers import fresh, later, manage, scripted, sqlite_env, stored
from tests.webhook_receiver import SECRET, TOKEN, Receiver

pytestmark = pytest.mark.django_db(transaction=True)


def events_of(agent_run) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run=agent_run).order_by("occurred_at"))


def checked_body(headers: dict, body: bytes) -> dict:
    """The body, once its signature and headers are checked."""
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert headers["x-nrllm-signature-256"] == expected
    assert headers["content-type"] == "application/json"
    document = json.loads(body)
    assert headers["x-nrllm-event-id"] == document["event_id"]
    assert headers["x-nrllm-event"] == document["event"]
    return document


def test_each_end_is_told_once_per_event_id_once_the_receiver_comes_back(
    receiver, settings, operator, approvals, operator_client, caplog
):
    """Runs that complete, are dead-lettered, wait for approval, and then
    complete after an approval and after an operator's requeue, while the
    receiver refuses connections, then answers 503, then 200: each event is
    tried by the run's ender, retried by reaper passes, and delivered once."""
    webhook = {"webhook": receiver.url()}
    usage = {"prompt_tokens": 420, "completion_tokens": 85}
    completed = enqueue({**scripted({"content": "all done", "usage": usage}), **webhook})
    dead = enqueue({**scripted({"error": "auth", "attempts": 1}, {"content": "fine"}), **webhook})
    waiting = enqueue(
        {
            **request_for(
                "scripted", [{"calls": [NOTIFY]}, {"answer": "sent"}], ["send_notification"]
            ),
            **webhook,
        }
    )
    silent = enqueue(scripted({"content": "nobody asked"}))
    (approval,) = ApprovalRequest.objects.filter(run=waiting, status=ApprovalStatus.PENDING)
    assert approval_actions.approve(approval, operator, digest=approval.digest).ok
    assert operator_actions.requeue(fresh(dead), operator, "the key is fixed").ok

    assert [fresh(r).status for r in (completed, dead, waiting, silent)] == ["completed"] * 4
    assert events_of(silent) == []
    types = {r.pk: [e.event_type for e in events_of(r)] for r in (completed, dead, waiting)}
    assert types == {
        completed.pk: ["run.completed"],
        dead.pk: ["run.failed", "run.completed"],
        waiting.pk: ["run.waiting_for_approval", "run.completed"],
    }
    events = list(RunEvent.objects.all())
    assert len({event.pk for event in events}) == 5
    # The ender tried each once; nothing listened.
    assert {(e.attempts, e.last_status, e.delivered_at) for e in events} == {(1, None, None)}
    assert all(e.last_error.startswith("ConnectError") for e in events), events[0].last_error
    assert all(e.next_attempt_at > e.last_attempt_at for e in events)

    # The allow list no longer names the host: a failed attempt that says why.
    settings.NRLLM_HTTP_ALLOWED_HOSTS = []
    assert reap_stale_runs(as_of=later(60)).webhooks.count("failed") == 5
    refused = RunEvent.objects.get(run=completed)
    assert refused.attempts == 2 and "is not in NRLLM_HTTP_ALLOWED_HOSTS" in refused.last_error
    assert TOKEN not in refused.last_error and "/hooks" not in refused.last_error

    settings.NRLLM_HTTP_ALLOWED_HOSTS = [f"127.0.0.1:{receiver.port}"]
    receiver.start()
    receiver.status, receiver.body = 503, f"<b>down</b> for /hooks/runs?token={TOKEN}"
    assert reap_stale_runs(as_of=later(600)).webhooks.count("rejected") == 5
    page = operator_client.get(f"/admin/runs/agentrun/{completed.pk}/change/").content.decode()
    assert "Webhook deliveries (1)" in page and "answered 503: &lt;b&gt;down&lt;/b&gt;" in page
    assert TOKEN not in page.split("Webhook deliveries")[1].split("</table>")[0]

    receiver.status, receiver.body = 200, "ok"
    assert reap_stale_runs(as_of=later(3600)).webhooks.count("delivered") == 5
    assert reap_stale_runs(as_of=later(7200)).webhooks.outcomes == {}
    assert receiver.delivered() == {str(event.pk): 1 for event in events}
    assert len(receiver.posts) == 10  # the 503s and the 200s: one event never twice at once

    bodies = {}
    for headers, body in receiver.posts[5:]:
        document = checked_body(headers, body)
        bodies[(document["run"]["id"], document["event"])] = document
    first = bodies[(str(dead.pk), "run.failed")]["run"]
    assert (first["status"], first["termination_reason"], first["failure_class"]) == (
        "failed",
        "not_retryable",
        "auth",
    )
    assert first["dead_lettered"] is True and first["output"] == ""
    done = bodies[(str(completed.pk), "run.completed")]
    assert done["attempt"] == 4 and done["run"]["output"] == "all done"
    assert done["run"]["dead_lettered"] is False and done["run"]["agent"] is None
    assert done["run"]["cost"] is None  # the scripted model has no price: unknown, never 0
    assert done["run"]["tokens"] == {"prompt": 420, "completion": 85, "cached": 0, "total": 505}
    assert done["run"]["admin_path"] == f"/admin/runs/agentrun/{completed.pk}/change/"
    assert bodies[(str(waiting.pk), "run.waiting_for_approval")]["run"]["status"] == (
        "waiting_for_approval"
    )

    # The API shows each delivery.
    listed = operator_client.get(f"/api/runs/{dead.pk}/webhook-deliveries/").json()
    assert [(d["event"], d["attempts"], d["delivery"], d["last_status"]) for d in listed] == [
        ("run.failed", 4, "delivered", 200),
        ("run.completed", 4, "delivered", 200),
    ]
    assert listed[0]["target"] == f"http://127.0.0.1:{receiver.port}/…"
    assert listed[0]["next_attempt_at"] is None and listed[0]["dead_lettered"] is True
    assert caplog.records and all(TOKEN not in r.getMessage() for r in caplog.records)


def test_the_deliveries_api_keeps_to_its_schema_and_an_event_is_given_up_after_its_last_attempt(
    receiver, settings, queue, operator, api_token
):
    """An operator's cancel of a queued run is recorded as any end; a
    receiver that always answers 500 gets the event until the last attempt,
    and never again after it. Two deliverers claiming one attempt: one wins."""
    settings.NRLLM_RUN_WEBHOOK_MAX_ATTEMPTS = 2
    receiver.start()
    receiver.status = 500
    agent_run = enqueue({**scripted({"content": "never"}), "webhook": receiver.url()})
    assert operator_actions.cancel(fresh(agent_run), operator, "not needed").ok
    (event,) = events_of(agent_run)
    assert (event.event_type, event.status, event.attempts) == ("run.cancelled", "cancelled", 0)
    assert outbox.claim(event.pk, 0) is not None
    assert outbox.claim(event.pk, 0) is None  # the other deliverer: taken
    RunEvent.objects.filter(pk=event.pk).update(attempts=0, next_attempt_at=event.occurred_at)

    for hours in (1, 2, 3):
        reap_stale_runs(as_of=later(3600 * hours))
    event.refresh_from_db()
    assert (event.attempts, event.last_status, event.delivered_at) == (2, 500, None)
    assert event.gave_up_at is not None and len(receiver.posts) == 2

    operation = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)[
        "/api/runs/{id}/webhook-deliveries/"
    ]["GET"]
    case = operation.Case(path_parameters={"id": str(agent_run.pk)})
    response = case.call_and_validate(headers={"Authorization": api_token(operator)})
    (delivery,) = response.json()
    assert (delivery["delivery"], delivery["next_attempt_at"]) == ("gave_up", None)


def test_a_status_changed_by_the_reaper_is_recorded_with_its_dead_letter_and_delivered(
    receiver, settings
):
    """Not a worker's settle: the reaper's bulk UPDATE dead-letters a run
    whose lease expired, and the same pass delivers its event."""
    settings.NRLLM_MAX_REQUEUES = 0
    receiver.start()
    agent_run = transitions.create_queued_run(
        stored({**scripted({"content": "x"}), "webhook": receiver.url()}), "p"
    )
    assert transitions.claim(agent_run.pk, "gone-worker", 30) is not None

    report = reap_stale_runs(as_of=later())

    assert report.decisions[str(agent_run.pk)] == "dead_lettered: retries_exhausted"
    assert report.webhooks.outcomes == {"delivered": 1}
    (event,) = events_of(agent_run)
    assert (event.event_type, event.dead_lettered, event.attempts) == ("run.failed", True, 1)
    (headers, body) = receiver.posts[0]
    run = checked_body(headers, body)["run"]
    assert (run["termination_reason"], run["dead_lettered"]) == ("retries_exhausted", True)


@pytest.mark.worker
@pytest.mark.parametrize("model", ["scripted", "drifting"], indirect=True)
def test_a_worker_killed_after_the_settle_leaves_the_event_to_the_reaper(model, receiver, workers):
    """The receiver holds the worker's first POST; the test kills the worker
    there, after the settle committed. The reaper's pass delivers it."""
    receiver.start()
    receiver.holding = 1
    plan = [{"answer": "shipped (take {take})"}]
    agent_run = enqueue(
        {**request_for("drifting" if model else "scripted", plan, []), "webhook": receiver.url()}
    )
    worker = workers.start(NRLLM_RUN_WEBHOOK_SECRET=SECRET)
    assert receiver.wait_held(1), "the worker never posted"
    assert fresh(agent_run).status == RunStatus.COMPLETED
    workers.kill(worker)
    receiver.release.set()
    (event,) = events_of(agent_run)
    assert (event.attempts, event.delivered_at) == (1, None)

    assert reap_stale_runs(as_of=later(60)).webhooks.outcomes == {"delivered": 1}

    assert receiver.delivered() == {str(event.pk): 1}
    assert len(receiver.posts) == 2  # the held one, answered to nobody, and the reaper's
    document = checked_body(*receiver.posts[1])
    assert document["event_id"] == str(event.pk) and document["attempt"] == 2
    expected = fresh(agent_run).output
    assert document["run"]["output"] == expected
    assert ("take 1" in expected) if model else (expected == "shipped (take same)")


def test_on_sqlite_the_triggers_record_every_end_and_outlive_a_migrate(tmp_path, migrated):
    """The embedded default: ``run_agent`` tells the receiver itself, a
    dead-lettered run is marked so, and ``migrate`` puts back a trigger a
    table rebuild would have dropped."""
    receiver = Receiver()
    receiver.start()
    database = tmp_path / "hooks.sqlite3"
    env = sqlite_env(
        database,
        NRLLM_HTTP_ALLOWED_HOSTS=f"127.0.0.1:{receiver.port}",
        NRLLM_RUN_WEBHOOK_SECRET=SECRET,
        NRLLM_EXECUTE_IN_CALLER="true",
    )
    try:
        migrated(database)
        with contextlib.closing(sqlite3.connect(database)) as db:
            db.execute("DROP TRIGGER nrllm_run_event")  # as a rebuild of the runs table does
            db.execute("DROP TRIGGER nrllm_team_never_changes_runs_agentrun")  # so, too
            db.commit()
        again = manage("migrate", "--noinput", env=env)
        assert again.returncode == 0, again.stderr[-2000:]
        request = json.dumps({**scripted({"content": "hi"}), "webhook": receiver.url()})
        ran = manage("run_agent", "-", env=env, stdin=request)
        assert ran.returncode == 0, ran.stderr[-2000:]
        failing = {**scripted({"error": "auth"}), "webhook": receiver.url()}
        script = f"from runs.runtime import enqueue\nenqueue({failing!r})"
        assert manage("shell", "-c", script, env=env).returncode == 0
        with contextlib.closing(sqlite3.connect(database)) as db:
            rows = db.execute(
                "SELECT event_type, dead_lettered, attempts, delivered_at IS NOT NULL, "
                "length(id) FROM runs_runevent ORDER BY occurred_at"
            ).fetchall()
            # A run's team never changes (G22): the guard came back too.
            db.execute(
                "INSERT INTO teams_team (name, slug, require_approval, webhook_secret, created_at)"
                " VALUES ('Other', 'other', '[]', '', '2026-12-05')"
            )
            with pytest.raises(sqlite3.DatabaseError, match="team of an agent or a run never"):
                db.execute("UPDATE runs_agentrun SET team_id = (SELECT max(id) FROM teams_team)")
    finally:
        receiver.stop()
    assert rows == [("run.completed", 0, 1, 1, 32), ("run.failed", 1, 1, 1, 32)]
    documents = [checked_body(headers, body) for headers, body in receiver.posts]
    assert [(d["event"], d["run"]["output"]) for d in documents] == [
        ("run.completed", "hi"),
        ("run.failed", ""),
    ]
    assert receiver.delivered() == {d["event_id"]: 1 for d in documents}
