"""Text a submitter or a model wrote, in the runs list at 1366×900: a
prompt or an error written right to left (Arabic, Hebrew) shows its start,
as one written left to right does — cut at its end with "…", whole in its
tooltip — and not its end, its first words past the column's edge."""

import pytest
from playwright.sync_api import expect

from runs.models import AgentRun
from runs.models.vocabulary import RunStatus
from tests.browser import admin_page
from tests.browser_boxes import ROW_CELLS, assert_table_fits

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: Longer than their line at 1366 px: each is cut.
RTL_PROMPT = (
    "أولا لخص الحوادث التي وقعت هذا الأسبوع في خدمة الدفع، ثم أرسل التقرير إلى "
    "فريق العمليات وأغلق التذكرة"
)
RTL_ERROR = (
    "رفض المزود المفتاح: انتهت صلاحية مفتاح الواجهة البرمجية، جدده من لوحة التحكم "
    "ثم أعد المحاولة مرة أخرى بعد دقيقة"
)
LTR_PROMPT = (
    "First summarise this week's incidents in the payments service, then send the "
    "report to the operations team and close the ticket"
)

#: For an element: the characters (by their place in its text) drawn
#: inside its cell, the rest being past the cell's edge or cut with "…".
DRAWN = """element => {
  const cell = element.closest("td, th").getBoundingClientRect();
  const cutter = element.closest(".run-prompt, .why-line, .run-error");
  const hidden = getComputedStyle(cutter).overflowX !== "visible";
  const edge = hidden ? cutter.getBoundingClientRect() : cell;
  const drawn = [];
  let at = 0;
  const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (let i = 0; i < node.length; i++, at++) {
      const range = document.createRange();
      range.setStart(node, i);
      range.setEnd(node, i + 1);
      const box = range.getBoundingClientRect();
      if (box.width && box.left >= Math.max(cell.left, edge.left) - 0.5
          && box.right <= Math.min(cell.right, edge.right) + 0.5) drawn.push(at);
    }
  }
  return {first: Math.min(...drawn), count: drawn.length, length: element.textContent.length};
}"""


def test_a_prompt_or_error_written_right_to_left_shows_its_start(
    live_server, operator, orm_beside_the_browser
):
    AgentRun.objects.bulk_create(
        AgentRun(
            request={"provider": {"kind": "scripted"}},
            prompt=prompt,
            status=RunStatus.FAILED,
            termination_reason="not_retryable",
            failure_class="auth",
            error_type="ProviderError",
            error_message=error,
            mode="queued",
            submitted_by=operator,
        )
        for prompt, error in [(RTL_PROMPT, RTL_ERROR), (LTR_PROMPT, LTR_PROMPT)]
    )
    base = live_server.url
    with admin_page(base, "olivia", viewport=(1366, 900)) as page:
        page.goto(f"{base}/admin/runs/agentrun/")
        expect(page.locator("#result_list tbody tr")).to_have_count(2)
        assert_table_fits(page, "#result_list")
        # Nothing drawn outside its cell: what is cut is hidden, either way.
        for row in page.evaluate(ROW_CELLS):
            assert not row["overlapping"] and not row["outside"], row
        for first_words in ("First summarise", "أولا لخص"):
            row = page.locator("#result_list tbody tr", has_text=first_words)
            for shown in (".run-prompt", ".run-error"):
                drawn = row.locator(shown).evaluate(DRAWN)
                # Its start, some 40 characters of it; not all: it is cut.
                assert drawn["first"] == 0, (first_words, shown, drawn)
                assert 40 <= drawn["count"] < drawn["length"], (first_words, shown, drawn)
