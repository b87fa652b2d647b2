"""MCP tools on the admin's tools page, against the real tracker server:
each row shows its server, the effect declared in code, whether it can be
offered now, and the server's hints beside the declaration, flagged where
they contradict it ("the declaration wins"). What a server wrote is shown
as text. A server that is down leaves the page fast and 200, its tools
shown unavailable with the reason."""

import html
import time

import pytest

from tools.models import ToolSetting

pytestmark = pytest.mark.django_db

LIST = "/admin/tools/toolsetting/"
SCRIPT = '<script>alert("tracker")</script>'
LABEL_FLAG = "⚠ the server says readOnlyHint: true; declared idempotent_write"


def change_page(name: str) -> str:
    return f"{LIST}{name}/change/"


def rows_of(page) -> dict[str, ToolSetting]:
    """The settings the list shows, by tool name."""
    changelist = page.context["cl"]
    return {setting.name: setting for setting in changelist.result_list}


def row_html(content: str, name: str) -> str:
    """The list's HTML row of the tool ``name``."""
    (row,) = [row for row in content.split("<tr") if f">{name}</a>" in row]
    return row


def test_the_list_shows_server_declaration_hints_and_the_flag(operator_client, tracker):
    page = operator_client.get(LIST)

    assert page.status_code == 200
    content = page.content.decode()
    assert "MCP server <strong>tracker</strong>" in content
    headers = [column["text"] for column in page.context["result_headers"]]
    # Source and availability share a column: the list fits a laptop (#30).
    assert {"effect (from code)", "server's hints (untrusted)", "source · availability"} <= set(
        headers
    )
    # label_issue: the server says read-only, the toolset declares a write,
    # and the write is what the page says.
    label = row_html(content, "tracker__label_issue")
    assert '<td class="field-effect">idempotent_write</td>' in label
    assert LABEL_FLAG in label and "the declaration wins" in label
    assert '<td class="field-effect">read_only</td>' in row_html(content, "tracker__search_issues")
    assert content.count('class="hint-flag"') == 2  # label_issue, render_issue
    assert "the declaration wins" in content
    assert "readOnlyHint: true" in content and "destructiveHint: true" in content
    # The undeclared close_issue: the riskiest effect, said so.
    assert "non_idempotent_write <span" in content
    assert "(undeclared: the riskiest effect)" in content
    assert SCRIPT not in content  # its description is on its own page, as text
    shown = rows_of(page)
    assert {"tracker__close_issue", "tracker__render_issue", "tracker__label_issue"} <= set(shown)
    assert "search_notes" in shown


def test_the_list_gives_an_undeclared_tool_a_setting_an_operator_can_switch_off(
    operator_client, tracker
):
    assert not ToolSetting.objects.filter(name="tracker__close_issue").exists()

    assert operator_client.get(LIST).status_code == 200

    assert ToolSetting.objects.filter(name="tracker__close_issue").exists()
    response = operator_client.post(
        change_page("tracker__close_issue"), {"approval": "required", "note": "closes for real"}
    )
    assert response.status_code == 302
    setting = ToolSetting.objects.get(name="tracker__close_issue")
    assert (setting.enabled, setting.approval) == (False, "required")


def test_an_undeclared_tools_own_page_works_before_any_list(operator_client, tracker):
    page = operator_client.get(change_page("tracker__close_issue"))

    assert page.status_code == 200
    assert "(undeclared: the riskiest effect)" in page.content.decode()
    assert ToolSetting.objects.filter(name="tracker__close_issue").exists()
    assert operator_client.get(change_page("tracker__no_such_tool")).status_code == 302


def test_a_flagged_tools_page_shows_the_hints_beside_the_declaration_escaped(
    viewer_client, tracker
):
    viewer_client.get(LIST)  # the rows of the undeclared tools

    label = viewer_client.get(change_page("tracker__label_issue")).content.decode()
    render = viewer_client.get(change_page("tracker__render_issue")).content.decode()

    assert "idempotent_write" in label and LABEL_FLAG in label
    assert "the declaration wins" in label
    assert "MCP server <strong>tracker</strong>" in label
    assert "&quot;label&quot;" in label  # the server's input schema, as text
    # What the server wrote is text, not markup.
    assert SCRIPT not in render and "<b>bold</b>" not in render
    assert html.escape(SCRIPT) in render
    flag = "⚠ the server says readOnlyHint: true; undeclared, so treated as non_idempotent_write"
    assert flag in render


def test_the_filters_pick_flagged_unavailable_and_per_server_tools(operator_client, tracker):
    flagged = rows_of(operator_client.get(f"{LIST}?flagged=yes"))
    assert set(flagged) == {"tracker__label_issue", "tracker__render_issue"}
    per_server = rows_of(operator_client.get(f"{LIST}?source=mcp:tracker"))
    assert set(per_server) == {
        "tracker__search_issues",
        "tracker__create_issue",
        "tracker__label_issue",
        "tracker__close_issue",
        "tracker__render_issue",
    }
    builtin = rows_of(operator_client.get(f"{LIST}?source=builtin"))
    assert "search_notes" in builtin and "tracker__search_issues" not in builtin
    assert rows_of(operator_client.get(f"{LIST}?available=no")) == {}
    counted = operator_client.get(f"{LIST}?_facets=True").content.decode()
    assert "flagged (2)" in counted and "MCP server tracker (5)" in counted


def test_a_server_down_leaves_the_page_fast_and_its_tools_unavailable(
    operator_client, http_tracker
):
    http_tracker.stop_http()
    started = time.monotonic()

    page = operator_client.get(LIST)
    detail = operator_client.get(change_page("webtracker__create_issue"))

    assert time.monotonic() - started < 10
    assert (page.status_code, detail.status_code) == (200, 200)
    content = page.content.decode()
    assert "unavailable:</span> MCP server &#x27;webtracker&#x27; cannot be reached" in content
    assert "not known (not listed now)" in content
    assert set(rows_of(operator_client.get(f"{LIST}?available=no"))) == {
        "webtracker__create_issue",
        "webtracker__label_issue",
        "webtracker__search_issues",
    }
    assert "cannot be reached" in detail.content.decode()
    assert "non_idempotent_write" in detail.content.decode()  # from code


def test_the_form_has_no_field_for_what_code_or_the_server_says(operator_client, tracker):
    page = operator_client.get(change_page("tracker__label_issue"))
    assert set(page.context["adminform"].form.fields) == {"enabled", "approval", "note"}
    response = operator_client.post(
        change_page("tracker__label_issue"),
        {"enabled": "on", "approval": "default", "effect": "read_only", "hints": "{}"},
    )
    assert response.status_code == 302
    again = operator_client.get(change_page("tracker__label_issue")).content.decode()
    assert LABEL_FLAG in again and "idempotent_write" in again
