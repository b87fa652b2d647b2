"""A write in doubt says, in words, what to check and where (issue 47): on
a run's page, the dead letters, a dead letter's page, the failed write
audits, the reconcile form sent incomplete and the overview, at 1366 × 900,
an operator reads which tool, which call (its arguments summarised), its
idempotency key, why nobody knows whether it landed, where its tool keeps
its record — linked where the tool gives a link (the outbox, by its key) —
and how to reconcile it. No error class is the words, and no word of prose
is broken across lines (identifiers may be); measured from the elements'
boxes. What a tool and a model wrote is escaped."""

import re

import pytest
from django.contrib.auth.models import Permission
from playwright.sync_api import expect

from runs.models import DeadLetter
from runs.runtime import enqueue
from tests.browser import admin_page
from tests.browser_boxes import (
    BROKEN_WORDS,
    assert_no_word_broken,
    assert_shown,
    assert_table_fits,
)
from tests.helpers import answer, call, fresh, scripted
from tests.test_console import XSS, audit_failed_run
from tests.tools_for_tests import UnsureWrite
from tools.contract import WhereToCheck
from tools.models import OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)

TEST_TOOLS = ["tests.tools_for_tests.UnsureWrite", "tests.tools_for_tests.UnsureLedgerWrite"]


def in_doubt(settings):
    """A notification whose record the database refused (its message
    markup), and a write that could not tell whether it landed: each a
    write in doubt."""
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, *TEST_TOOLS]
    unsure = enqueue(
        scripted(
            call("unsure_write", text="release notes v2"),
            answer(),
            tools=["unsure_write"],
            prompt="Post the release notes",
        )
    )
    return audit_failed_run(), fresh(unsure)


@pytest.mark.slow
def test_a_write_in_doubt_says_what_to_check_and_where_and_breaks_no_word(
    live_server, operator, settings, orm_beside_the_browser
):
    # Where the notification's record is: the outbox, which she may read.
    operator.user_permissions.add(Permission.objects.get(codename="view_outboxnotification"))
    notified, unsure = in_doubt(settings)
    key = notified.pending_call["idempotency_key"]
    dead_letter = DeadLetter.objects.get(run=notified)
    (sent,) = OutboxNotification.objects.filter(idempotency_key=key)
    base = live_server.url
    with admin_page(base, "olivia", viewport=(1366, 900)) as page:
        # The run's page: the write in words, where to check, the form.
        page.goto(f"{base}/admin/runs/agentrun/{notified.pk}/change/")
        box = page.locator("#write-in-question")
        expect(box.locator(".doubt-head")).to_have_text(
            "A write may have landed: check it, then reconcile it"
        )
        expect(box.locator(".doubt-call")).to_have_text(
            re.compile(
                r"send_notification, a non-idempotent write: running it again could repeat it, "
                rf"was called with message “{re.escape(XSS)}”, recipient “ops”\.$"
            )
        )
        expect(box.locator(".doubt-why")).to_have_text(
            re.compile(r"^It ran, but its record could not be saved to the database")
        )
        expect(box.locator(".doubt-key .identifier")).to_have_text(key)
        expect(box.locator(".doubt-check")).to_contain_text(
            "Check the outbox: a notification there with this idempotency key was sent"
        )
        expect(box.locator(".doubt-how")).to_contain_text(
            "Then reconcile it with what you found: applied if it landed"
        )
        expect(box).not_to_contain_text("AuditPersistenceFailed")
        # The summary's error in words; the class is a small aside.
        summary = page.locator("#summary-error")
        expect(summary).to_contain_text("A write may have landed (what to check, below):")
        expect(summary.locator(".error-message")).not_to_contain_text("AuditPersistenceFailed")
        expect(summary.locator(".error-type")).to_have_text("AuditPersistenceFailed")
        assert_shown(
            page,
            "#write-in-question",
            "#write-in-question .doubt-check-link",
            "#write-in-question .reconcile-form [type=submit]",
            above_the_fold=True,
        )
        assert_no_word_broken(
            page, "#summary-error", "#requeue-verdict", "#restart-verdict", "#write-in-question"
        )
        # The check catches a word broken where the page allowed it.
        page.add_style_tag(content="#write-in-question .doubt-why { word-break: break-all; }")
        assert page.evaluate(BROKEN_WORDS, "#write-in-question .doubt-why")
        # "Look it up": the outbox, its row for this key alone.
        page.click("#write-in-question .doubt-check-link")
        expect(page.locator("#result_list tbody tr")).to_have_count(1)
        expect(page.locator("#result_list tbody tr")).to_contain_text(XSS)
        assert sent.idempotency_key == key

        # A tool that says nothing of its record: where it writes, no link.
        page.goto(f"{base}/admin/runs/agentrun/{unsure.pk}/change/")
        expect(page.locator("#write-in-question .doubt-check")).to_have_text(
            "Check where unsure_write writes: look there for this call's effect (and for the "
            "idempotency key, if the tool sends it along)."
        )
        expect(page.locator("#write-in-question .doubt-why")).to_contain_text(
            "It could not tell whether its write took effect"
        )
        expect(page.locator("#write-in-question .doubt-check-link")).to_have_count(0)
        assert_no_word_broken(page, "#summary-error", "#write-in-question")

        # The dead letters: the write in doubt in words, linked to its run.
        page.goto(f"{base}/admin/runs/deadletter/")
        assert_table_fits(page, "#result_list")
        row = page.locator(f"#result_list tbody tr:has(a[href$='/{dead_letter.pk}/change/'])")
        expect(row.locator(".doubt-words")).to_have_text(
            "A write may have landed: send_notification ran; its record could not be saved. "
            "Check it, then reconcile it."
        )
        assert_no_word_broken(page, "#result_list .doubt-words")
        row.locator(".doubt-words a").click()
        expect(page).to_have_url(re.compile(rf"/{notified.pk}/change/#write-in-question$"))

        # A dead letter's page: the same words, and the form.
        page.goto(f"{base}/admin/runs/deadletter/{dead_letter.pk}/change/")
        expect(page.locator("#write-in-question .doubt-check")).to_contain_text("the outbox")
        assert_shown(page, "#write-in-question .reconcile-form [type=submit]")
        assert_no_word_broken(page, "#dead-letter-actions")

        # The failed write audits: why in words (the class in a tooltip),
        # where to check beside the form.
        page.goto(f"{base}/admin/runs/agentrun/write-audits/")
        assert_table_fits(page, "#write-audits")
        audit = page.locator(f"#audit-{notified.pk}")
        expect(audit.locator(".run-why")).to_have_text("ran; its record could not be saved")
        expect(audit.locator(".run-why")).to_have_attribute(
            "title", "not_retryable (AuditPersistenceFailed)"
        )
        expect(audit.locator(".audit-check")).to_contain_text("Check the outbox")
        expect(page.locator(f"#audit-{unsure.pk} .run-why")).to_have_text(
            "could not tell whether it took effect"
        )
        assert_no_word_broken(page, "#write-audits td", "#content > p")

        # Sent without an outcome, the form comes back with the same words.
        page.goto(f"{base}/admin/runs/agentrun/{notified.pk}/change/")
        page.fill("#write-in-question input[name=note]", "not in the outbox")
        page.evaluate(
            "document.querySelectorAll('#write-in-question [name=outcome]')"
            ".forEach(radio => radio.required = false)"
        )
        page.click("#write-in-question .reconcile-form [type=submit]")
        expect(page.locator("#reconcile-again")).to_contain_text("Nothing was recorded.")
        expect(page.locator("#write-in-question .doubt-check")).to_contain_text("the outbox")
        assert_no_word_broken(page, "#reconcile-again", "#write-in-question")
        page.check("#write-in-question [name=outcome][value=not_applied]")
        page.click("#write-in-question .reconcile-form [type=submit]")
        expect(page.locator("#write-in-question .doubt-reconciled")).to_contain_text(
            "Reconciled not_applied by olivia"
        )

        # The overview: the one left, and what to do with it.
        page.goto(f"{base}/admin/")
        expect(page.locator("#writes-in-doubt")).to_have_text("1")
        expect(page.locator("#now")).to_contain_text(
            "each a write that may have landed: check it where its tool keeps its record, "
            "then reconcile it"
        )
        assert_no_word_broken(page, "#now")


def test_a_tools_word_on_its_record_is_escaped_and_a_link_no_page_may_carry_is_left_out(
    operator_client, settings
):
    settings.NRLLM_TOOLS = [*settings.NRLLM_TOOLS, *TEST_TOOLS]
    ledger = enqueue(
        scripted(
            call("unsure_ledger_write", text="<script>v2</script>"),
            answer(),
            tools=["unsure_ledger_write"],
        )
    )
    page = operator_client.get(f"/admin/runs/agentrun/{ledger.pk}/change/").content.decode()
    check = re.search(r'<p class="doubt-check">(.*?)</p>', page, re.S)[1]
    assert "the &lt;i&gt;ledger&lt;/i&gt; of &lt;script&gt;v2&lt;/script&gt;" in check
    assert "<a" not in check and "javascript:" not in page


class UnsureCarelessWrite(UnsureWrite):
    """``unsure_write`` whose word on where to check it is a plain string,
    not a ``WhereToCheck``: a tool author's slip."""

    name = "unsure_careless_write"

    def where_to_check(self, arguments, idempotency_key):
        return f"the ledger, under {idempotency_key}"


class UnsureFailingWrite(UnsureWrite):
    """``unsure_write`` whose ``where_to_check`` raises."""

    name = "unsure_failing_write"

    def where_to_check(self, arguments, idempotency_key):
        return WhereToCheck(arguments["ledger"])


@pytest.mark.parametrize("tool", ["unsure_careless_write", "unsure_failing_write"])
def test_a_tool_that_cannot_say_where_to_check_leaves_every_page_of_its_write_drawn(
    operator_client, settings, tool
):
    """A tool's ``where_to_check`` is its author's code: one that raises, or
    answers with something other than a ``WhereToCheck``, leaves the pages
    of its write in doubt drawn with the words every write tool shares."""
    settings.NRLLM_TOOLS = [
        *settings.NRLLM_TOOLS,
        f"{__name__}.UnsureCarelessWrite",
        f"{__name__}.UnsureFailingWrite",
    ]
    unsure = fresh(enqueue(scripted(call(tool, text="v2"), answer(), tools=[tool])))
    dead_letter = DeadLetter.objects.get(run=unsure)
    generic = f"where {tool} writes: look there for this call&#x27;s effect"

    for page in (
        f"/admin/runs/agentrun/{unsure.pk}/change/",
        "/admin/runs/agentrun/write-audits/",
        f"/admin/runs/deadletter/{dead_letter.pk}/change/",
    ):
        response = operator_client.get(page)
        assert response.status_code == 200, page
        assert generic in response.content.decode(), page
    dead_letters = operator_client.get("/admin/runs/deadletter/")
    assert dead_letters.status_code == 200
    assert "A write may have landed" in dead_letters.content.decode()
