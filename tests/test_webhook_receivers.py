"""What a webhook's receiver does reaches no other run and no log (G19, G14,
G15): a receiver that holds its answer holds none of the worker's database
connections meanwhile, and one that echoes the token of its URL back has
it scrubbed from every log line, stored error, API answer and page.

The receiver is a real local HTTP server (``tests.webhook_receiver``), the
worker a real ``rqworker`` process with the concurrent worker and a small
connection pool; the reaper's retries are driven by its ``as_of``."""

import base64
import logging
import re
import signal

import pytest

from runs import transitions
from runs.models import RunEvent
from runs.models.vocabulary import RunStatus
from runs.operators import actions as operator_actions
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from tests.approval_requests import waiting
from tests.drifting_model import NOTIFY, request_for
from tests.helpers import fresh, later, scripted, stored, wait_until
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)

#: A path segment and a query value that are credentials, percent-encoded
#: as the URL holds them (decoded: ``T0-SECRET+path``, ``q SECRET/query``).
PATH_TOKEN = "T0-SECRET%2Bpath"
QUERY_TOKEN = "q%20SECRET%2Fquery"
HOOK = f"/hooks/{PATH_TOKEN}/runs?token={QUERY_TOKEN}&team=ops"
#: Every token above has it, in every form: no piece of one may be shown.
SECRET = "SECRET"
ONE_CALL = [{"calls": [NOTIFY]}, {"answer": "sent"}]
#: The worker holds runs in threads, and a pool of four connections.
SMALL_POOL = {
    "NRLLM_WORKER_CLASS": "runs.worker.ConcurrentWorker",
    "NRLLM_WORKER_CONCURRENCY": 8,
    "DATABASE_POOL_MAX_SIZE": 4,
    "DATABASE_POOL_TIMEOUT_SECONDS": 2,
}


@pytest.fixture
def receiver(settings):
    receiver = Receiver()
    settings.NRLLM_HTTP_ALLOWED_HOSTS = [f"127.0.0.1:{receiver.port}"]
    receiver.start()
    yield receiver
    receiver.stop()


def echoes(url: str) -> dict[str, str]:
    """How a receiver may echo the secret parts of ``url`` back."""
    return {
        "the URL": url,
        "the path segment": PATH_TOKEN,
        "the path segment decoded": "T0-SECRET+path",
        "the query value": QUERY_TOKEN,
        "the query value decoded": "q SECRET/query",
        "the query value encoded otherwise": "q+SECRET%2fquery",
    }


@pytest.mark.worker
def test_receivers_holding_their_answers_keep_no_connection_from_a_plain_run(
    receiver, settings, queue, workers, approvals, operator
):
    """Four POSTs held by the receiver — two runs' enders, an approval
    webhook after a park, and the reaper's delivery in a job of the same
    worker — with a pool of four: a plain run is claimed and completes
    while they wait. Each POST held its connection before: the plain run's
    claim found the pool empty and it stayed queued."""
    receiver.holding = 4
    worker = workers.start(
        **SMALL_POOL,
        NRLLM_RUN_WEBHOOK_TIMEOUT_SECONDS=60,
        NRLLM_APPROVAL_WEBHOOK_URL=receiver.url("/hooks/approvals"),
        NRLLM_APPROVAL_WEBHOOK_TIMEOUT_SECONDS=60,
    )
    webhook = {"webhook": receiver.url()}
    ended = [enqueue({**scripted({"content": f"done {i}"}), **webhook}) for i in range(2)]
    assert receiver.wait_held(2), "the runs' enders never posted"
    parked = enqueue(request_for("scripted", ONE_CALL, ["send_notification"]))
    assert receiver.wait_held(3), "the approval webhook never posted"
    # An event only the reaper delivers: an operator's cancel of a queued run.
    cancelled = transitions.create_queued_run(stored({**scripted({"content": "x"}), **webhook}), "")
    assert operator_actions.cancel(fresh(cancelled), operator, "not needed").ok
    queue.enqueue("runs.jobs.reap_job")
    assert receiver.wait_held(4), "the reaper never posted"

    plain = enqueue(scripted({"content": "plain"}))

    wait_until(lambda: fresh(plain).status == RunStatus.COMPLETED, timeout=60, what="the plain run")
    assert receiver.held == 4 and not receiver.release.is_set()
    assert fresh(parked).status == RunStatus.WAITING_FOR_APPROVAL
    receiver.release.set()
    # Answered at last, each attempt is recorded on a connection it gets back.
    wait_until(
        lambda: RunEvent.objects.filter(delivered_at__isnull=False).count() == 3,
        timeout=60,
        what="the held events delivered",
    )
    assert {event.run_id for event in RunEvent.objects.all()} == {
        *(run.pk for run in ended),
        cancelled.pk,
    }
    workers.signal(worker, signal.SIGTERM)
    output, _ = worker.communicate(timeout=60)
    assert b"couldn't get a connection" not in output


@pytest.mark.worker
def test_a_token_the_receiver_echoes_is_in_no_log_stored_error_api_answer_or_page(
    receiver, settings, workers, approvals, operator_client, caplog
):
    """The URL's path segment and query value are credentials. The receiver
    refuses, echoing them back: all at once to a worker's first attempt and
    its approval webhook, then each alone (as sent, decoded, encoded
    otherwise) to the reaper's retries and to approval webhooks in this
    process. No form of either is in the worker's output, a log record,
    ``last_error``, the deliveries API or the run's page — except the run's
    request itself, which whoever may view the run sees whole (docs/api.md)."""
    url = receiver.url(HOOK)
    forms = echoes(url)
    receiver.status, receiver.body = 403, "no hook: " + " ".join(forms.values())
    agent_run = enqueue({**scripted({"content": "done"}), "webhook": url})
    enqueue(request_for("scripted", ONE_CALL, ["send_notification"]))
    output = workers.run_burst(**SMALL_POOL, NRLLM_APPROVAL_WEBHOOK_URL=url)
    assert "approval webhook answered 403: no hook: " in output
    assert "attempt 1 not delivered: answered 403: no hook: " in output
    assert SECRET not in output
    (event,) = RunEvent.objects.filter(run=agent_run)
    assert SECRET not in event.last_error and event.last_error.startswith("answered 403: no hook")

    settings.REDIS_URL = ""  # from here on runs execute in this process
    settings.NRLLM_APPROVAL_WEBHOOK_URL = url
    caplog.set_level(logging.INFO)
    for hours, (name, form) in enumerate(forms.items(), start=1):
        receiver.body = f"bad token ({name}): {form}"
        assert reap_stale_runs(as_of=later(3600 * hours)).webhooks.outcomes == {"rejected": 1}
        event.refresh_from_db()
        assert event.last_error.startswith(f"answered 403: bad token ({name}): "), name
        assert SECRET not in event.last_error, name
        waiting(plan=ONE_CALL)
        assert f"approval webhook answered 403: bad token ({name}): " in caplog.text
    assert len(receiver.posts) == 2 + 2 * len(forms)
    assert SECRET not in caplog.text

    listed = operator_client.get(f"/api/runs/{agent_run.pk}/webhook-deliveries/")
    assert listed.status_code == 200 and SECRET not in listed.content.decode()
    page = operator_client.get(f"/admin/runs/agentrun/{agent_run.pk}/change/").content.decode()
    assert "answered 403: bad token (the query value encoded otherwise): …" in page
    request = re.search(r'<details id="request-json">.*?</details>', page, re.DOTALL)
    assert SECRET in request.group()  # the request as stored: the URL whole
    assert SECRET not in page.replace(request.group(), "")


def test_user_info_a_receiver_echoes_as_it_got_it_is_in_no_log_or_stored_error(
    receiver, operator_client, caplog
):
    """A URL's user info never reaches the receiver as written: the HTTP
    client sends it as ``Authorization: Basic`` and the base64 of
    ``user:password``, and that is what a receiver naming the credentials it
    refused echoes. It is hidden as the user name and password are."""
    url = receiver.url("/hooks/runs").replace("://", "://robot:pw-SECRET-7@")
    basic = base64.b64encode(b"robot:pw-SECRET-7").decode()
    receiver.status, receiver.body, receiver.echo_authorization = 401, "refused", True
    caplog.set_level(logging.INFO)
    agent_run = enqueue({**scripted({"content": "done"}), "webhook": url})
    (event,) = RunEvent.objects.filter(run=agent_run)
    assert receiver.posts[0][0]["authorization"] == f"Basic {basic}"
    assert event.last_error == "answered 401: refused Basic …"
    assert "not delivered: answered 401: refused Basic …" in caplog.text
    listed = operator_client.get(f"/api/runs/{agent_run.pk}/webhook-deliveries/")
    for shown in (caplog.text, listed.content.decode()):
        assert basic not in shown and SECRET not in shown
