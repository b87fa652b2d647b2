"""The tools page with MCP tools in a real browser: the tracker's tools over
stdio beside the builtins, one whose hints lie flagged, one whose server's
description holds markup shown as text, and a server that is down shown
unavailable. An operator switches off the undeclared close_issue from the
list. Saves the screenshot (docs/console.md) of the page (`make screenshots`)."""

import pytest
from playwright.sync_api import expect

from tests.browser import DOCS_SCREENSHOTS, admin_page
from tools.models import ToolSetting

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("approvals"),
]


def row(page, name: str):
    """The list's row of the tool ``name``."""
    link = page.get_by_role("link", name=name, exact=True)
    return page.locator("#result_list tbody tr").filter(has=link)


def test_an_operator_sees_mcp_tools_flagged_and_switches_an_undeclared_one_off(
    live_server, operator, tracker, http_tracker, orm_beside_the_browser, screenshots
):
    # Playwright's sync API keeps an event loop in this thread; the ORM calls
    # below happen between its calls, never inside them.
    http_tracker.stop_http()  # the webtracker is down
    base = live_server.url
    with admin_page(base, "olivia", viewport=(1366, 900)) as page:
        page.goto(f"{base}/admin/tools/toolsetting/")
        label = row(page, "tracker__label_issue")
        expect(label.locator(".hint-flag")).to_have_text(
            "⚠ the server says readOnlyHint: true; declared idempotent_write"
        )
        expect(label).to_contain_text("the declaration wins")
        expect(row(page, "tracker__render_issue").locator(".hint-flag")).to_have_count(1)
        down = row(page, "webtracker__create_issue")
        expect(down.locator(".tool-unavailable")).to_be_visible()
        expect(down).to_contain_text("MCP server 'webtracker' cannot be reached")
        # On a laptop, the app list open, the long names, hints and reasons
        # wrap: the table does not scroll sideways, the approval in effect
        # is on the screen (issue #30).
        fit = page.evaluate(
            "() => { const t = document.querySelector('#result_list');"
            " return [t.parentElement.scrollWidth, t.parentElement.clientWidth,"
            " document.querySelector('#result_list th.column-approval_policy')"
            ".getBoundingClientRect().right]; }"
        )
        assert fit[0] <= fit[1] and fit[2] <= 1366, fit
        page.click("#toggle-nav-sidebar")  # the table's columns, not the app list
        page.screenshot(path=screenshots / "mcp-tools.png", full_page=True)

        page.get_by_role("link", name="tracker__render_issue", exact=True).click()
        # What the server wrote is shown as text, the markup and all.
        expect(page.locator(".field-description")).to_contain_text(
            'Render an issue as HTML: <script>alert("tracker")</script> <b>bold</b>'
        )
        expect(page.locator(".field-effect")).to_contain_text("non_idempotent_write")

        page.goto(f"{base}/admin/tools/toolsetting/")
        close = row(page, "tracker__close_issue")
        expect(close).to_contain_text("required (the default for non_idempotent_write)")
        expect(close).to_contain_text("(undeclared: the riskiest effect)")
        close.locator("input[type=checkbox][name$=-enabled]").uncheck()
        page.click("input[name=_save]")
        expect(page.locator(".messagelist")).to_contain_text("was changed successfully")

        page.goto(f"{base}/admin/tools/toolsetting/?flagged=yes")
        expect(page.locator("#result_list tbody tr")).to_have_count(2)

    assert ToolSetting.objects.get(name="tracker__close_issue").enabled is False
    assert ToolSetting.objects.get(name="tracker__label_issue").enabled is True


def test_the_screenshot_of_the_mcp_tools_page_is_in_the_docs():
    assert (DOCS_SCREENSHOTS / "mcp-tools.png").exists()
