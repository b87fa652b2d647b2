"""G17: budgets are exact and fail before, never during. Real PostgreSQL,
Redis and rqworkers; the scripted provider reports the fake server's usage
(``FAKE_USAGE``), so both models spend 18 tokens a turn."""

import json
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.db import connection

from runs.approvals import actions as approval_actions
from runs.models import AgentRun, ApprovalRequest, DeadLetter
from runs.models.vocabulary import RunStatus, StepKind, TerminationReason
from runs.operators import actions as operator_actions
from runs.operators.requeue_safety import requeue_safety, restart_safety
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue, run
from spend.models import DailySpend, ModelPrice, SpendHold, SubmitterBudget
from tests.drifting_model import FAKE_USAGE, MODELS, NOTIFY, SEARCH, request_for
from tests.fake_openai import Reply, completion, error
from tests.helpers import fresh, later, wait_until
from tools.models import OutboxNotification

pytestmark = pytest.mark.django_db(transaction=True)

#: Per million tokens: a turn of 11 prompt and 7 completion tokens costs 0.0000975.
INPUT, OUTPUT = Decimal("2.50"), Decimal("10")
TURN_COST = (11 * INPUT + 7 * OUTPUT) / 1_000_000
TURN_TOKENS = 18
#: Workers that reserve 40 completion tokens a call (G21), not 4096: the
#: requests set no ``max_tokens``, and the budgets here are small.
RESERVING = {"NRLLM_RESERVE_MAX_TOKENS": 40}


def model_name(model) -> str:
    return "scripted" if model is None else "drifting"


def priced() -> None:
    for provider, model in (("scripted", "scripted"), ("openai", "drifting")):
        ModelPrice.objects.create(
            provider=provider, model=model, input_per_million=INPUT, output_per_million=OUTPUT
        )


def a_request(model, plan, tools, **extra) -> dict:
    return request_for(model_name(model), plan, tools, scripted_usage=FAKE_USAGE, **extra)


def capped(request: dict) -> dict:
    """``request`` with its model's answers bounded by 40 tokens: the most
    each call can cost is its prompt's bytes and 40 (G17)."""
    request["provider"]["max_tokens"] = 40
    return request


def turns_of(agent_run) -> list[dict]:
    return [step.result for step in agent_run.steps.filter(kind=StepKind.LLM)]


def recorded_tokens(agent_run) -> int:
    return sum(
        turn["usage"]["prompt_tokens"] + turn["usage"]["completion_tokens"]
        for turn in turns_of(agent_run)
    )


def spend_of(submitter: int) -> tuple[int, Decimal, int]:
    rows = DailySpend.objects.filter(submitter=submitter)
    tokens = sum(row.input_tokens + row.output_tokens for row in rows)
    return tokens, sum((row.cost for row in rows), Decimal(0)), sum(row.turns for row in rows)


@pytest.mark.worker
@pytest.mark.parametrize("cut", ["retried", "killed"])
@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_run_stops_before_the_call_that_would_cross_its_limit_and_a_resume_counts_no_replay(
    model, cut, workers
):
    """The first attempt makes turn 1 and is cut in the call for turn 2: a
    500 (retried) or a SIGKILL (reaped). The resumed attempt goes on."""
    priced()
    plan = [{"calls": [SEARCH]}, {"calls": [SEARCH]}, {"calls": [SEARCH]}, {"answer": "done"}]
    # A call's largest cost is its prompt's bytes and its max_tokens (40):
    # about 585 tokens for turn 2 and 828 for turn 3 on the scripted
    # provider, 928 and 1182 on the drifting one (whose prompt carries its
    # plan). Turn 2 fits beside turn 1's 18 tokens, turn 3 not beside 36.
    tools, ceiling = ["search_notes"], {"scripted": 730, "drifting": 1080}[model_name(model)]
    limit = {"max_total_tokens": ceiling}

    def a_limited_request(**extra):
        return capped(a_request(model, plan, tools, **limit, **extra))

    if cut == "retried":
        if model is not None:
            model.fail_turn(1, error(500))
        server_error = {"error": "server_error", "attempts": 1}
        agent_run = enqueue(a_limited_request(scripted_before={1: server_error}))
        # Retried at once (no backoff): test_crash_recovery.py's scheduler
        # test waits a backoff out.
        workers.start(NRLLM_RETRY_BACKOFF_SECONDS=0)
    else:
        if model is not None:
            model.hold_turn(1)
        agent_run = enqueue(a_limited_request(scripted_delays={1: 3}))
        worker = workers.start(NRLLM_LEASE_SECONDS=2)
        wait_until(
            lambda: fresh(agent_run).steps.filter(kind=StepKind.TOOL).exists(),
            what="turn 1 and its call recorded",
        )
        if model is not None:
            assert model.held.wait(timeout=30), "the call for turn 2 never came"
        workers.kill(worker)
        assert reap_stale_runs(as_of=later()).decisions[str(agent_run.pk)].startswith("requeued")
        if model is not None:
            model.release.set()
        workers.run_burst()
    wait_until(lambda: fresh(agent_run).status == RunStatus.FAILED, timeout=40, what="the stop")

    agent_run = fresh(agent_run)
    # The resumed attempt replayed turn 1 (not counted again), made turn 2
    # and stopped before a third call: 36 spent, and the call could cost
    # more than the limit leaves.
    assert agent_run.termination_reason == TerminationReason.BUDGET_EXHAUSTED
    assert agent_run.requeue_count == 1
    stopped = re.search(
        rf"36 of {ceiling} tokens spent, and the call may cost up to (\d+)",
        agent_run.error_message,
    )
    assert stopped and 36 + int(stopped[1]) > ceiling, agent_run.error_message
    assert agent_run.failure_class == ""
    (letter,) = DeadLetter.objects.filter(run=agent_run)
    assert letter.reason == "budget_exhausted"
    assert len(turns_of(agent_run)) == 2
    assert agent_run.total_tokens == recorded_tokens(agent_run) == 2 * TURN_TOKENS
    assert agent_run.tokens_saved_by_replay == TURN_TOKENS
    # Each turn's cost is stored with it; the run's and the day's are their sum.
    assert [Decimal(turn["cost"]) for turn in turns_of(agent_run)] == [TURN_COST] * 2
    assert agent_run.cost == 2 * TURN_COST and agent_run.known_cost == 2 * TURN_COST
    assert spend_of(0) == (2 * TURN_TOKENS, 2 * TURN_COST, 2)
    assert agent_run.steps.filter(kind=StepKind.TOOL).count() == 2
    if model is not None:
        assert model.requests_by_turn == {0: 1, 1: 2}, model.requests_by_turn
    # A requeue would resume and stop at once, before the very call: its
    # verdict sizes it as the attempt would. A restart's first call, of
    # the prompt alone, fits.
    verdict = requeue_safety(agent_run)
    assert (verdict.allowed, verdict.code) == (False, "run_limit_spent"), verdict
    assert f"36 of {ceiling} tokens spent, and the call may cost up to {stopped[1]}" in (
        verdict.reason
    )
    assert restart_safety(agent_run).allowed


@pytest.mark.worker
def test_two_workers_spending_one_submitters_last_budget_never_pass_it(
    drifting_model, workers, operator
):
    priced()
    budget = 2000
    SubmitterBudget.objects.create(user=operator, period="day", max_tokens=budget)
    # Slow turns, so both workers' calls are in flight when the budget runs out.
    plan = [{"calls": [SEARCH], "delay_seconds": 0.3}] * 8 + [{"answer": "done"}]
    runs = [
        enqueue(a_request(drifting_model, plan, ["search_notes"]), submitted_by=operator)
        for _ in range(4)
    ]
    # One run at a time a process (the forking worker): two turns in flight.
    workers.start(NRLLM_WORKER_CLASS="runs.worker.Worker", **RESERVING)
    workers.start(NRLLM_WORKER_CLASS="runs.worker.Worker", **RESERVING)
    wait_until(
        lambda: all(fresh(run).is_terminal for run in runs), timeout=90, what="every run ended"
    )

    runs = [fresh(run) for run in runs]
    spent, cost, turns = spend_of(operator.pk)
    # Exact: the day's spend is the sum of every run's recorded turns, each
    # counted once, whichever worker recorded it.
    assert spent == sum(run.total_tokens for run in runs) == sum(map(recorded_tokens, runs))
    assert turns == sum(len(turns_of(run)) for run in runs)
    assert cost == turns * TURN_COST
    # A run takes all its 9 turns or stops before a call whose largest cost
    # (its prompt's bytes and 40 more: over 1,000) would not fit beside what
    # is spent; four runs' growing conversations cannot all fit.
    stopped = [run for run in runs if run.termination_reason != TerminationReason.COMPLETED]
    assert stopped and {run.termination_reason for run in stopped} == {
        TerminationReason.BUDGET_EXHAUSTED
    }
    for ended in stopped:
        why = ended.error_message
        seen = re.search(rf"(\d+) of {budget} tokens spent, and the call may cost up to (\d+)", why)
        assert seen, why
        assert budget < int(seen[1]) + int(seen[2]) and int(seen[1]) <= spent, why
    # Never over (G21): each call reserved its largest cost first.
    assert spent <= budget, spent


def test_enqueue_over_budget_is_a_429_with_retry_after_and_stores_nothing(api, operator):
    SubmitterBudget.objects.create(user=operator, period="day", max_tokens=100)
    request = request_for("scripted", [{"answer": "done"}], [])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (statement_timestamp() AT TIME ZONE 'UTC')::date,"
            " extract(epoch FROM date_trunc('day', statement_timestamp() AT TIME ZONE 'UTC')"
            " + interval '1 day' - (statement_timestamp() AT TIME ZONE 'UTC'))"
        )
        today, seconds_left = cursor.fetchone()
    # Yesterday's spend is yesterday's: the budget began again at midnight
    # (UTC, the database's clock).
    spent = {"submitter": operator.pk, "provider": "scripted", "model": "scripted"}
    DailySpend.objects.create(day=today - timedelta(days=1), input_tokens=500, **spent)
    first = api.post("/api/runs/", request, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert first.status_code == 201

    DailySpend.objects.create(day=today, input_tokens=90, output_tokens=10, **spent)
    before = AgentRun.objects.count()
    response = api.post("/api/runs/", request, format="json")
    assert response.status_code == 429, response.content
    assert "daily budget is spent: 100 of 100 tokens spent" in response.json()["detail"]
    assert abs(int(response["Retry-After"]) - float(seconds_left)) <= 5
    assert AgentRun.objects.count() == before
    # A retry of the request that made a run gets that run, spent budget or not.
    again = api.post("/api/runs/", request, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert (again.status_code, again.json()["id"]) == (200, first.json()["id"])


def test_a_price_change_leaves_the_cost_of_earlier_turns_as_it_was(operator_client, operator):
    price = ModelPrice.objects.create(
        provider="scripted", model="scripted", input_per_million=INPUT, output_per_million=OUTPUT
    )
    operator.user_permissions.add(Permission.objects.get(codename="change_modelprice"))
    first = run(a_request(None, [{"answer": "one"}], []))
    page = operator_client.get(f"/admin/spend/modelprice/{price.pk}/change/")
    assert page.status_code == 200
    form = {"provider": "scripted", "model": "scripted", "input_per_million": "5"}
    response = operator_client.post(
        f"/admin/spend/modelprice/{price.pk}/change/",
        {**form, "cached_input_per_million": "", "output_per_million": "20"},
    )
    assert response.status_code == 302, response.content[:500]
    second = run(a_request(None, [{"answer": "two"}], []))

    assert fresh(first).cost == TURN_COST
    assert Decimal(turns_of(first)[0]["cost"]) == TURN_COST
    assert fresh(second).cost == 2 * TURN_COST
    assert spend_of(0)[1] == 3 * TURN_COST
    (entry,) = LogEntry.objects.filter(object_id=str(price.pk))
    assert "Input per million" in entry.get_change_message()

    # A model with no price: its cost is unknown, never 0.
    price.delete()
    third = fresh(run(a_request(None, [{"answer": "three"}], [])))
    assert (third.unpriced_turns, third.known_cost) == (1, None)
    assert turns_of(third)[0]["cost"] is None


@pytest.mark.worker
@pytest.mark.usefixtures("approvals")
@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_budget_spent_while_a_write_waits_for_approval_never_repeats_the_write(
    model, workers, operator
):
    priced()
    SubmitterBudget.objects.create(user=operator, period="day", max_tokens=1000)
    plan = [{"calls": [NOTIFY]}, {"answer": "sent (take {take})"}]
    agent_run = enqueue(a_request(model, plan, ["send_notification"]), submitted_by=operator)
    workers.run_burst(**RESERVING)
    assert fresh(agent_run).status == RunStatus.WAITING_FOR_APPROVAL
    assert fresh(agent_run).total_tokens == TURN_TOKENS  # the turn that parked counts
    # ...and its park settled the call's reservation to it (G21).
    (hold,) = SpendHold.objects.filter(submitter=operator.pk)
    assert (hold.spent_tokens, hold.reserved_tokens) == (TURN_TOKENS, 0)

    # Other runs of the submitter spend the rest while the call waits.
    DailySpend.objects.filter(submitter=operator.pk).update(input_tokens=1000)
    (request,) = ApprovalRequest.objects.filter(run=agent_run)
    assert approval_actions.approve(request, operator, digest=request.digest).ok
    workers.run_burst(**RESERVING)

    # The approved write ran once, as approved; the run stopped before the
    # next model call.
    agent_run = fresh(agent_run)
    assert agent_run.termination_reason == TerminationReason.BUDGET_EXHAUSTED
    assert agent_run.pending_effect == ""
    (notification,) = OutboxNotification.objects.all()
    assert notification.idempotency_key == request.idempotency_key

    # The operator raises the budget and requeues: the run resumes after the
    # write, never repeats it, and completes.
    SubmitterBudget.objects.filter(user=operator).update(max_tokens=5000)
    assert operator_actions.requeue(agent_run, operator, note="budget raised").ok
    workers.run_burst(**RESERVING)
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.COMPLETED, agent_run.error_message
    assert OutboxNotification.objects.count() == 1
    assert agent_run.total_tokens == recorded_tokens(agent_run) == 2 * TURN_TOKENS
    if model is not None:
        assert model.requests_by_turn == {0: 1, 1: 1}, model.requests_by_turn


@pytest.mark.worker
@pytest.mark.usefixtures("approvals")
@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_turn_without_its_usage_stops_a_limited_run_in_every_later_attempt(
    model, workers, operator
):
    """Turn 1 comes with ``"usage": {}`` and asks for a write that waits for
    approval, so no check runs before the attempt parks. Approved, the
    resumed attempt runs the write once and stops before the next call: the
    turn it replays leaves what the run spent unknown."""
    priced()
    plan = [{"calls": [NOTIFY], "usage": {}}, {"answer": "sent"}]
    if model is not None:
        arguments = {"recipient": "team", "message": "v2 is out"}
        body = completion("on it", tool_calls=[("call_1", NOTIFY["name"], json.dumps(arguments))])
        body["usage"] = {}
        model.fail_turn(0, Reply(body=body))
    limit = {"max_total_tokens": 1000}
    agent_run = enqueue(capped(a_request(model, plan, ["send_notification"], **limit)))
    workers.run_burst()
    agent_run = fresh(agent_run)
    assert agent_run.status == RunStatus.WAITING_FOR_APPROVAL
    assert (agent_run.total_tokens, agent_run.unpriced_turns) == (0, 1)
    (request,) = ApprovalRequest.objects.filter(run=agent_run)
    assert approval_actions.approve(request, operator, digest=request.digest).ok
    workers.run_burst(**RESERVING)

    agent_run = fresh(agent_run)
    assert agent_run.termination_reason == TerminationReason.BUDGET_EXHAUSTED
    assert "without reporting its usage" in agent_run.error_message
    assert OutboxNotification.objects.count() == 1
    if model is not None:
        assert model.requests_by_turn == {0: 1}, model.requests_by_turn
    # Going on again would stop again: neither is offered.
    for verdict in (requeue_safety(agent_run), restart_safety(agent_run)):
        assert (verdict.allowed, verdict.code) == (False, "spend_unknown"), verdict
