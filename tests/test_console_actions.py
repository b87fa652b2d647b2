"""What the console says after an action (issue #30, part 4), and what it
asks before one: the message and the run page tell what the run did since
the action as the database holds it — in-process runs here, so the run has
run on by the time the page comes back — linking what it opened; a requeue
of a failure that would come again asks first, with the warning; the run
page decides a waiting call inline, bound and permission-checked as the
inbox is; the dead letter's page requeues or dismisses."""

import html
import re

import pytest

from runs import transitions
from runs.models import ApprovalRequest, DeadLetter
from runs.models.vocabulary import ApprovalStatus, RunStatus
from runs.runtime import enqueue
from tests.helpers import answer, call, fresh, scripted, stored
from tests.test_console import audit_failed_run

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/runs/agentrun/"
DEAD_LETTERS = "/admin/runs/deadletter/"
CLOCK = r"\d\d:\d\d:\d\d UTC"


def page_of(agent_run) -> str:
    return f"{RUNS}{agent_run.pk}/change/"


def messages_on(response) -> list[str]:
    """The messages of a page, as a reader sees them (tags dropped)."""
    content = response.content.decode()
    found = re.findall(r'<li class="(?:success|warning|error|info)">(.*?)</li>', content, re.S)
    return [html.unescape(re.sub(r"<[^>]+>", "", text)) for text in found]


def auth_failed_run(prompt="Summarise the incidents"):
    """Searched, then its model refused the key: dead-lettered not_retryable (auth)."""
    return fresh(
        enqueue(
            scripted(
                call("search_notes", query="incident"),
                {"error": "auth"},
                tools=["search_notes"],
                prompt=prompt,
            )
        )
    )


def test_a_requeue_of_an_auth_failure_asks_first_then_says_it_failed_again(operator_client):
    agent_run = auth_failed_run()
    (first,) = DeadLetter.objects.filter(run=agent_run)
    page = operator_client.get(page_of(agent_run)).content.decode()
    assert 'id="requeue-warning"' in page and "it failed with auth" in page

    asked = operator_client.post(f"{RUNS}{agent_run.pk}/requeue/", {"note": "key rotated"})

    assert asked.status_code == 200
    content = asked.content.decode()
    assert 'id="lasting-failure-warning"' in content
    assert "Likely to fail again: it failed with auth (the provider refused" in content
    assert 'value="key rotated"' in content and 'name="confirm" value="yes"' in content
    assert fresh(agent_run).steps.filter(kind="operator").count() == 0  # nothing done

    done = operator_client.post(
        f"{RUNS}{agent_run.pk}/requeue/", {"note": "key rotated", "confirm": "yes"}, follow=True
    )

    (second,) = DeadLetter.objects.filter(run=agent_run).exclude(pk=first.pk)
    (message,) = messages_on(done)
    assert re.fullmatch(
        rf"Requeued at {CLOCK}: resumes after step 3; .*; continues live\. Since then it "
        rf"failed again at its model call \(auth\): scripted auth failure, and opened dead "
        rf"letter #{second.pk}\.",
        message,
    ), message
    content = done.content.decode()
    assert f'href="/admin/runs/deadletter/{second.pk}/change/"' in content
    since = re.search(r'<p id="since-action">(.*?)</p>', content, re.S)[1]
    assert re.match(rf"<strong>Since your requeue at {CLOCK}</strong>: it failed again", since)
    assert f"dead letter #{second.pk}" in since


def test_a_requeue_the_failure_would_not_stop_is_not_asked_and_a_list_warns_per_run(
    operator_client,
):
    failed = auth_failed_run()
    cancelled = transitions.create_queued_run(stored(scripted(answer("ok"))), "p")
    operator_client.post(f"{RUNS}{cancelled.pk}/cancel/", {"note": "not now"})
    # A cancelled run is no lasting failure: requeued at once.
    response = operator_client.post(f"{RUNS}{cancelled.pk}/requeue/", {"note": "now"})
    assert response.status_code == 302
    assert fresh(cancelled).status == RunStatus.COMPLETED

    selected = {"action": "requeue_selected", "_selected_action": [failed.pk]}
    content = operator_client.post(RUNS, selected).content.decode()
    assert content.count('class="warning-box lasting-failure"') == 1
    assert "Requeue anyway" in content


def test_cancelling_a_queued_run_says_it_will_not_run(operator_client):
    agent_run = transitions.create_queued_run({"prompt": "p", "tools": []}, "p")

    response = operator_client.post(f"{RUNS}{agent_run.pk}/cancel/", {"note": "x"}, follow=True)

    (message,) = messages_on(response)
    assert re.fullmatch(rf"Cancelled at {CLOCK}: it will not run\.", message), message
    assert fresh(agent_run).status == RunStatus.CANCELLED


def test_a_reconciliation_says_what_a_requeue_would_now_do(operator_client):
    agent_run = audit_failed_run()

    response = operator_client.post(
        f"{RUNS}{agent_run.pk}/reconcile/",
        {"outcome": "not_applied", "note": "no page arrived"},
        follow=True,
    )

    (message,) = messages_on(response)
    assert message.startswith(
        "Reconciled: the write was recorded as not_applied. The run stays failed; "
        "a requeue: resumes after step 2"
    ), message


@pytest.mark.usefixtures("approvals")
def test_a_waiting_runs_page_approves_inline_and_says_what_the_run_did(operator_client):
    agent_run = fresh(
        enqueue(
            scripted(
                call("search_notes", query="release"),
                call("send_notification", recipient="team", message="<b>v2</b>"),
                answer("announced"),
                tools=["search_notes", "send_notification"],
            )
        )
    )
    (approval,) = ApprovalRequest.objects.filter(run=agent_run)
    page = operator_client.get(page_of(agent_run)).content.decode()
    form = re.search(
        r'<form method="post" action="([^"]+)" class="decide-form">.*?</form>', page, re.S
    )
    assert form[1] == f"{RUNS}approvals/{approval.pk}/decide/"
    assert f'name="digest" value="{approval.digest}"' in form[0]
    assert f'name="next" value="{page_of(agent_run)}"' in form[0]
    assert 'class="button deny-button"' in form[0] and "approve-button" in form[0]
    assert "call 1 of turn 2" in page and "&lt;b&gt;v2&lt;/b&gt;" in page

    response = operator_client.post(
        form[1],
        {"decision": "approve", "digest": approval.digest, "next": page_of(agent_run)},
        follow=True,
    )

    assert response.redirect_chain == [(page_of(agent_run), 302)]
    (message,) = messages_on(response)
    assert message.startswith("Call 1 of turn 2 (send_notification) of run ")
    assert message.endswith(
        ": approved; the run goes back to the queue. Since then it made 1 model call and "
        "1 tool call, and completed."
    ), message
    since = re.search(r'<p id="since-action">(.*?)</p>', response.content.decode(), re.S)[1]
    assert re.match(
        rf"<strong>Since your approval of call 1 of turn 2 \(send_notification\) at {CLOCK}"
        r"</strong>: it made 1 model call and 1 tool call, and completed\.",
        since,
    ), since
    assert fresh(agent_run).status == RunStatus.COMPLETED


@pytest.mark.usefixtures("approvals")
def test_the_run_page_offers_no_decision_without_the_permission(viewer_client):
    agent_run = fresh(
        enqueue(
            scripted(
                call("send_notification", recipient="team", message="m"),
                answer(),
                tools=["send_notification"],
            )
        )
    )
    page = viewer_client.get(page_of(agent_run)).content.decode()
    assert 'class="decide-form"' not in page and "runs.approve_write" in page
    (approval,) = ApprovalRequest.objects.filter(run=agent_run)
    crafted = viewer_client.post(
        f"{RUNS}approvals/{approval.pk}/decide/",
        {"decision": "approve", "digest": approval.digest, "next": page_of(agent_run)},
    )
    assert crafted.status_code == 403
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING


def test_a_failed_runs_page_shows_the_failed_model_call_and_its_class(operator_client):
    agent_run = auth_failed_run()
    page = operator_client.get(page_of(agent_run)).content.decode()
    summary = re.search(r'<section id="run-summary".*?</section>', page, re.S)[0]
    assert "The model call of turn 2 failed (auth):" in summary
    row = re.search(r'<tr class="step-failed-call" id="failed-model-call">(.*?)</tr>', page, re.S)
    # Its class; the error itself is the summary's (once on the page).
    assert "the model call of turn 2" in row[1] and "<strong>failed (auth)</strong>" in row[1]
    # The summary comes first: before the fields and the steps.
    assert page.index('id="run-summary"') < page.index('id="steps"')


def test_a_dead_letters_page_requeues_its_run_or_dismisses_it(operator_client, viewer_client):
    agent_run = auth_failed_run()
    (dead_letter,) = DeadLetter.objects.filter(run=agent_run)
    url = f"{DEAD_LETTERS}{dead_letter.pk}/change/"
    page = operator_client.get(url).content.decode()
    assert f'action="{RUNS}{agent_run.pk}/requeue/"' in page and 'id="requeue-warning"' in page
    assert 'id="dismiss-button"' in page
    seen = viewer_client.get(url).content.decode()
    assert 'id="requeue-button"' not in seen and 'id="dismiss-button"' not in seen

    response = operator_client.post(
        DEAD_LETTERS,
        {
            "action": "dismiss_selected",
            "_selected_action": [dead_letter.pk],
            "confirm": "yes",
            "note": "known outage",
        },
        follow=True,
    )

    assert messages_on(response) == [f"Dead letter #{dead_letter.pk}: dismissed."]
    dead_letter.refresh_from_db()
    assert dead_letter.resolution == "dismissed"


def test_requeueing_from_the_dead_letters_asks_with_the_runs_verdicts(operator_client):
    agent_run = auth_failed_run()
    (dead_letter,) = DeadLetter.objects.filter(run=agent_run)

    asked = operator_client.post(
        DEAD_LETTERS, {"action": "requeue_selected", "_selected_action": [dead_letter.pk]}
    ).content.decode()

    # The runs' own confirmation, posting to the runs' action.
    assert f'<form method="post" action="{RUNS}">' in asked
    assert f'name="_selected_action" value="{agent_run.pk}"' in asked
    assert "will be requeued" in asked and 'class="warning-box lasting-failure"' in asked
    assert fresh(agent_run).steps.filter(kind="operator").count() == 0
    done = operator_client.post(
        RUNS,
        {
            "action": "requeue_selected",
            "_selected_action": [agent_run.pk],
            "confirm": "yes",
            "note": "n",
        },
        follow=True,
    )
    (message,) = messages_on(done)
    assert message.startswith(f"Run {str(agent_run.pk)[:8]}: requeued at ")
    assert "failed again at its model call (auth)" in message


@pytest.mark.usefixtures("approvals")
def test_four_eyes_on_the_run_page_the_submitter_may_deny_but_not_approve(
    operator, operator_client, settings
):
    settings.NRLLM_APPROVAL_SECOND_PERSON = True
    agent_run = fresh(
        enqueue(
            scripted(
                call("send_notification", recipient="team", message="m"),
                answer(),
                tools=["send_notification"],
            ),
            submitted_by=operator,
        )
    )
    (approval,) = ApprovalRequest.objects.filter(run=agent_run)

    page = operator_client.get(page_of(agent_run)).content.decode()

    form = re.search(r'class="decide-form">.*?</form>', page, re.S)[0]
    assert "deny-button" in form and "approve-button" not in form
    assert "you submitted this run: another operator must approve its calls" in form
    crafted = operator_client.post(
        f"{RUNS}approvals/{approval.pk}/decide/",
        {"decision": "approve", "digest": approval.digest, "next": page_of(agent_run)},
        follow=True,
    )
    assert "not approved: you submitted this run" in messages_on(crafted)[0]
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
