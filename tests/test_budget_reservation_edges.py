"""G21 at its edges: what the reservations before model calls do when
the budget is removed and restored, a period ends during an attempt, a
provider reports more than the bound or no usage, the database refuses a
turn's record, a request's ``max_tokens`` is out of range, and a run
without a budget parks for approval. Real PostgreSQL, Redis and
rqworkers (``tests.test_budget_reservations``' setups)."""

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.models.faults import step_inserts_refused
from runs.models.vocabulary import RunStatus, TerminationReason
from runs.runtime import enqueue
from runs.runtime.enqueue_spend import BudgetRefused
from runs.runtime.run_request import InvalidRunRequest
from spend.call_size import largest_tokens
from spend.models import DailySpend, ModelPrice, SpendHold, SpendReservation, SubmitterBudget
from tests.approval_requests import waiting
from tests.drifting_model import FAKE_USAGE, SEARCH, request_for
from tests.helpers import fresh, wait_until
from tests.test_budget_reservations import (
    RESERVED_COMPLETION,
    assert_settled,
    largest_first_call,
)
from tests.test_budgets import TURN_TOKENS, spend_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def run_burst_for(operator, workers, usage) -> None:
    """One scripted one-call run of ``operator`` reporting ``usage``, run
    to its end by a burst worker."""
    agent_run = enqueue_for_usage(operator, usage)
    workers.run_burst(NRLLM_RESERVE_MAX_TOKENS=RESERVED_COMPLETION)
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message


def enqueue_for_usage(operator, usage, delay_seconds=0):
    plan = [{"answer": "done", "delay_seconds": delay_seconds}]
    request = request_for("scripted", plan, [], scripted_usage=usage)
    return enqueue(request, submitted_by=operator)


def test_spend_made_while_the_budget_was_removed_counts_when_it_is_restored(workers, operator):
    """An operator removes a submitter's budget for a while and restores
    it the same day: the turns recorded meanwhile (no reservation, no
    settle) must count against the restored budget, or the period row
    reads less than the day's spend and a call passes the budget."""
    probe = enqueue_for_usage(operator, FAKE_USAGE)
    largest = largest_first_call(probe)
    limit = 3 * largest
    budget = SubmitterBudget.objects.create(user=operator, period="day", max_tokens=limit)
    workers.run_burst(NRLLM_RESERVE_MAX_TOKENS=RESERVED_COMPLETION)  # makes the period row
    budget.delete()
    # Unbudgeted: most of the limit spent, outside the period row.
    run_burst_for(
        operator, workers, {"prompt_tokens": limit - TURN_TOKENS - 10, "completion_tokens": 0}
    )
    SubmitterBudget.objects.create(user=operator, period="day", max_tokens=limit)
    assert spend_of(operator.pk)[0] == limit - 10
    # A call that reports its whole reservation: it must not have been made.
    answer = {
        "prompt_tokens": largest - RESERVED_COMPLETION,
        "completion_tokens": RESERVED_COMPLETION,
    }
    last = enqueue_for_usage(operator, answer)
    workers.run_burst(NRLLM_RESERVE_MAX_TOKENS=RESERVED_COMPLETION)
    assert fresh(last).termination_reason == TerminationReason.BUDGET_EXHAUSTED
    assert spend_of(operator.pk)[0] <= limit
    assert_settled(operator, limit - 10)


def test_an_answer_reporting_more_than_its_reservation_passes_the_budget_by_that_alone(
    workers, operator
):
    """A provider may report more tokens than the reservation bounds (one
    that ignores ``max_tokens``, or tokenizes below a byte a token): the
    spend passes the budget by that excess alone — what G21 admits — and
    the submitter's next run is refused."""
    over = enqueue_for_usage(operator, {"prompt_tokens": 5000, "completion_tokens": 5000})
    largest = largest_first_call(over)
    SubmitterBudget.objects.create(user=operator, period="day", max_tokens=largest + 5)
    workers.run_burst(NRLLM_RESERVE_MAX_TOKENS=RESERVED_COMPLETION)
    assert fresh(over).status == RunStatus.COMPLETED
    assert spend_of(operator.pk)[0] == 10_000 > largest + 5
    with pytest.raises(BudgetRefused):
        enqueue_for_usage(operator, FAKE_USAGE)
    assert_settled(operator, 10_000)


def test_a_max_tokens_no_reservation_can_hold_is_refused_at_enqueue(
    drifting_model, workers, operator
):
    """A provider ``max_tokens`` past what a reservation's columns hold
    would make every call's reservation fail in the database: the request
    is refused at enqueue, naming it."""
    SubmitterBudget.objects.create(user=operator, period="day", max_tokens=10**6)
    request = request_for("drifting", [{"answer": "done"}], [])
    request["provider"]["max_tokens"] = 10**19
    with pytest.raises(InvalidRunRequest, match="max_tokens"):
        enqueue(request, submitted_by=operator)


def test_a_max_tokens_written_as_a_whole_float_reserves_and_is_sent_whole(
    drifting_model, fake_openai, workers, operator
):
    """JSON Schema counts 40.0 an integer: the request is valid, and its
    call is reserved (and priced) and sent with ``max_tokens`` 40."""
    ModelPrice.objects.create(
        provider="openai", model="drifting", input_per_million=1, output_per_million=1
    )
    SubmitterBudget.objects.create(user=operator, period="day", max_tokens=10**6)
    request = request_for("drifting", [{"answer": "done"}], [])
    request["provider"]["max_tokens"] = 40.0
    agent_run = enqueue(request, submitted_by=operator)
    workers.run_burst()
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    (sent,) = fake_openai.requests
    assert type(sent["body"]["max_tokens"]) is int
    assert_settled(operator, TURN_TOKENS)


def test_a_run_without_a_budget_parks_for_approval_without_touching_reservations(approvals):
    """The hot path of a run whose submitter has no budget makes no
    reservation statement: not at its calls, nor where its turn is
    recorded by the park for approval."""
    with CaptureQueriesContext(connection) as queries:
        agent_run, _ = waiting(scripted_usage=FAKE_USAGE)
    assert agent_run.status == RunStatus.WAITING_FOR_APPROVAL
    assert agent_run.prompt_tokens  # its turns were counted
    touching = [
        query["sql"]
        for query in queries.captured_queries
        if SpendReservation._meta.db_table in query["sql"]
        or SpendHold._meta.db_table in query["sql"]
    ]
    assert touching == []


def test_a_call_in_flight_at_the_periods_end_counts_in_the_old_period_and_the_new_days_spend(
    workers, operator
):
    """A call reserved in one period and recorded in the next: the old
    period's row settles it, the new day's ``DailySpend`` holds it (the day
    of its record), and a call of the new period reserved meanwhile did not
    see it — the new day passes the budget by the calls in flight at its
    start, the bound G21 states. Midnight is the rows of the day moved back
    one day while the first call is in flight."""
    message = {"role": "user", "content": request_for("scripted", [], [])["prompt"]}
    largest = largest_tokens([message], [], RESERVED_COMPLETION)
    # Each answer costs its whole reservation.
    usage_of = {
        "prompt_tokens": largest - RESERVED_COMPLETION,
        "completion_tokens": RESERVED_COMPLETION,
    }
    first = enqueue_for_usage(operator, usage_of, delay_seconds=3)
    assert largest_first_call(first) == largest
    SubmitterBudget.objects.create(user=operator, period="day", max_tokens=largest)
    workers.start(NRLLM_RESERVE_MAX_TOKENS=RESERVED_COMPLETION)
    wait_until(SpendReservation.objects.exists, timeout=30, what="the first call's reservation")
    (old,) = SpendHold.objects.filter(submitter=operator.pk)
    SpendHold.objects.filter(pk=old.pk).update(start=old.start - timedelta(days=1))

    second = enqueue_for_usage(operator, usage_of)
    workers.run_burst(NRLLM_RESERVE_MAX_TOKENS=RESERVED_COMPLETION)
    wait_until(lambda: fresh(first).is_terminal, timeout=30, what="the first run ended")
    assert fresh(first).status == fresh(second).status == RunStatus.COMPLETED
    # Each period's row is within the budget; the new day's spend is not.
    assert [hold.spent_tokens for hold in SpendHold.objects.order_by("start")] == [largest] * 2
    assert spend_of(operator.pk)[0] == 2 * largest
    assert set(DailySpend.objects.filter(submitter=operator.pk).values_list("day", flat=True)) == {
        fresh(second).created_at.date()
    }


def test_an_attempt_running_past_the_periods_end_reserves_its_next_call_in_the_new_period(
    workers, operator
):
    """An attempt claimed before midnight whose next call comes after it:
    that call is made, and recorded, in the new day, so it is reserved
    against the new period's row — not the claim day's, where the new
    day's other calls would never see it. Midnight is the period's row
    moved back one day while the first call is in flight."""
    plan = [{"calls": [SEARCH], "delay_seconds": 3}, {"answer": "done"}]
    request = request_for("scripted", plan, ["search_notes"], scripted_usage=FAKE_USAGE)
    agent_run = enqueue(request, submitted_by=operator)
    SubmitterBudget.objects.create(user=operator, period="day", max_tokens=10**6)
    workers.start(NRLLM_RESERVE_MAX_TOKENS=RESERVED_COMPLETION)
    wait_until(SpendReservation.objects.exists, timeout=30, what="the first call's reservation")
    (old,) = SpendHold.objects.filter(submitter=operator.pk)
    SpendHold.objects.filter(pk=old.pk).update(start=old.start - timedelta(days=1))
    wait_until(lambda: fresh(agent_run).is_terminal, timeout=30, what="the run ended")

    assert fresh(agent_run).status == RunStatus.COMPLETED, fresh(agent_run).error_message
    holds = SpendHold.objects.filter(submitter=operator.pk).order_by("start")
    # The first turn, recorded after midnight, is in both: the old period
    # settled it, the new one read it from its day's DailySpend.
    assert [(hold.spent_tokens, hold.reserved_tokens) for hold in holds] == [
        (TURN_TOKENS, 0),
        (2 * TURN_TOKENS, 0),
    ]
    assert spend_of(operator.pk)[0] == 2 * TURN_TOKENS


def test_a_turn_answered_without_its_usage_spends_its_whole_reservation(workers, operator):
    """A call whose answer reports no usage may have cost up to its
    reservation, never 0: its record settles the reservation as spent, so
    the submitter's next call, which would fit only were it free, is not
    made."""
    plan = [{"answer": "done", "usage": {}}]  # none reported
    unreported = enqueue(request_for("scripted", plan, []), submitted_by=operator)
    largest = largest_first_call(unreported)
    SubmitterBudget.objects.create(user=operator, period="day", max_tokens=largest + 5)
    workers.run_burst(NRLLM_RESERVE_MAX_TOKENS=RESERVED_COMPLETION)
    assert fresh(unreported).status == RunStatus.COMPLETED
    (hold,) = SpendHold.objects.filter(submitter=operator.pk)
    assert (hold.spent_tokens, hold.reserved_tokens) == (largest, 0)

    second = enqueue_for_usage(operator, FAKE_USAGE)
    workers.run_burst(NRLLM_RESERVE_MAX_TOKENS=RESERVED_COMPLETION)
    assert fresh(second).termination_reason == TerminationReason.BUDGET_EXHAUSTED
    assert not SpendReservation.objects.exists()


def test_an_attempt_never_waits_for_its_own_unrecorded_call(workers, operator):
    """The database refused to record the first turn (G2: the attempt holds
    it, and its reservation). The next call fits beside what is spent, not
    beside that reservation too: nothing another call can settle — the
    attempt's own — so it stops at once, not after waiting
    ``NRLLM_RESERVATION_WAIT_SECONDS`` for itself."""
    plan = [{"calls": [SEARCH]}, {"answer": "done"}]
    request = request_for("scripted", plan, ["search_notes"], scripted_usage=FAKE_USAGE)
    agent_run = enqueue(request, submitted_by=operator)
    # Reservations of about 1000 tokens (the completion's): each fits, not two.
    SubmitterBudget.objects.create(user=operator, period="day", max_tokens=2000)
    began = time.monotonic()
    with step_inserts_refused(kind="llm"):
        workers.run_burst(NRLLM_RESERVE_MAX_TOKENS=1000, NRLLM_RESERVATION_WAIT_SECONDS=30)
    assert time.monotonic() - began < 20
    agent_run = fresh(agent_run)
    assert agent_run.termination_reason == TerminationReason.BUDGET_EXHAUSTED
    assert "tokens spent, and the call may cost up to" in agent_run.error_message
    assert not SpendReservation.objects.exists()
