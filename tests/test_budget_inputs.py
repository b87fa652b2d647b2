"""G17's edges: a bad limit or price file is refused naming what is wrong and
stores nothing; ``/api/usage/`` groups the day's spend; the metrics count
what was recorded."""

import io
import json
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import CommandError, call_command
from django.test import Client

from runs import transitions
from runs.models import AgentRun
from runs.models.vocabulary import RunStatus, TerminationReason
from runs.operators.requeue_safety import requeue_safety, restart_safety
from runs.runtime import run
from runs.runtime.loop import tool_spec
from runs.runtime.run_request import parse_stored_request
from spend.budgets import database_now
from spend.call_size import largest_tokens
from spend.models import DailySpend, ModelPrice
from tests.drifting_model import FAKE_USAGE, NOTIFY, SEARCH, openai_request, request_for
from tests.fake_openai import Reply, completion
from tests.helpers import fresh
from tools.registry import get_registry

pytestmark = pytest.mark.django_db(transaction=True)


def a_request(**extra) -> dict:
    return request_for("scripted", [{"answer": "done"}], [], scripted_usage=FAKE_USAGE, **extra)


@pytest.mark.parametrize(
    ("limits", "named"),
    [
        ({"max_total_tokens": 0}, "max_total_tokens"),
        ({"max_total_tokens": 2.5}, "max_total_tokens"),
        ({"max_cost": "two"}, "max_cost"),
        ({"max_cost": -1}, "max_cost"),
        ({"max_cost": "NaN"}, "max_cost"),
        ({"max_cost": True}, "max_cost"),
        ({"max_cost": None}, "max_cost"),
        ({"max_cost": "0"}, "max_cost"),
        ({"max_cost": " 2.5 "}, "max_cost"),
        ({"max_cost": "1_0"}, "max_cost"),
        ({"max_cost": "\u0662"}, "max_cost"),
        ({"max_cost": 1e-300}, "max_cost"),
        ({"max_cost": "1e400"}, "max_cost"),
        # A cost limit on a model with no price could not be kept.
        ({"max_cost": "1.00"}, "has no price"),
    ],
)
def test_a_bad_limit_is_a_400_naming_it_and_stores_nothing(api, limits, named):
    response = api.post("/api/runs/", a_request(**limits), format="json")
    assert response.status_code == 400, response.content
    assert named in response.json()["detail"]
    assert AgentRun.objects.count() == 0


def test_a_tiny_cost_limit_is_stored_as_a_resumed_attempt_reads_it(api):
    """``str(Decimal)`` writes 5e-7 as "5E-7", which the stored form's check
    once refused: every resume of such a run was dead-lettered. (Priced so
    low that its first call's largest cost, ~4,140 tokens, fits.)"""
    cheap = Decimal("0.0001")
    ModelPrice.objects.create(
        provider="scripted", model="scripted", input_per_million=cheap, output_per_million=cheap
    )
    response = api.post("/api/runs/", a_request(max_cost=5e-7), format="json")
    assert response.status_code == 201, response.content
    stored = AgentRun.objects.get().request
    assert stored["max_cost"] == "0.0000005"
    assert parse_stored_request(stored).max_cost == Decimal("5E-7")
    # A run stored before, in exponent form, still resumes.
    assert parse_stored_request({**stored, "max_cost": "5E-7"}).max_cost == Decimal("5E-7")


def test_a_price_file_is_loaded_whole_or_not_at_all_and_each_change_is_logged(tmp_path, operator):
    good = [
        {
            "provider": "openai",
            "model": "gpt-x",
            "input_per_million": "2.5",
            "output_per_million": 10,
        },
        {
            "provider": "scripted",
            "model": "scripted",
            "input_per_million": 1,
            "cached_input_per_million": 0.5,
            "output_per_million": 4,
        },
    ]
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(good))
    call_command("load_prices", str(path), user=operator.username, stdout=io.StringIO())
    assert ModelPrice.objects.get(model="gpt-x").input_per_million == Decimal("2.5")
    assert LogEntry.objects.filter(user=operator).count() == 2

    changed = [{**good[0], "output_per_million": "12"}, {**good[1], "input_per_million": -1}]
    path.write_text(json.dumps(changed))
    with pytest.raises(CommandError, match="entry 1: input_per_million"):
        call_command("load_prices", str(path), user=operator.username)
    assert ModelPrice.objects.get(model="gpt-x").output_per_million == Decimal("10")
    for broken, why in [
        ("{", "not JSON"),
        ("{}", "a JSON list"),
        (json.dumps([good[0], good[0]]), "listed twice"),
        (json.dumps([{**good[0], "colour": "red"}]), "unknown field"),
        (json.dumps([{"provider": "openai"}]), "missing"),
        (json.dumps([{**good[0], "model": "a\u0000b"}]), "NUL"),
        (json.dumps([{**good[0], "input_per_million": "99999999.9999999"}]), "not an amount"),
        # Past Python's digit limit json.loads raises a plain ValueError.
        ('[{"input_per_million": 1' + "0" * 5000 + "}]", "not JSON"),
    ]:
        path.write_text(broken)
        with pytest.raises(CommandError, match=why):
            call_command("load_prices", str(path), user=operator.username)
    with pytest.raises(CommandError, match="no user named"):
        call_command("load_prices", str(path), user="nobody")
    assert LogEntry.objects.filter(user=operator).count() == 2


def test_usage_groups_the_recorded_spend_by_day_model_and_user(api, operator, settings):
    settings.NRLLM_METRICS_TOKEN = "scrape-token"
    before = scraped()
    ModelPrice.objects.create(
        provider="scripted", model="scripted", input_per_million=2, output_per_million=8
    )
    run(a_request(), submitted_by=operator)
    run(a_request())  # the command line: no submitter
    today = database_now().date()
    DailySpend.objects.create(
        day=today - timedelta(days=40), submitter=operator.pk, provider="x", model="old"
    )

    by_user = {row["user"]: row for row in api.get("/api/usage/?group_by=user").json()}
    assert {user: (row["tokens"], row["turns"]) for user, row in by_user.items()} == {
        operator.username: (18, 1),
        None: (18, 1),
    }
    mine = by_user[operator.username]
    assert mine["cost"] == "0.000078" and mine["cost_known"]
    (by_model,) = api.get("/api/usage/?group_by=model").json()
    assert (by_model["provider"], by_model["model"], by_model["tokens"]) == (
        "scripted",
        "scripted",
        36,
    )
    since = (today - timedelta(days=60)).isoformat()
    days = api.get(f"/api/usage/?group_by=day&since={since}").json()
    assert [row["day"] for row in days] == [
        today.isoformat(),
        (today - timedelta(days=40)).isoformat(),
    ]

    for query, field in [
        ("", "group_by"),
        ("?group_by=week", "group_by"),
        ("?group_by=day&since=x", "since"),
        ("?group_by=day&since=20260101", "since"),
        ("?group_by=day&since=2026-W01-1", "since"),
        ("?group_by=day&since=2026-05-01&until=2026-04-01", "until"),
        # No 30 days before it for the default since; and the calendar's ends.
        ("?group_by=day&until=0001-01-05", "until"),
        ("?group_by=day&since=10000-01-01", "since"),
        ("?group_by=day&since=9999-12-31&until=0001-01-01", "until"),
    ]:
        response = api.get(f"/api/usage/{query}")
        assert response.status_code == 400 and field in response.json()["detail"], query
    # The calendar's first and last days are days like any other.
    for query, turns in [
        ("?group_by=day&since=0001-01-01&until=0001-01-05", 0),
        ("?group_by=day&until=0001-01-31", 0),
        ("?group_by=model&since=9999-12-31", 0),
        ("?group_by=user&since=0001-01-01&until=9999-12-31", 2),
    ]:
        response = api.get(f"/api/usage/{query}")
        assert response.status_code == 200, (query, response.content)
        assert sum(row["turns"] for row in response.json()) == turns, query

    after = scraped()
    output = 'nrllm_tokens_total{kind="output",model="scripted/scripted"}'
    assert after[output] - before.get(output, 0) == 14
    cost = 'nrllm_cost_total{model="scripted/scripted"}'
    assert after[cost] - before.get(cost, 0) == pytest.approx(2 * 0.000078)


def scraped() -> dict[str, float]:
    """Every sample /metrics shows now: {"name{labels}": value}."""
    response = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token")
    assert response.status_code == 200
    lines = [line for line in response.content.decode().splitlines() if line[:1] != "#"]
    return {name: float(value) for name, value in (line.rsplit(" ", 1) for line in lines)}


@pytest.mark.parametrize(
    "usage",
    [None, {}, {"prompt_tokens": None, "completion_tokens": None}, {"prompt_tokens": -5}],
    ids=["absent", "empty", "null", "negative"],
)
def test_a_turn_whose_provider_reports_no_usage_is_unknown_and_stops_a_limited_run(
    drifting_model, usage
):
    """Some servers and proxies answer without ``usage``, or with counts
    missing: the turn's tokens and cost are unknown, never 0, and a run with
    a limit cannot go on."""
    silent = completion("on it", tool_calls=[("call_1", "search_notes", '{"query": "x"}')])
    if usage is None:
        del silent["usage"]
    else:
        silent["usage"] = usage
    drifting_model.fail_turn(0, Reply(body=silent))
    plan = [{"calls": [SEARCH]}, {"answer": "done"}]
    limited = openai_request("ship it", plan, ["search_notes"], max_total_tokens=1000)
    limited["provider"]["max_tokens"] = 40  # the call's largest cost fits the limit
    limited = run(limited)

    assert limited.termination_reason == TerminationReason.BUDGET_EXHAUSTED
    assert "without reporting its usage" in limited.error_message
    assert (limited.total_tokens, limited.unpriced_turns, limited.known_cost) == (0, 1, None)
    assert drifting_model.requests_by_turn == {0: 1}


def test_a_cost_limited_run_whose_model_lost_its_price_is_requeued_once_priced_again(
    operator,
):
    """The verdict reads the price as the resumed attempt will: missing,
    the requeue would stop at once, and it says what to do."""
    price = ModelPrice.objects.create(
        provider="scripted", model="scripted", input_per_million=1, output_per_million=1
    )
    failed = run(
        request_for(
            "scripted",
            [{"calls": [SEARCH]}],
            ["search_notes"],
            max_cost="1.00",
            scripted_usage=FAKE_USAGE,
        )
        | {"provider": {"kind": "scripted", "turns": [{"error": "auth"}]}}
    )
    assert failed.status == "failed"
    price.delete()
    verdict = requeue_safety(failed)
    assert (verdict.allowed, verdict.code) == (False, "price_missing"), verdict
    assert "set its price in Spend › Model prices, then requeue" in verdict.reason
    ModelPrice.objects.create(
        provider="scripted", model="scripted", input_per_million=1, output_per_million=1
    )
    assert requeue_safety(failed).allowed


def test_a_max_tokens_written_as_a_whole_float_bounds_a_limited_run_and_its_verdicts():
    """JSON Schema counts 40.0 an integer, so a script (or an ``openai``
    request) may carry it: a limited run's calls, and the verdicts that size
    its next one from the stored request, read it as 40 — never a float
    priced in decimals, a TypeError that failed the run and made its page
    and its requeue a 500 (G17)."""
    ModelPrice.objects.create(
        provider="scripted", model="scripted", input_per_million=1, output_per_million=1
    )
    plan = [{"calls": [SEARCH]}] * 3 + [{"answer": "done"}]
    request = request_for(
        "scripted", plan, ["search_notes"], max_total_tokens=730, scripted_usage=FAKE_USAGE
    )
    request["provider"]["max_tokens"] = 40.0
    stopped = fresh(run(request))

    # As test_budgets.py's run capped at 40: turn 3's call does not fit.
    why = stopped.error_message
    assert stopped.termination_reason == TerminationReason.BUDGET_EXHAUSTED, why
    size = re.search(r"36 of 730 tokens spent, and the call may cost up to (\d+)", why)
    assert size, why
    verdict = requeue_safety(stopped)
    assert (verdict.allowed, verdict.code) == (False, "run_limit_spent"), verdict
    assert f"the call may cost up to {size[1]};" in verdict.reason
    assert restart_safety(stopped).allowed


@pytest.mark.usefixtures("approvals")
def test_a_requeue_whose_last_calls_go_live_first_sizes_the_call_that_sends_their_outcomes():
    """A run cancelled while its write waits for approval: resumed, it would
    wait again, run the write once approved, then stop before its next
    call, which sends the write's outcome with the whole conversation and
    cannot fit the limit. The verdict sizes that call (the outcome at its
    shortest: the least the attempt's check can find), not by the last
    turn's 18 tokens, which fit: the write would run for nothing."""
    plan = [{"calls": [NOTIFY]}, {"answer": "sent"}]
    request = request_for("scripted", plan, ["send_notification"], scripted_usage=FAKE_USAGE)
    request["provider"]["max_tokens"] = 40
    prompt = {"role": "user", "content": request["prompt"]}
    first = largest_tokens([prompt], [tool_spec(get_registry().get("send_notification"))], 40)
    # The first call fits, and so would a next one of the last turn's 18 tokens.
    limit = first + 2 * 18
    parked = fresh(run({**request, "max_total_tokens": limit}))
    assert parked.status == RunStatus.WAITING_FOR_APPROVAL, parked.error_message
    transitions.cancel(parked.pk)

    verdict = requeue_safety(fresh(parked))
    assert (verdict.allowed, verdict.code) == (False, "run_limit_spent"), verdict
    assert f"18 of {limit} tokens spent, and the call may cost up to" in verdict.reason
    assert "at least: the calls of its last turn go live first" in verdict.reason


def test_a_limited_run_whose_request_sets_no_max_tokens_holds_the_model_to_its_bound(
    drifting_model, fake_openai, settings
):
    """Its calls are sized by their prompt's bytes and
    ``NRLLM_RESERVE_MAX_TOKENS``: the model is sent that bound, or an honest
    answer longer than it passes the limit (G17). A run under no limit or
    budget sends none. An endpoint that takes the bound only as
    ``max_completion_tokens`` (OpenAI's reasoning models) is sent it so."""
    request = openai_request("ship it", [{"answer": "done"}], [])
    run({**request, "max_total_tokens": 10_000})
    run(request)
    settings.NRLLM_OPENAI_MAX_TOKENS_PARAMETER = "max_completion_tokens"
    run({**request, "max_total_tokens": 10_000})
    limited, free, renamed = fake_openai.requests
    assert limited["body"]["max_tokens"] == settings.NRLLM_RESERVE_MAX_TOKENS
    assert "max_tokens" not in free["body"]
    assert "max_completion_tokens" not in free["body"]
    assert renamed["body"]["max_completion_tokens"] == settings.NRLLM_RESERVE_MAX_TOKENS
    assert "max_tokens" not in renamed["body"]
