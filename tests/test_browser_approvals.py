"""The approvals inbox in a real browser (G14): an approver opens it from the
overview, approves one call and denies another, and the run page shows the
history; a runner answers the agent's question there (G24). Saves the
screenshots (docs/console.md) of both approval pages (`make screenshots`)."""

import re

import pytest
from playwright.sync_api import expect

from runs.models import ApprovalRequest
from runs.models.vocabulary import ApprovalStatus, RunStatus
from runs.runtime import enqueue
from tests.browser import DOCS_SCREENSHOTS, admin_page
from tests.helpers import answer, call, fresh, scripted
from tools.models import OutboxNotification

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("approvals"),
]

TOOLS = ["search_notes", "send_notification"]
QUESTION = "Which host is broken: db-1 or db-2?"


@pytest.fixture
def waiting_runs(operator):
    """A release announcement whose one turn asks for two notifications, and
    a page to on-call that asks for one: three calls wait."""
    announce = enqueue(
        scripted(
            call("search_notes", query="release v2"),
            {
                "tool_calls": [
                    {
                        "name": "send_notification",
                        "arguments": {"recipient": "team", "message": "v2 is out: see the notes"},
                    },
                    {
                        "name": "send_notification",
                        "arguments": {
                            "recipient": "customers",
                            "message": "Dear customers, " + "v2 brings many changes. " * 20,
                        },
                    },
                ]
            },
            answer("Announced to the team."),
            tools=TOOLS,
            prompt="Announce release v2 to the team and the customers",
        ),
        submitted_by=operator,
    )
    page = enqueue(
        scripted(
            call("send_notification", recipient="oncall", message="<b>disk full</b> on db-1"),
            answer("Paged."),
            tools=TOOLS,
            prompt="Page on-call about the disk",
        )
    )
    return fresh(announce), fresh(page)


def test_an_approver_approves_one_call_and_denies_another(
    live_server, approver, waiting_runs, orm_beside_the_browser, screenshots
):
    # Playwright's sync API keeps an event loop in this thread; the ORM calls
    # below happen between its calls, never inside them.
    announce, on_call = waiting_runs
    to_team, to_customers = ApprovalRequest.objects.filter(run=announce).order_by("position")
    base = live_server.url
    with admin_page(base, "ada") as page:
        page.goto(f"{base}/admin/runs/agentrun/overview/")
        expect(page.locator("#pending-approvals")).to_have_text("3")
        page.click("#pending-approvals")
        expect(page).to_have_url(f"{base}/admin/runs/agentrun/approvals/")
        expect(page.locator(".approval-call")).to_have_count(3)
        # The markup a tool was asked to send is shown as text.
        expect(page.locator(f"#run-{on_call.pk} .call-arguments")).to_contain_text(
            "<b>disk full</b>"
        )
        page.screenshot(path=screenshots / "approvals-inbox.png", full_page=True)
        # Deny does not look like Approve (both blue, as Django draws a
        # button): it is drawn as Django draws a delete, red.
        deny = page.locator(f"#approval-{to_team.pk} .deny-button").evaluate(
            "element => getComputedStyle(element).backgroundColor"
        )
        red, green, blue = (int(part) for part in re.findall(r"\d+", deny)[:3])
        assert red > 2 * blue and red > 2 * green, deny

        page.locator(f"#approval-{to_team.pk} input[name=note]").fill("the team may know")
        page.click(f"#approval-{to_team.pk} .approve-button")
        expect(page.locator(".messagelist")).to_contain_text(
            "approved; the run still waits for its other calls"
        )
        expect(page.locator(f"#decided-{to_team.pk}")).to_contain_text("approved")

        page.locator(f"#approval-{to_customers.pk} input[name=note]").fill(
            "customers hear of it from marketing"
        )
        page.click(f"#approval-{to_customers.pk} .deny-button")
        expect(page.locator(".messagelist")).to_contain_text(
            "denied; the run goes back to the queue"
        )
        expect(page.locator(f"#decided-{to_customers.pk}")).to_contain_text(
            re.compile("denied.*customers hear of it from marketing", re.S)
        )
        expect(page.locator(".approval-call")).to_have_count(1)  # the page to on-call

        page.goto(f"{base}/admin/runs/agentrun/{announce.pk}/change/")
        history = page.locator("#approval-history")
        expect(history).to_contain_text("the team may know")
        expect(history).to_contain_text("customers hear of it from marketing")
        expect(page.locator(".approval-summary")).to_have_count(3)
        # From the approvals table down to the last approval step: the
        # fields above them are the run page's usual ones.
        top = page.locator("#approval-history").bounding_box()
        bottom = page.locator("tr.step-approval").last.bounding_box()
        page_width = page.evaluate("document.documentElement.scrollWidth")
        page.screenshot(
            path=screenshots / "approval-history.png",
            full_page=True,
            clip={
                "x": top["x"] - 12,
                "y": top["y"] - 48,
                "width": page_width - top["x"] + 12,
                "height": bottom["y"] + bottom["height"] - top["y"] + 60,
            },
        )

    assert fresh(announce).status == RunStatus.COMPLETED
    (notification,) = OutboxNotification.objects.all()
    assert notification.idempotency_key == to_team.idempotency_key
    assert notification.recipient == "team"
    assert fresh(on_call).status == RunStatus.WAITING_FOR_APPROVAL
    statuses = dict(ApprovalRequest.objects.values_list("pk", "status"))
    assert statuses[to_team.pk] == ApprovalStatus.APPROVED
    assert statuses[to_customers.pk] == ApprovalStatus.DENIED


def test_screenshots_of_the_approval_pages_are_in_the_docs():
    names = {path.name for path in DOCS_SCREENSHOTS.glob("*.png")}
    assert {"approvals-inbox.png", "approval-history.png", "inbox-question.png"} <= names


def test_a_runner_answers_the_agents_question_in_the_inbox(
    live_server, approver, orm_beside_the_browser, screenshots
):
    """G24: the question and its schema are shown at a laptop's width, a
    wrong answer comes back with the path it fails at, a right one runs
    the run on to its end."""
    schema = {
        "type": "object",
        "properties": {"host": {"type": "string", "pattern": "^db-[0-9]+$"}},
        "required": ["host"],
    }
    asked = enqueue(
        scripted(
            call("ask_person", question=QUESTION, answer_schema=schema),
            answer("Restarted it."),
            tools=["ask_person"],
            prompt="Restart the broken database",
        )
    )
    (question,) = ApprovalRequest.objects.filter(run=asked)
    base = live_server.url
    with admin_page(base, "ada", viewport=(1366, 900)) as page:
        page.goto(f"{base}/admin/runs/agentrun/approvals/?kind=question")
        block = page.locator(f"#approval-{question.pk}")
        expect(block.locator(".question-text")).to_have_text(QUESTION)
        expect(block.locator(".answer-format")).to_have_text("JSON")
        assert page.evaluate("document.documentElement.scrollWidth") <= 1366
        page.screenshot(path=screenshots / "inbox-question.png")

        block.locator("textarea[name=answer]").fill('{"host": "the second"}')
        block.locator(".answer-button").click()
        expect(page.locator(".errorlist")).to_contain_text("answer.host")
        # (No query here: one made beside the browser's event loop opens a
        # connection of its own that outlives the test.)

        page.locator("textarea[name=answer]").fill('{"host": "db-2"}')
        page.click(".answer-button")
        expect(page.locator(".messagelist")).to_contain_text("answered; the run goes back")
        expect(page.locator(f"#decided-{question.pk}")).to_contain_text("db-2")

    assert fresh(asked).status == RunStatus.COMPLETED
