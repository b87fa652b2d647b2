"""G21: a submitter's budget is never overshot. Before each model call its
largest cost is reserved in one guarded statement, settled by the record
of its turn, released by the reaper when its attempt died. Real
PostgreSQL, Redis and rqworkers; every answer reports 18 tokens
(``FAKE_USAGE``)."""

import re
from decimal import Decimal

import pytest

from runs.models.vocabulary import RunStatus, StepKind, TerminationReason
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from spend.call_size import largest_tokens
from spend.models import ModelPrice, SpendHold, SpendReservation, SubmitterBudget
from tests.drifting_model import FAKE_USAGE, MODELS, request_for
from tests.fake_openai import error
from tests.helpers import fresh, later, wait_until
from tests.test_budgets import TURN_TOKENS, spend_of
from tests.test_concurrent_worker import CONCURRENT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

#: The completion tokens a call of these tests reserves (the workers'
#: ``NRLLM_RESERVE_MAX_TOKENS``: their requests set no ``max_tokens``).
RESERVED_COMPLETION = 40
#: The cost variant's price: 1000 a million tokens, in and out.
PER_TOKEN = Decimal("0.001")


def largest_first_call(agent_run) -> int:
    """What the first call of a run with no tools and no instructions
    reserves: its prompt is the one user message."""
    message = {"role": "user", "content": agent_run.request["prompt"]}
    return largest_tokens([message], [], RESERVED_COMPLETION)


def enqueue_for(operator, model, plan, **extra):
    request = request_for(model, plan, [], scripted_usage=FAKE_USAGE, **extra)
    return enqueue(request, submitted_by=operator)


def assert_settled(operator, tokens: int) -> None:
    """Every reservation is gone; the hold's spend is the recorded turns'."""
    assert not SpendReservation.objects.exists()
    (hold,) = SpendHold.objects.filter(submitter=operator.pk)
    assert (hold.reserved_tokens, hold.reserved_cost) == (0, 0)
    assert hold.spent_tokens == spend_of(operator.pk)[0] == tokens


@pytest.mark.slow
@pytest.mark.parametrize("limit", ["tokens", "cost"])
def test_a_hundred_runs_in_flight_make_exactly_the_calls_their_submitters_budget_fits(
    limit, drifting_model, fake_openai, workers, operator
):
    """100 one-call runs of one submitter on 2 concurrent workers (100 slots
    each), against a budget that fits 10 calls: the 10th call's reservation
    fits beside 9 settled turns, an 11th's does not. In tokens, or in cost
    at a price of 0.001 a token (in and out), so the two are the same race."""
    plan = [{"answer": "done", "delay_seconds": 0.2}]
    runs = [enqueue_for(operator, "drifting", plan) for _ in range(100)]
    largest = largest_first_call(runs[0])
    assert largest > TURN_TOKENS
    budget = 9 * TURN_TOKENS + largest
    if limit == "tokens":
        SubmitterBudget.objects.create(user=operator, period="day", max_tokens=budget)
    else:
        ModelPrice.objects.create(
            provider="openai", model="drifting", input_per_million=1000, output_per_million=1000
        )
        SubmitterBudget.objects.create(user=operator, period="day", max_cost=budget * PER_TOKEN)
    env = {
        **CONCURRENT,
        "NRLLM_WORKER_CONCURRENCY": 100,
        "NRLLM_LEASE_SECONDS": 10,
        "NRLLM_RESERVE_MAX_TOKENS": RESERVED_COMPLETION,
    }
    workers.start(**env)
    workers.start(**env)
    wait_until(
        lambda: all(fresh(run).is_terminal for run in runs), timeout=120, what="every run ended"
    )

    runs = [fresh(run) for run in runs]
    completed = [run for run in runs if run.status == RunStatus.COMPLETED]
    stopped = [run for run in runs if run.status != RunStatus.COMPLETED]
    # Exactly the calls that fit were made: the server saw 10 requests.
    assert len(fake_openai.requests) == 10 == len(completed)
    assert {run.termination_reason for run in stopped} == {TerminationReason.BUDGET_EXHAUSTED}
    why = stopped[0].error_message
    if limit == "tokens":
        shown = (
            f"{10 * TURN_TOKENS} of {budget} tokens spent, and the call may cost up to {largest}"
        )
        assert shown in why, why
    else:
        seen = re.search(r"([\d.]+) of ([\d.]+) spent, and the call may cost up to ([\d.]+)", why)
        assert seen, why
        assert [Decimal(figure) for figure in seen.groups()] == [
            10 * TURN_TOKENS * PER_TOKEN,
            budget * PER_TOKEN,
            largest * PER_TOKEN,
        ], why
    # Never over: the day's spend is the 10 turns, within the budget.
    spent, cost, turns = spend_of(operator.pk)
    assert (spent, turns) == (10 * TURN_TOKENS, 10)
    assert spent <= budget
    if limit == "cost":
        assert cost == 10 * TURN_TOKENS * PER_TOKEN <= budget * PER_TOKEN
    assert_settled(operator, 10 * TURN_TOKENS)


@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_the_reaper_releases_what_a_killed_attempt_reserved_and_the_run_resumes_within_it(
    model, workers, operator
):
    """The budget fits one call's reservation, not two. The first attempt
    reserves and is SIGKILLed in its call: the reservation stays until the
    reaper finds the attempt dead; released, the resumed attempt's call fits."""
    name = "scripted" if model is None else "drifting"
    if model is not None:
        model.hold_turn(0)
        agent_run = enqueue_for(operator, name, [{"answer": "done"}])
    else:
        # The scripted call takes 3 s: the kill comes in it, and the resumed
        # attempt's takes 3 s again.
        agent_run = enqueue_for(operator, name, [{"answer": "done", "delay_seconds": 3}])
    largest = largest_first_call(agent_run)
    SubmitterBudget.objects.create(user=operator, period="day", max_tokens=largest + 5)
    env = {
        "NRLLM_LEASE_SECONDS": 2,
        "NRLLM_RESERVE_MAX_TOKENS": RESERVED_COMPLETION,
        "NRLLM_RESERVATION_WAIT_SECONDS": 2,
    }
    worker = workers.start(**env)
    wait_until(SpendReservation.objects.exists, timeout=30, what="the call's reservation")
    if model is not None:
        assert model.held.wait(timeout=30), "the call never came"
    workers.kill(worker)
    (hold,) = SpendHold.objects.filter(submitter=operator.pk)
    assert hold.reserved_tokens == largest

    report = reap_stale_runs(as_of=later())
    assert report.decisions[str(agent_run.pk)].startswith("requeued")
    assert report.reservations_released == 1
    assert_settled(operator, 0)
    if model is not None:
        model.release.set()
    workers.run_burst(**env)
    wait_until(lambda: fresh(agent_run).is_terminal, timeout=40, what="the resumed run ended")

    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    assert agent_run.requeue_count == 1
    assert agent_run.steps.filter(kind=StepKind.LLM).count() == 1
    if model is not None:
        assert model.requests_by_turn == {0: 2}, model.requests_by_turn
    assert_settled(operator, TURN_TOKENS)


@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_failed_call_releases_its_reservation_and_the_retry_fits(model, workers, operator):
    """The budget fits one call's reservation, not two. The first call gets
    a 500: its attempt releases what it reserved, and the retry's fits."""
    name = "scripted" if model is None else "drifting"
    if model is not None:
        model.fail_turn(0, error(500))
    failure = {"error": "server_error", "attempts": 1}
    request = request_for(
        name, [{"answer": "done"}], [], scripted_usage=FAKE_USAGE, scripted_before={0: failure}
    )
    agent_run = enqueue(request, submitted_by=operator)
    largest = largest_first_call(agent_run)
    SubmitterBudget.objects.create(user=operator, period="day", max_tokens=largest + 5)
    # Retried at once (no backoff), by a worker that stays.
    workers.start(
        NRLLM_RETRY_BACKOFF_SECONDS=0,
        NRLLM_RESERVE_MAX_TOKENS=RESERVED_COMPLETION,
        NRLLM_RESERVATION_WAIT_SECONDS=2,
    )
    wait_until(lambda: fresh(agent_run).is_terminal, timeout=40, what="the retried run ended")

    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    assert agent_run.requeue_count == 1
    if model is not None:
        assert model.requests_by_turn == {0: 2}, model.requests_by_turn
    assert_settled(operator, TURN_TOKENS)
