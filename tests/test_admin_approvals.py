"""G14 in the admin: the approvals inbox (pending calls oldest first, what
led to them, the call escaped and whole; approve and deny bound to the
digest the page showed), the overview's count and the run page's approval
history. In-process runs, as in test_approvals.py: approving from the page
runs the run to completion inside the request. The decisions the inbox
refuses are ``test_admin_approval_refusals.py``'s, with these helpers."""

import html
import re

import pytest

from runs.models import AgentRun, ApprovalRequest
from runs.models.vocabulary import ApprovalStatus, RunStatus, StepKind
from runs.runtime import enqueue
from tests.helpers import answer, call, fresh, scripted
from tools.models import OutboxNotification

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("approvals")]

RUNS = "/admin/runs/agentrun/"
INBOX = f"{RUNS}approvals/"
XSS = "<script>alert('x')</script>"
TOOLS = ["search_notes", "send_notification"]


def waiting_run(message="v2 is out", *, prompt="Announce the release", submitted_by=None):
    """A run that searched, then asked to notify: it waits for approval of
    the notification (step 4 its turn, the call at position 2.0)."""
    agent_run = enqueue(
        scripted(
            call("search_notes", query="release"),
            call("send_notification", recipient="team", message=message),
            answer("announced"),
            tools=TOOLS,
            prompt=prompt,
        ),
        submitted_by=submitted_by,
    )
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.WAITING_FOR_APPROVAL
    return agent_run


def run_with_two_calls():
    """A run whose one turn asks for two notifications: two decisions."""
    notify = [
        {"name": "send_notification", "arguments": {"recipient": "team", "message": "one"}},
        {"name": "send_notification", "arguments": {"recipient": "ops", "message": "two"}},
    ]
    return fresh(enqueue(scripted({"tool_calls": notify}, answer("both"), tools=TOOLS)))


def pending_of(agent_run) -> list[ApprovalRequest]:
    return list(
        ApprovalRequest.objects.filter(run=agent_run, status=ApprovalStatus.PENDING).order_by(
            "position"
        )
    )


def digest_on_page(content: str, approval: ApprovalRequest) -> str:
    """The digest the page's decide form of ``approval`` posts."""
    form = re.search(
        rf'action="{INBOX}{approval.pk}/decide/".*?name="digest" value="([0-9a-f]+)"',
        content,
        re.S,
    )
    assert form, f"no decide form for approval {approval.pk}"
    return form.group(1)


def messages_on(response) -> list[str]:
    content = response.content.decode()
    return [html.unescape(text) for text in re.findall(r'<li class="\w+">(.*?)</li>', content)]


def decide(client, approval, decision, *, digest=None, note=""):
    """POST the inbox's form as a browser would, following the redirect."""
    return client.post(
        f"{INBOX}{approval.pk}/decide/",
        {"decision": decision, "digest": digest or approval.digest, "note": note},
        follow=True,
    )


def test_the_inbox_lists_pending_calls_oldest_first_with_what_led_to_them(
    approver_client, operator
):
    first = waiting_run("first call", prompt="Announce the first release", submitted_by=operator)
    second = waiting_run("second call", prompt="Announce the second release")
    # Asked earlier than the first, whatever the insertion order says.
    ApprovalRequest.objects.filter(run=second).update(
        requested_at=ApprovalRequest.objects.get(run=first).requested_at.replace(year=2020)
    )

    response = approver_client.get(INBOX)

    assert response.status_code == 200
    content = response.content.decode()
    assert content.index(str(second.pk)) < content.index(str(first.pk))
    (request,) = pending_of(first)
    block = content[content.index(f'id="run-{first.pk}"') :]
    assert "Announce the first release" in block
    # The steps that led to the call: the first turn, the search it ran,
    # the turn that asked.
    assert "asks for search_notes" in block and "{&quot;matches&quot;: []}" in block
    assert "(the turn that asked)" in block and "asks for send_notification" in block
    assert 'class="call-tool">send_notification</code>' in block
    assert "non_idempotent_write" in block
    assert request.position in block and request.idempotency_key in block
    assert 'class="submitter">olivia<' in block
    assert "left</span> before it expires" in block and "ago</span>" in block
    assert 'value="approve" class="button default approve-button"' in block
    assert 'value="deny" class="button deny-button"' in block
    second_block = content[content.index(f'id="run-{second.pk}"') :]
    assert 'class="submitter">the command line<' in second_block


def test_the_call_is_escaped_and_long_values_are_there_whole(approver_client):
    long_message = "y" * 300 + "the end"
    waiting_run(XSS)
    waiting_run(long_message)

    content = approver_client.get(INBOX).content.decode()

    assert XSS not in content
    assert html.escape(XSS) in content
    # Cut in the table, whole behind <details> (and in the JSON).
    assert "<details><summary><code>" + "y" * 200 + "…" in content
    assert f'<pre class="full-value">{long_message}</pre>' in content


def test_approving_from_the_inbox_completes_the_run_and_notifies_once(approver_client):
    agent_run = waiting_run("v2 is out")
    (request,) = pending_of(agent_run)
    digest = digest_on_page(approver_client.get(INBOX).content.decode(), request)

    response = decide(approver_client, request, "approve", digest=digest, note="looks right")

    assert response.redirect_chain == [(INBOX, 302)]
    shown = messages_on(response)
    assert any("approved; the run goes back to the queue" in text for text in shown)
    # The tool's name as it is: the admin capitalises a message's first
    # letter; the call's place in words, not "2.0".
    assert any(text.startswith("Call 1 of turn 2 (send_notification) of run ") for text in shown), (
        shown
    )
    # What the run did next, as it stands when the page comes back: the
    # embedded worker ran it to its end.
    assert any(
        "Since then it made 1 model call and 1 tool call, and completed." in text for text in shown
    ), shown
    assert fresh(agent_run).status == RunStatus.COMPLETED
    (notification,) = OutboxNotification.objects.all()
    assert notification.idempotency_key == request.idempotency_key
    request.refresh_from_db()
    assert (request.status, request.decided_by.username, request.note) == (
        "approved",
        "ada",
        "looks right",
    )
    # Now among the decided, and no longer pending.
    content = response.content.decode()
    assert "No call waits for approval." in content
    decided_row = re.search(rf'id="decided-{request.pk}">(.*?)</tr>', content, re.S).group(1)
    assert "approved" in decided_row and "ada" in decided_row and "looks right" in decided_row
    # A second POST of the same page changes nothing.
    again = decide(approver_client, request, "approve", digest=digest)
    assert any("approved by ada already" in text for text in messages_on(again))
    assert OutboxNotification.objects.count() == 1


def test_denying_with_a_note_completes_the_run_without_the_notification(approver_client):
    agent_run = waiting_run("page everyone")
    (request,) = pending_of(agent_run)

    response = decide(approver_client, request, "deny", note="not at 3am")

    assert any("denied" in text for text in messages_on(response))
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED
    assert OutboxNotification.objects.count() == 0
    told = agent_run.steps.get(kind=StepKind.TOOL, tool_name="send_notification")
    assert "not at 3am" in told.error
    decided_row = re.search(
        rf'id="decided-{request.pk}">(.*?)</tr>', response.content.decode(), re.S
    ).group(1)
    assert "denied" in decided_row and "not at 3am" in decided_row


def test_the_overview_counts_pending_calls_and_links_to_the_inbox(operator_client):
    waiting = run_with_two_calls()
    finished = enqueue(scripted(answer("nothing to approve"), tools=TOOLS))

    content = operator_client.get("/admin/").content.decode()  # the overview

    assert f'<a href="{INBOX}" id="pending-approvals">2</a>' in content
    waiting_link = re.search(r'href="([^"]+)" id="runs-waiting-for-approval">1 run<', content)
    assert waiting_link
    listing = operator_client.get(html.unescape(waiting_link.group(1))).content.decode()
    assert str(waiting.pk) in listing and str(finished.pk) not in listing


def test_the_inbox_shows_one_runs_calls_and_refuses_a_malformed_run_id(approver_client):
    one, other = waiting_run("one"), waiting_run("other")

    content = approver_client.get(f"{INBOX}?run={one.pk}").content.decode()

    assert f'id="run-{one.pk}"' in content and f'id="run-{other.pk}"' not in content
    response = approver_client.get(f"{INBOX}?run=not-a-uuid")
    assert response.status_code == 400
    assert approver_client.post(f"{INBOX}12345/decide/").status_code == 400  # no decision
    missing = approver_client.post(
        f"{INBOX}12345/decide/", {"decision": "approve", "digest": "x"}, follow=True
    )
    assert messages_on(missing) == ["There is no such approval request."]
    assert approver_client.get(f"{INBOX}12345/decide/").status_code == 302


def test_the_run_page_shows_the_approval_history_and_links_to_the_inbox(approver_client):
    agent_run = run_with_two_calls()
    first, second = pending_of(agent_run)
    page = f"{RUNS}{agent_run.pk}/change/"

    waiting = approver_client.get(page).content.decode()
    assert f'href="{INBOX}?run={agent_run.pk}" id="pending-approvals-link"' in waiting
    decide(approver_client, first, "approve", note="team may know")
    still = approver_client.get(page).content.decode()
    assert 'id="pending-approvals-link"' in still  # one call still waits
    decide(approver_client, second, "deny", note="ops are asleep")

    content = approver_client.get(page).content.decode()

    assert fresh(agent_run).status == RunStatus.COMPLETED
    assert 'id="pending-approvals-link"' not in content
    history = re.search(r'id="approval-history"(.*?)</table>', content, re.S).group(1)
    assert history.count("<strong>approved</strong>") == 1
    assert history.count("<strong>denied</strong>") == 1
    assert "team may know" in history and "ops are asleep" in history
    summaries = [html.unescape(text) for text in re.findall(r'approval-summary">(.*?)<', content)]
    assert summaries == [
        "approval requested for send_notification (call 1 of turn 1), "
        "send_notification (call 2 of turn 1); "
        f"expires {first.expires_at:%Y-%m-%d %H:%M:%S} UTC",
        "send_notification (call 1 of turn 1) approved by ada: team may know",
        "send_notification (call 2 of turn 1) denied by ada: ops are asleep",
    ]
    assert OutboxNotification.objects.count() == 1


def test_the_runs_list_filters_waiting_for_approval(operator_client):
    waiting = waiting_run()
    done = enqueue(scripted(answer("no writes"), tools=TOOLS))
    sidebar = operator_client.get(RUNS).content.decode()
    (link,) = re.findall(r'href="(\?status__exact=waiting_for_approval)"', sidebar)

    content = operator_client.get(f"{RUNS}{link}").content.decode()

    assert str(waiting.pk) in content and str(done.pk) not in content
    assert AgentRun.objects.filter(status=RunStatus.WAITING_FOR_APPROVAL).count() == 1
