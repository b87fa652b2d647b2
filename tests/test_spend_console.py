"""Spend in the console (G17): a run's tokens and cost on the runs list and
its page (unknown, never 0, while a turn had no price), and the overview's
spend module, read from ``DailySpend`` alone: right numbers, escaped names,
and a query count that does not grow with runs or spend rows."""

import html
import re
from datetime import UTC, timedelta
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.models import AgentRun, RunStep
from spend.budgets import database_now
from spend.models import DailySpend

RUNS = "/admin/runs/agentrun/"
OVERVIEW = "/admin/"  # the overview is the admin's index
DAILY_SPEND = "/admin/spend/dailyspend/"
XSS = "<script>alert('x')</script>"
FAKE = {"prompt_tokens": 11, "completion_tokens": 7, "cached_tokens": 0}


def spent_run(prompt_tokens, completion_tokens, cost, unpriced_turns=0, cached=0) -> AgentRun:
    """A completed run with its spend totals set, as its records would leave them."""
    return AgentRun.objects.create(
        request={"prompt": "p", "tools": []},
        prompt="p",
        status="completed",
        mode="queued",
        prompt_tokens=prompt_tokens,
        cached_prompt_tokens=cached,
        completion_tokens=completion_tokens,
        cost=Decimal(cost),
        unpriced_turns=unpriced_turns,
    )


def turn(agent_run, sequence, lease_token, usage=FAKE, **cost) -> RunStep:
    """An llm step of 11 prompt and 7 completion tokens (``usage=None``: the
    provider reported none); ``cost=None``: unpriced; no ``cost``: recorded
    before turns were priced."""
    return RunStep.objects.create(
        run=agent_run,
        sequence=sequence,
        kind="llm",
        result={"content": "", "usage": usage, **cost},
        lease_token=lease_token,
    )


def text(fragment: str) -> str:
    """What a reader sees of an HTML fragment: tags dropped, then unescaped."""
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def list_row(content: str, agent_run) -> str:
    """The runs list's row of ``agent_run``, as HTML."""
    [row] = [row for row in re.findall(r"<tr.*?</tr>", content, re.S) if str(agent_run.pk) in row]
    return row


def field(page: str, name: str) -> str:
    """The value the run page shows for the field ``name``."""
    pattern = rf'class="form-row field-{name}">.*?<div class="readonly">(.*?)</div>'
    return text(re.search(pattern, page, re.S)[1])


def today():
    return database_now().astimezone(UTC).date()


def spend_row(day, submitter, model, *, turns, tokens, cost, unpriced=0, shard=0) -> DailySpend:
    """A day's spend of one submitter on one model of the ``openai`` provider
    (one of the rows it is spread over: ``shard``)."""
    return DailySpend.objects.create(
        day=day,
        shard=shard,
        submitter=submitter,
        provider="openai",
        model=model,
        turns=turns,
        input_tokens=tokens - tokens // 4,
        output_tokens=tokens // 4,
        cost=Decimal(cost),
        unpriced_turns=unpriced,
    )


def test_the_runs_list_and_a_run_page_show_tokens_and_cost_or_that_it_is_unknown(
    operator_client,
):
    priced = spent_run(25, 11, "0.000195", cached=5)
    # Its third turn was recorded before turns were priced: in no total but tokens.
    unpriced = spent_run(33, 21, "0.0000975", unpriced_turns=1)
    turn(unpriced, 1, 1, cost="0.0000975")
    turn(unpriced, 2, 2, cost=None)
    turn(unpriced, 3, 2)
    turn(unpriced, 4, 2, usage=None, cost=None)

    listing = operator_client.get(RUNS).content.decode()
    # The cost in the row, the tokens with it in its tooltip.
    spend = re.compile(r'<span class="run-spend" title="([^"]*)">([^<]*)</span>')
    assert spend.findall(list_row(listing, priced)) == [("36 tok · 0.000195 USD", "0.000195 USD")]
    unpriced_row = list_row(listing, unpriced)
    assert spend.findall(unpriced_row) == [("54 tok · cost unknown", "cost unknown")]
    assert "USD" not in unpriced_row
    # The spend column (the seventh) sorts by total tokens.
    for order, expected in [("-7", [unpriced, priced]), ("7", [priced, unpriced])]:
        listing = operator_client.get(RUNS, {"o": order}).content.decode()
        positions = [listing.index(str(agent_run.pk)) for agent_run in expected]
        assert positions == sorted(positions), order

    page = operator_client.get(f"{RUNS}{priced.pk}/change/").content.decode()
    shown = {name: field(page, name) for name in ("cached_prompt_tokens", "total_tokens_shown")}
    assert shown == {"cached_prompt_tokens": "5", "total_tokens_shown": "36"}
    assert field(page, "cost_shown") == "0.000195 USD"

    page = operator_client.get(f"{RUNS}{unpriced.pk}/change/").content.decode()
    assert field(page, "cost_shown") == (
        "unknown (1 turn of unknown cost: no price, or no usage reported; "
        "the others: 0.0000975 USD)"
    )
    page = html.unescape(page)
    # Each turn in the timeline, each attempt's turns in the attempts table.
    for shown in [
        "18 tok · 0.0000975 USD",
        "18 tok · no price",
        "18 tok · cost not recorded",
        "0 tok · no usage reported",
    ]:
        assert shown in page
    attempts = re.search(r'<table class="timeline" id="attempts".*?</table>', page, re.S)[0]
    assert "spent: 1 turn, 18 tok · 0.0000975 USD" in attempts
    # The turn without usage counts, its cost unknown, as in the totals.
    assert "spent: 3 turns, 36 tok · unknown (3 unpriced)" in attempts


def test_the_overview_charts_and_tables_the_daily_spend_escaped(operator, operator_client):
    operator.user_permissions.add(Permission.objects.get(codename="view_dailyspend"))
    hostile = get_user_model().objects.create_user(XSS)
    day = today()
    spend_row(day, operator.pk, "gpt-4o", turns=3, tokens=1500, cost="0.5")
    spend_row(day - timedelta(days=3), hostile.pk, XSS, turns=2, tokens=400, cost="0.1", unpriced=1)
    spend_row(day - timedelta(days=20), 0, "gpt-4o", turns=1, tokens=100, cost="0.25")
    spend_row(day - timedelta(days=40), 0, "gpt-4o", turns=9, tokens=900, cost="9")  # too old

    content = operator_client.get(OVERVIEW).content.decode()
    assert XSS not in content and "&lt;script&gt;" in content
    page = html.unescape(content)
    chart = re.search(r'<svg id="spend-chart" role="img" aria-label="([^"]*)".*?</svg>', page, re.S)
    assert chart[1].endswith(": ≥ 0.6 USD (1 unpriced) in all")
    titles = re.findall(r"<title>(.*?)</title>", chart[0])
    assert len(titles) == 14 and titles[-1] == f"{day}: 0.5 USD, 1,500 tokens in 3 turns"
    assert titles[-4] == f"{day - timedelta(days=3)}: ≥ 0.1 USD (1 unpriced), 400 tokens in 2 turns"
    assert titles[0] == f"{day - timedelta(days=13)}: nothing spent"
    assert chart[0].count('class="mark"') == 1
    assert "6 turns, 2,000 tokens, ≥ 0.85 USD (1 unpriced)" in page

    def table(name):
        found = re.search(rf'<table[^>]*id="spend-by-{name}">.*?</table>', content, re.S)[0]
        rows = re.findall(r"<tr><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td>", found)
        return [tuple(text(cell) for cell in row) for row in rows]

    assert table("model") == [
        ("openai/gpt-4o", "4", "1,600", "0.75 USD"),
        (f"openai/{XSS}", "2", "400", "≥ 0.1 USD (1 unpriced)"),
    ]
    assert table("submitter") == [
        ("olivia", "3", "1,500", "0.5 USD"),
        ("the command line", "1", "100", "0.25 USD"),
        (XSS, "2", "400", "≥ 0.1 USD (1 unpriced)"),
    ]
    # Each name links to its rows in the daily spend list.
    [link] = re.findall(r'<a href="([^"]*submitter=0[^"]*)"', content)
    listed = operator_client.get(html.unescape(link)).content.decode()
    assert (
        listed.count('class="field-cost_shown"') == 1 and ">0.25 USD<" in listed
    )  # not 40 days ago


def test_the_daily_spend_list_is_a_row_per_day_submitter_and_model_its_shards_summed(
    operator, operator_client
):
    """A key's spend is spread over shards (``DailySpend.shard``), which the
    list showed as identical-looking rows, the submitter as ``0``."""
    operator.user_permissions.add(Permission.objects.get(codename="view_dailyspend"))
    day = today()
    for shard, (turns, cost, unpriced) in enumerate([(1, "0.1", 0), (2, "0.2", 1), (3, "0.3", 0)]):
        spend_row(
            day,
            operator.pk,
            "gpt-4o",
            turns=turns,
            tokens=400,
            cost=cost,
            unpriced=unpriced,
            shard=shard + 4,
        )
    for shard in (0, 9):
        spend_row(day, 0, "gpt-4o", turns=1, tokens=100, cost="0.05", shard=shard)
    spend_row(day - timedelta(days=1), 999, XSS, turns=2, tokens=80, cost="0.01")

    def rows(query=None) -> list[tuple]:
        content = operator_client.get(DAILY_SPEND, query or {}).content.decode()
        assert XSS not in content
        body = re.search(r'<table id="result_list">.*?<tbody>(.*?)</tbody>', content, re.S)[1]
        return [
            tuple(
                text(cell).strip() for cell in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S)
            )
            for row in re.findall(r"<tr.*?</tr>", body, re.S)
        ]

    shown_day = f"{day:%Y-%m-%d}"  # as the console writes a day (console/formats)
    # A day's costliest first; the tokens: input (cached) · output.
    assert rows() == [
        (shown_day, "olivia", "openai/gpt-4o", "6", "900 (0) · 300", "≥ 0.6 USD (1 unpriced)"),
        (shown_day, "the command line", "openai/gpt-4o", "2", "150 (0) · 50", "0.1 USD"),
        (
            rows()[2][0],
            "user #999 (deleted)",
            f"openai/{XSS}",
            "2",
            "60 (0) · 20",
            "0.01 USD",
        ),
    ]
    # The overview's links filter by key; sorting by cost sorts the sums.
    assert [row[1] for row in rows({"submitter": 0})] == ["the command line"]
    assert [row[5] for row in rows({"o": "-6"})] == [
        "≥ 0.6 USD (1 unpriced)",
        "0.1 USD",
        "0.01 USD",
    ]
    assert "3 daily spends" in operator_client.get(DAILY_SPEND).content.decode()

    # Above the rows, what the filters select adds up to (issue #47): every
    # shard of every key listed, whatever the page, in one query.
    def totals(query=None) -> str:
        with CaptureQueriesContext(connection) as captured:
            content = operator_client.get(DAILY_SPEND, query or {}).content.decode()
        summed = 'SUM("spend_dailyspend"."turns")'  # the rows' own sums are their keys' (U0)
        assert sum(summed in one["sql"] for one in captured) == 1
        return text(re.search(r'<p id="spend-totals"[^>]*>(.*?)</p>', content)[1])

    assert totals() == (
        "Selected: 3 rows, 10 turns, 1,110 (0) · 370 tokens, ≥ 0.71 USD (1 unpriced)"
    )
    assert totals({"submitter": 0}) == "Selected: 1 row, 2 turns, 150 (0) · 50 tokens, 0.1 USD"
    assert totals({"day": str(day - timedelta(days=1))}).startswith("Selected: 1 row, 2 turns")
    assert totals({"provider__exact": "anthropic"}) == (
        "Selected: 0 rows, 0 turns, 0 (0) · 0 tokens, 0 USD"
    )


def test_the_overview_and_list_queries_do_not_grow_with_runs_or_spend_rows(
    operator, operator_client, django_assert_max_num_queries
):
    def queries_for(url):
        with CaptureQueriesContext(connection) as captured:
            assert operator_client.get(url).status_code == 200
        return len(captured)

    spent_run(11, 7, "0.0000975")
    # A submitter that is a user: naming users is one query, however many.
    spend_row(today(), operator.pk, "gpt-4o", turns=1, tokens=18, cost="0.0000975")
    operator.user_permissions.add(Permission.objects.get(codename="view_dailyspend"))
    few = {url: queries_for(url) for url in (RUNS, OVERVIEW, DAILY_SPEND)}
    for index in range(30):
        spent_run(11, 7, "0.0000975", unpriced_turns=index % 2)
        day = today() - timedelta(days=index)
        spend_row(day, index, f"model-{index}", turns=2, tokens=36, cost="0.0002", unpriced=1)
    for url, count in few.items():
        with django_assert_max_num_queries(count):
            assert operator_client.get(url).status_code == 200
