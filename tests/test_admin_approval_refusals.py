"""G14 in the admin: the decisions the inbox refuses, each saying why and
changing nothing — a page shown before someone else decided, a digest that
is not the call's, a call past its expiry, a step the database refuses, a
viewer's or an outsider's crafted POST, the submitter's approval under four
eyes, a POST without its CSRF token. The inbox's pages and helpers are
``test_admin_approvals.py``'s."""

import re

import pytest
from django.test import Client

from runs.approvals import actions as approval_actions
from runs.models import ApprovalRequest
from runs.models.faults import step_inserts_refused
from runs.models.vocabulary import RunStatus, StepKind
from tests.helpers import fresh
from tests.test_admin_approvals import (
    INBOX,
    decide,
    digest_on_page,
    messages_on,
    pending_of,
    waiting_run,
)
from tools.models import OutboxNotification

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals")]


def test_a_page_shown_before_the_call_was_decided_decides_nothing(approver_client, operator):
    agent_run = waiting_run()
    (request,) = pending_of(agent_run)
    digest = digest_on_page(approver_client.get(INBOX).content.decode(), request)
    # Someone else decides in between.
    assert approval_actions.deny(request, operator, digest=request.digest, note="no").ok
    steps_before = fresh(agent_run).step_count

    response = decide(approver_client, request, "approve", digest=digest)

    (message,) = messages_on(response)
    assert "not approved: this call was denied by olivia already" in message
    assert "Nothing was changed." in message
    assert fresh(agent_run).step_count == steps_before
    request.refresh_from_db()
    assert (request.status, request.decided_by) == ("denied", operator)
    assert OutboxNotification.objects.count() == 0


def test_a_digest_that_is_not_the_calls_is_refused_and_changes_nothing(approver_client):
    agent_run = waiting_run()
    (request,) = pending_of(agent_run)

    response = decide(approver_client, request, "approve", digest="0" * 64)

    (message,) = messages_on(response)
    assert "the digest is not this call's as it stands" in message
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    assert pending_of(agent_run) == [request]
    assert OutboxNotification.objects.count() == 0


def test_a_call_past_its_expiry_offers_no_decision_and_a_crafted_one_is_refused(
    approver_client,
):
    agent_run = waiting_run()
    (request,) = pending_of(agent_run)
    # Overdue, and the reaper has not come by yet.
    ApprovalRequest.objects.filter(pk=request.pk).update(
        expires_at=request.requested_at.replace(year=2020)
    )

    content = approver_client.get(INBOX).content.decode()

    assert 'class="time-left">expired</strong>: the reaper ends the run' in content
    assert 'class="decide-form"' not in content
    (message,) = messages_on(decide(approver_client, request, "approve"))
    assert "this request has expired" in message
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    assert OutboxNotification.objects.count() == 0


def test_a_decision_the_database_refuses_says_so_and_the_run_still_waits(approver_client):
    agent_run = waiting_run()
    (request,) = pending_of(agent_run)

    with step_inserts_refused(kind=StepKind.APPROVAL):
        response = decide(approver_client, request, "approve")

    (message,) = messages_on(response)
    assert "the database could not record the decision; nothing was changed" in message
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    assert pending_of(agent_run) == [request]
    assert OutboxNotification.objects.count() == 0


def test_a_viewer_sees_no_buttons_and_a_crafted_post_is_refused(viewer_client, outsider_client):
    agent_run = waiting_run()
    (request,) = pending_of(agent_run)

    content = viewer_client.get(INBOX).content.decode()

    assert "send_notification" in content  # they may look...
    assert (
        'class="decide-form"' not in content
        and 'class="button default approve-button"' not in content
    )
    assert "deciding needs the permission" in content
    for decision in ("approve", "deny"):  # ...but not decide
        response = viewer_client.post(
            f"{INBOX}{request.pk}/decide/", {"decision": decision, "digest": request.digest}
        )
        assert response.status_code == 403
    assert outsider_client.get(INBOX).status_code == 302  # to the login page
    outsider = outsider_client.post(
        f"{INBOX}{request.pk}/decide/", {"decision": "approve", "digest": request.digest}
    )
    assert outsider.status_code == 302
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    assert pending_of(agent_run) == [request]
    assert OutboxNotification.objects.count() == 0


def test_four_eyes_the_submitter_sees_they_may_deny_but_not_approve(
    settings, approver_client, approver
):
    settings.NRLLM_APPROVAL_SECOND_PERSON = True
    agent_run = waiting_run(submitted_by=approver)
    (request,) = pending_of(agent_run)

    content = approver_client.get(INBOX).content.decode()

    assert 'value="approve"' not in content and 'value="deny"' in content
    assert "you submitted this run: another operator must approve its calls" in content
    crafted = decide(approver_client, request, "approve")
    assert any("not approved: you submitted this run" in text for text in messages_on(crafted))
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL

    denied = decide(approver_client, request, "deny", note="my own mistake")

    assert fresh(agent_run).status == RunStatus.COMPLETED
    decided_row = re.search(
        rf'id="decided-{request.pk}">(.*?)</tr>', denied.content.decode(), re.S
    ).group(1)
    assert "<td>yes</td>" in decided_row  # the submitter's own
    assert OutboxNotification.objects.count() == 0


def test_decisions_are_csrf_protected(approver):
    agent_run = waiting_run()
    (request,) = pending_of(agent_run)
    client = Client(enforce_csrf_checks=True)
    client.force_login(approver)

    response = client.post(
        f"{INBOX}{request.pk}/decide/", {"decision": "approve", "digest": request.digest}
    )

    assert response.status_code == 403
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
