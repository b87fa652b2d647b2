"""G21 for teams: a team's budget is shared by every run of the team, whoever
submitted it, and kept beside each submitter's own. Before each model call
its largest cost is reserved on both in one guarded statement — both or
neither — settled by the record of its turn and released, on both, when
the call fails. Real PostgreSQL, Redis and rqworkers; every answer reports
18 tokens (``FAKE_USAGE``)."""

from datetime import UTC

import pytest

from runs.models import AgentRun
from runs.models.vocabulary import RunStatus, TerminationReason
from runs.runtime import enqueue
from runs.runtime.enqueue_spend import BudgetRefused
from spend.budgets import database_now
from spend.models import DailySpend, SpendHold, SpendReservation, SubmitterBudget, TeamBudget
from tests.drifting_model import FAKE_USAGE, MODELS, request_for
from tests.fake_openai import error
from tests.helpers import fresh, manage, sqlite_env, wait_until
from tests.test_budget_reservations import RESERVED_COMPLETION, largest_first_call
from tests.test_budgets import TURN_TOKENS
from tests.test_concurrent_worker import CONCURRENT

pytestmark = [pytest.mark.django_db(transaction=True)]


def team_spend(team) -> tuple[int, int]:
    """The tokens and turns of the team's ``DailySpend``."""
    rows = DailySpend.objects.filter(team=team)
    return sum(row.input_tokens + row.output_tokens for row in rows), sum(row.turns for row in rows)


def hold_of(*, team=None, submitter=None) -> SpendHold:
    if team is not None:
        (hold,) = SpendHold.objects.filter(team=team.pk, submitter=0)
    else:
        (hold,) = SpendHold.objects.filter(submitter=submitter.pk, team=0)
    return hold


@pytest.mark.slow
@pytest.mark.worker
def test_a_hundred_runs_of_each_of_two_teams_make_exactly_the_calls_each_teams_budget_fits(
    drifting_model, fake_openai, workers, operator, two_teams
):
    """100 one-call runs in each of two teams, all of one submitter, on 2
    concurrent workers (100 slots each); each team's budget fits 10 calls
    (nine turns plus one call's largest cost), the submitter's fits both
    teams' and more, so every call reserves on two holds — the submitter's
    shared by both teams — and the holds are locked in one order: exactly
    10 requests per team reach the model, neither budget is passed."""
    alpha, bravo = two_teams
    plan = [{"answer": "done", "delay_seconds": 0.2}]
    runs = {
        team: [
            enqueue(
                request_for("drifting", plan, [], scripted_usage=FAKE_USAGE),
                submitted_by=operator,
                team=team,
            )
            for _ in range(100)
        ]
        for team in two_teams
    }
    largest = largest_first_call(runs[alpha][0])
    budget = 9 * TURN_TOKENS + largest
    for team in two_teams:
        TeamBudget.objects.create(team=team, period="day", max_tokens=budget)
    SubmitterBudget.objects.create(user=operator, period="month", max_tokens=2 * budget + 1)
    env = {
        **CONCURRENT,
        "NRLLM_WORKER_CONCURRENCY": 100,
        "NRLLM_LEASE_SECONDS": 10,
        "NRLLM_RESERVE_MAX_TOKENS": RESERVED_COMPLETION,
    }
    workers.start(**env)
    workers.start(**env)
    every_run = runs[alpha] + runs[bravo]
    wait_until(
        lambda: all(fresh(run).is_terminal for run in every_run), timeout=90, what="every run ended"
    )

    # The model server saw 20 requests: 10 per team (each request's run is
    # told by its team's runs completing, one request each).
    assert len(fake_openai.requests) == 20
    for team in two_teams:
        ended = [fresh(run) for run in runs[team]]
        completed = [run for run in ended if run.status == RunStatus.COMPLETED]
        stopped = [run for run in ended if run.status != RunStatus.COMPLETED]
        assert len(completed) == 10, team
        assert {run.termination_reason for run in stopped} == {TerminationReason.BUDGET_EXHAUSTED}
        shown = (
            f"the team {team.slug}'s daily budget: {10 * TURN_TOKENS} of {budget} tokens spent, "
            f"and the call may cost up to {largest}"
        )
        assert shown in stopped[0].error_message, stopped[0].error_message
        # Never over: the team's spend is its 10 turns, within its budget.
        assert team_spend(team) == (10 * TURN_TOKENS, 10)
        hold = hold_of(team=team)
        assert (hold.spent_tokens, hold.reserved_tokens) == (10 * TURN_TOKENS, 0)
        assert hold.spent_tokens <= budget
    # The submitter's hold saw both teams' turns, and holds nothing.
    hold = hold_of(submitter=operator)
    assert (hold.spent_tokens, hold.reserved_tokens) == (20 * TURN_TOKENS, 0)
    assert not SpendReservation.objects.exists()


@pytest.mark.worker
@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_failed_call_frees_both_holds_and_a_call_the_team_has_no_room_for_holds_neither(
    model, workers, operator, two_teams
):
    """The team's budget fits one call's reservation, not two; the
    submitter's fits three. A run's first call gets a 500: its attempt
    releases what it reserved on both, and the retry fits and completes.
    The next run of the team stops before its call, naming the team's
    budget, and reserved nothing on the submitter's either (all or
    nothing); the submitter's run in the other team, which has no budget,
    completes."""
    alpha, bravo = two_teams
    name = "scripted" if model is None else "drifting"
    if model is not None:
        model.fail_turn(0, error(500))
    failure = {"error": "server_error", "attempts": 1}
    first = enqueue(
        request_for(
            name, [{"answer": "done"}], [], scripted_usage=FAKE_USAGE, scripted_before={0: failure}
        ),
        submitted_by=operator,
        team=alpha,
    )
    largest = largest_first_call(first)
    TeamBudget.objects.create(team=alpha, period="day", max_tokens=largest + 5)
    SubmitterBudget.objects.create(user=operator, period="day", max_tokens=3 * largest)
    env = {
        "NRLLM_RETRY_BACKOFF_SECONDS": 0,
        "NRLLM_RESERVE_MAX_TOKENS": RESERVED_COMPLETION,
        "NRLLM_RESERVATION_WAIT_SECONDS": 2,
    }
    workers.start(**env)
    wait_until(lambda: fresh(first).is_terminal, timeout=40, what="the retried run ended")
    first = fresh(first)
    assert first.status == RunStatus.COMPLETED, first.error_message
    assert first.requeue_count == 1
    if model is not None:
        assert model.requests_by_turn == {0: 2}, model.requests_by_turn
    assert not SpendReservation.objects.exists()
    for hold in (hold_of(team=alpha), hold_of(submitter=operator)):
        assert (hold.spent_tokens, hold.reserved_tokens) == (TURN_TOKENS, 0)

    second = enqueue(
        request_for(name, [{"answer": "done"}], [], scripted_usage=FAKE_USAGE),
        submitted_by=operator,
        team=alpha,
    )
    elsewhere = enqueue(
        request_for(name, [{"answer": "done"}], [], scripted_usage=FAKE_USAGE),
        submitted_by=operator,
        team=bravo,
    )
    wait_until(
        lambda: fresh(second).is_terminal and fresh(elsewhere).is_terminal,
        timeout=40,
        what="both runs ended",
    )
    second, elsewhere = fresh(second), fresh(elsewhere)
    assert second.termination_reason == TerminationReason.BUDGET_EXHAUSTED
    assert (
        f"the team alpha's daily budget: {TURN_TOKENS} of {largest + 5} tokens spent, "
        f"and the call may cost up to {largest}"
    ) in second.error_message, second.error_message
    assert elsewhere.status == RunStatus.COMPLETED, elsewhere.error_message
    assert not SpendReservation.objects.exists()
    # Two turns on the submitter's hold (alpha's first, bravo's), one on
    # alpha's: the refused call reserved on neither.
    assert (hold_of(submitter=operator).spent_tokens, hold_of(team=alpha).spent_tokens) == (
        2 * TURN_TOKENS,
        TURN_TOKENS,
    )
    assert hold_of(submitter=operator).reserved_tokens == hold_of(team=alpha).reserved_tokens == 0
    assert not SpendHold.objects.filter(team=bravo.pk).exists()
    assert team_spend(alpha) == (TURN_TOKENS, 1) and team_spend(bravo) == (TURN_TOKENS, 1)


def test_a_run_of_a_team_whose_budget_is_spent_is_refused_at_enqueue_and_stores_nothing(
    operator, two_teams
):
    """The team's turns of today, by any submitter, spend its budget: a run
    in the team is refused (naming the team's budget, with the seconds to
    the period's end), one in another team by the same submitter is not."""
    alpha, bravo = two_teams
    TeamBudget.objects.create(team=alpha, period="month", max_tokens=100)
    DailySpend.objects.create(
        day=fresh_day(),
        submitter=0,
        team=alpha,
        provider="scripted",
        model="scripted",
        turns=2,
        input_tokens=60,
        output_tokens=40,
    )
    request = request_for("scripted", [{"answer": "done"}], [], scripted_usage=FAKE_USAGE)
    with pytest.raises(BudgetRefused) as refused:
        enqueue(request, submitted_by=operator, team=alpha)
    assert "the team alpha's monthly budget is spent: 100 of 100 tokens spent" in str(refused.value)
    assert refused.value.retry_after_seconds > 0
    assert not fresh_runs(alpha)
    enqueue(request, submitted_by=operator, team=bravo)
    assert fresh_runs(bravo) == 1


def fresh_day():
    return database_now().astimezone(UTC).date()


def fresh_runs(team) -> int:
    return AgentRun.objects.filter(team=team).count()


_ON_SQLITE = """
from runs.runtime import run
from spend.call_size import largest_tokens
from spend.models import TeamBudget
from teams.models import Team
from tests.drifting_model import FAKE_USAGE, request_for
team = Team.objects.create(name="Alpha", slug="alpha")
request = request_for("scripted", [{"answer": "ok"}], [], scripted_usage=FAKE_USAGE)
largest = largest_tokens([{"role": "user", "content": request["prompt"]}], [], 40)
TeamBudget.objects.create(team=team, period="day", max_tokens=largest + 5)
for _ in range(2):
    ended = run(request, team=team)
    print("RESULT", ended.status, ended.termination_reason, ended.error_message)
from decimal import Decimal
from spend.budgets import team_budget_and_name
priced = Team.objects.create(name="Priced", slug="priced")
TeamBudget.objects.create(team=priced, period="month", max_cost=Decimal("0.100003"))
print("BUDGET", team_budget_and_name(priced.pk))
"""


def test_on_sqlite_a_teams_budget_is_read_before_each_call(tmp_path, migrated):
    """No reservation on the embedded default: the team's spend is read
    before the call, and the call it has no room for is not made. A limit on
    cost is read back exact (SQLite hands a decimal column back as a float)."""
    migrated(tmp_path / "db.sqlite3")
    env = sqlite_env(tmp_path / "db.sqlite3", NRLLM_RESERVE_MAX_TOKENS="40")
    shell = manage("shell", "-c", _ON_SQLITE, env=env)
    results = [line for line in shell.stdout.splitlines() if line.startswith("RESULT")]
    assert results[0] == "RESULT completed completed ", shell.stderr
    assert results[1].startswith(
        f"RESULT failed budget_exhausted stopped before a model call: the team alpha's daily "
        f"budget: {TURN_TOKENS} of "
    ), results
    budget = "Budget(period='month', max_tokens=None, max_cost=Decimal('0.100003'))"
    assert f"BUDGET ({budget}, 'priced')" in shell.stdout, shell.stdout
