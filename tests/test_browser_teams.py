"""A member of one team in a real browser at 1366×900 (G22): the overview,
the runs list and the approvals inbox show their team's runs and calls and
nothing of the other team's — not in a row, a count, a filter choice or the
header's count of calls waiting — and the other team's run page is not
found. Saves the runs list as the manual's screenshot (`make screenshots`)."""

import pytest
from playwright.sync_api import expect

from agents.versions import save_agent
from runs.runtime import enqueue
from tests.approval_requests import PLAN, TOOLS
from tests.browser import admin_page
from tests.drifting_model import request_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("approvals"),
]


def test_a_member_of_one_team_sees_that_teams_console_at_1366(
    live_server, two_teams, member, orm_beside_the_browser, screenshots
):
    alpha, bravo = two_teams
    amy, bob = member("amy", alpha), member("bob", bravo)
    for team, who, words in ((alpha, amy, "Alpha's"), (bravo, bob, "Bravo's")):
        save_agent(
            f"agent-{team.slug}",
            {"provider": request_for("scripted", PLAN, TOOLS)["provider"], "tools": TOOLS},
            user=who,
            create=True,
            team=team,
        )
        for number in range(2):
            enqueue(
                request_for("scripted", PLAN, TOOLS, prompt=f"{words} run {number}"),
                submitted_by=who,
                team=team,
            )
    bravos_run = enqueue(
        request_for("scripted", PLAN, TOOLS, prompt="Bravo's hidden run"),
        submitted_by=bob,
        team=bravo,
    )

    base = live_server.url
    with admin_page(base, "amy", viewport=(1366, 900)) as page:
        page.goto(f"{base}/admin/runs/agentrun/overview/")
        # Two of Alpha's calls wait; Bravo's three are no count of hers.
        expect(page.locator("#pending-approvals")).to_have_text("2")
        page.goto(f"{base}/admin/runs/agentrun/")
        rows = page.locator("#result_list tbody tr")
        expect(rows).to_have_count(2)
        body = page.locator("body").inner_text()
        assert "Alpha's run 0" in body and "Alpha's run 1" in body
        assert "Bravo" not in body and "bravo" not in body and "bob" not in body
        # One team: no team column or filter to choose another.
        assert page.locator("#changelist-filter").inner_text().count("bravo") == 0
        page.screenshot(path=screenshots / "runs-list-one-team.png")

        page.goto(f"{base}/admin/runs/agentrun/approvals/")
        expect(page.locator(".approval-call")).to_have_count(2)
        assert "Bravo" not in page.locator("body").inner_text()

        missing = page.goto(f"{base}/admin/runs/agentrun/{bravos_run.pk}/change/")
        # The admin's answer for a run that does not exist: back to its
        # index, saying so — the same as for an id no run has.
        assert missing.ok
        assert "doesn’t exist" in page.locator(".messagelist").inner_text()
        assert "Bravo's hidden run" not in page.content()
