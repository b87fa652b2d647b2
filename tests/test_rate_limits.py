"""Shared rate limits (#42, docs/operations.md#shared-rate-limits): one
limit per provider configuration and model, held across worker processes
through Redis; a provider's 429 with ``Retry-After`` pauses every worker;
Redis away while runs wait lets them go without the limit (fail open).

Real ``rqworker`` processes (the concurrent worker), real Redis, and the
local chat-completions server, which counts the requests it receives and
answers 429 past its own limit, as a provider does.
"""

import json
import threading
import time

import pytest
from django.db import connection
from django.db.models.functions import Now

from runs.models import AgentRun, ProviderCircuit
from runs.models.vocabulary import RunStatus
from runs.runtime import enqueue, rate_limit
from runs.runtime import run as run_in_process
from runs.runtime.rate_limit import SharedLimit, waiting_for
from tests.drifting_model import openai_request
from tests.fake_openai import Reply
from tests.test_concurrent_worker import unfinished, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.slow]


def waiting_in_a_thread(start_run) -> tuple[threading.Thread, dict]:
    """``start_run()`` in a thread of its own (and its own connection),
    returned once a run waits for its rate limit: the thread, and a dict
    that holds the run as ``"run"`` once it ended."""
    ended = {}

    def target():
        try:
            ended["run"] = start_run()
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    assert wait_until(
        lambda: any(waiting_for(pk) for pk in AgentRun.objects.values_list("pk", flat=True)), 5
    )
    return thread, ended


def limited(requests_per_minute: int, **env) -> dict:
    """A concurrent worker's environment with a limit on the drifting model."""
    return {
        "NRLLM_WORKER_CLASS": "runs.worker.ConcurrentWorker",
        "NRLLM_WORKER_CONCURRENCY": 12,
        "DATABASE_POOL_MAX_SIZE": 4,
        "NRLLM_LEASE_SECONDS": 3,
        "NRLLM_OPERATION_MARGIN_SECONDS": 1,
        # A model call's deadline (G16) of 2 s and the margin: a wait longer
        # than that is kept by the heartbeat for the wait's own bound.
        "NRLLM_OPENAI_CONNECT_TIMEOUT_SECONDS": 1,
        "NRLLM_OPENAI_READ_TIMEOUT_SECONDS": 1,
        "NRLLM_MAX_REQUEUES": 0,  # a run that is not let through fails: seen
        "LOG_LEVEL": "WARNING",
        "NRLLM_PROVIDER_RATE_LIMITS": json.dumps(
            {"openai:drifting": {"requests_per_minute": requests_per_minute}}
        ),
        **env,
    }


def one_turn_runs(count: int, text: str) -> list[AgentRun]:
    return [enqueue(openai_request(f"{text} {i}", [{"answer": "ok"}], [])) for i in range(count)]


def finish_noting_holders(runs, seconds: float) -> set[str]:
    """Wait until every run ended; the worker processes (pids) seen holding
    any of ``runs`` meanwhile (a settle clears the lease's owner). No run
    running is ever seen with its lease lapsed (the heartbeat keeps it
    through a wait, G16)."""
    holders, deadline = set(), time.monotonic() + seconds
    ids = [run.pk for run in runs]
    while unfinished() and time.monotonic() < deadline:
        owners = AgentRun.objects.filter(pk__in=ids, status=RunStatus.RUNNING)
        holders |= {owner.split(":")[1] for owner in owners.values_list("lease_owner", flat=True)}
        lapsed = owners.filter(lease_expires_at__lt=Now()).count()
        assert lapsed == 0, f"{lapsed} runs waiting with their lease lapsed"
        time.sleep(0.05)
    assert unfinished() == 0, "runs left unfinished"
    return holders


def workers_metrics(directory) -> dict[str, float]:
    """The worker processes' metrics, as /metrics sums them (multiprocess mode)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    samples = [
        line.rpartition(" ")
        for line in generate_latest(registry).decode().splitlines()
        if line and not line.startswith("#")
    ]
    return {name: float(value) for name, _, value in samples}


def test_two_worker_processes_sharing_a_limit_keep_the_providers_rate_within_it(
    workers, fake_openai, drifting_model
):
    """300 requests a minute (5 a second, a burst of 5) shared by two
    processes of 12 slots each, against a server that refuses past 15
    requests in any 2 s: no 429, at most the limit in every window, every
    run completed, and both processes ran some."""
    fake_openai.limit = (15, 2.0)
    first = workers.start(**limited(300))
    second = workers.start(**limited(300))
    holders = finish_noting_holders(one_turn_runs(24, "shared"), 40)

    statuses = set(AgentRun.objects.values_list("status", flat=True))
    assert statuses == {RunStatus.COMPLETED}, statuses
    assert fake_openai.refused == [], f"{len(fake_openai.refused)} requests got 429"
    # A bucket of 5 at 5 a second: within any 2 s, 5 + 2 × 5 at most.
    assert fake_openai.most_in_any_window(2.0) <= 15
    arrivals = sorted(fake_openai.arrivals)
    steady = (len(arrivals) - 5) / (arrivals[-1] - arrivals[0])
    assert steady <= 5 * 1.05, f"{steady:.2f} requests a second past the burst"
    assert holders == {str(first.pid), str(second.pid)}


def test_a_429_with_retry_after_pauses_every_worker_and_the_run_that_got_it_waits(
    workers, queue, fake_openai, drifting_model, operator_client, tmp_path
):
    """The first request gets 429 with Retry-After: 3. The run that got it
    waits out the pause in its attempt (not requeued, it does not fail,
    the circuit does not count it); runs enqueued after it, in the other
    worker process too, wait for the same pause — shown on their run page —
    and none reaches the provider before it is over."""
    from rq import Worker

    fake_openai.limit_retry_after = 3
    fake_openai.limit = (0, 0.5)  # refuses everything until the test lifts it
    metrics = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    pair = [workers.start(**limited(6000, NRLLM_WORKER_CONCURRENCY=3, **metrics)) for _ in range(2)]
    assert wait_until(lambda: len(Worker.all(connection=queue.connection)) == 2, 30)
    (paused_run,) = one_turn_runs(1, "paused")
    assert wait_until(lambda: fake_openai.refused, 20)
    refused_at = fake_openai.refused[0]
    fake_openai.limit = None
    paused_holder = AgentRun.objects.get(pk=paused_run.pk).lease_owner.split(":")[1]
    others = one_turn_runs(4, "others")

    def waiting_elsewhere():
        for run in AgentRun.objects.filter(pk__in=[run.pk for run in others]):
            if run.lease_owner and run.lease_owner.split(":")[1] != paused_holder:
                if waiting_for(run.pk) == "openai:drifting":
                    return run
        return None

    assert wait_until(waiting_elsewhere, 10), "no run of the other process was seen waiting"
    waiting = waiting_elsewhere() or others[0]
    page = operator_client.get(f"/admin/runs/agentrun/{waiting.pk}/change/").content.decode()
    assert wait_until(lambda: unfinished() == 0, 30)

    assert "waiting for the provider's rate limit (openai:drifting)" in page
    assert len(fake_openai.refused) == 1
    answered = [at for at in fake_openai.arrivals if at != refused_at]
    assert len(answered) == 5
    assert min(answered) - refused_at >= 2.9, "a request went out during the pause"
    assert set(AgentRun.objects.values_list("status", flat=True)) == {RunStatus.COMPLETED}
    assert AgentRun.objects.get(pk=paused_run.pk).requeue_count == 0
    assert paused_holder in {str(worker.pid) for worker in pair}
    # The pause answered the 429: the circuit did not count it as well.
    assert not ProviderCircuit.objects.filter(failures__gt=0).exists()
    # The workers' metrics: the 429, and the waits (each of the 5 runs').
    scraped = workers_metrics(tmp_path)
    assert (
        scraped['nrllm_rate_limit_events_total{event="provider_429",limit="openai:drifting"}'] == 1
    )
    assert scraped['nrllm_rate_limit_wait_seconds_count{limit="openai:drifting"}'] == 5
    assert scraped['nrllm_rate_limit_wait_seconds_sum{limit="openai:drifting"}'] >= 5 * 2


def test_redis_stopped_while_runs_wait_lets_them_go_without_the_limit(
    workers, fake_openai, drifting_model, settings, own_redis
):
    """60 requests a minute, 4 runs of 3 model turns each: with the limit,
    a turn a second, 12 s. Redis stops once the first turns went: the turns
    already given (up to 5 s off) wait for them and go, and the rest go
    without the limit (fail open): every run completes, none fails, none
    hangs, well before the limit would have let them."""
    search = {"calls": [{"name": "search_notes", "arguments": {"query": "n"}}]}
    for index in range(4):
        enqueue(
            openai_request(f"outage {index}", [search, search, {"answer": "ok"}], ["search_notes"])
        )
    worker = workers.start(**limited(60, NRLLM_WORKER_CONCURRENCY=4), REDIS_URL=settings.REDIS_URL)
    assert wait_until(lambda: len(fake_openai.arrivals) >= 2, 20)
    sent_before = len(fake_openai.arrivals)
    own_redis.stop()
    stopped = time.monotonic()
    assert wait_until(lambda: unfinished() == 0, 15)
    took = time.monotonic() - stopped

    assert sent_before <= 3, f"{sent_before} requests went out at once: no limit held them"
    assert set(AgentRun.objects.values_list("status", flat=True)) == {RunStatus.COMPLETED}
    assert len(fake_openai.arrivals) == 12
    # The limit alone would have let the last of them go some 10 s later.
    assert took < 6, f"the runs took {took:.1f}s after Redis stopped"
    assert worker.poll() is None


def test_tokens_are_charged_as_estimated_and_corrected_to_the_reported_usage(queue):
    """6,000 tokens a minute (100 a second, a bucket of 100), through the
    same script on the real Redis: a call estimated at 80 tokens takes them
    at once; the next must wait for its 80; once the first reports 20 used,
    the 60 given back let the next go at once."""
    limit = SharedLimit("openai:m", "openai http://x m", {"tokens_per_minute": 6000})
    assert limit.take(80, may_wait=10) == (True, 0)
    refused = limit.take(80, may_wait=0)
    assert refused[0] is False and 0.5 <= refused[1] <= 0.7
    limit.correct(estimated=80, used=20)
    assert limit.take(80, may_wait=0) == (True, 0)


def test_turns_given_before_a_429_wait_for_its_pause(workers, fake_openai, drifting_model):
    """60 requests a minute: of 4 runs, one goes at once and the others are
    given turns 1, 2 and 3 s later. The first gets 429 with Retry-After: 3:
    the turns given before it come during the pause, and wait it out."""
    fake_openai.limit_retry_after = 3
    fake_openai.limit = (0, 0.5)
    workers.start(**limited(60, NRLLM_WORKER_CONCURRENCY=4))
    one_turn_runs(4, "given")
    assert wait_until(lambda: fake_openai.refused, 20)
    fake_openai.limit = None
    assert wait_until(lambda: unfinished() == 0, 30)

    assert set(AgentRun.objects.values_list("status", flat=True)) == {RunStatus.COMPLETED}
    refused_at = fake_openai.refused[0]
    answered = [at for at in fake_openai.arrivals if at != refused_at]
    assert len(answered) == 4
    assert min(answered) - refused_at >= 2.9, "a turn given before the 429 went during its pause"


@pytest.mark.parametrize("retry_after", ["inf", "1e20"])
def test_an_absurd_retry_after_neither_crashes_the_run_nor_pauses_past_the_wait_bound(
    queue, fake_openai, settings, retry_after
):
    """A 429 whose ``Retry-After`` is infinite or far past anything Redis
    can store: the run fails ``rate_limit`` (retryable) as for any 429, the
    configuration's pause is at most the wait's bound (none for "inf": no
    Retry-After), and Redis is still asked (the limiter not taken for down)."""
    from tests.fake_openai import completion, error
    from tests.test_openai_provider import request

    settings.NRLLM_PROVIDER_RATE_LIMITS = {"openai:*": {"requests_per_minute": 600}}
    settings.NRLLM_RATE_LIMIT_MAX_WAIT_SECONDS = 2
    fake_openai.script(error(429, headers={"retry-after": retry_after}))
    fake_openai.default = Reply(body=completion("late"))
    agent_run = run_in_process(request())
    assert agent_run.failure_class == "rate_limit"
    pauses = [queue.connection.pttl(key) for key in queue.connection.keys("*:paused")]
    assert all(0 < pause <= 2000 for pause in pauses), pauses
    # An infinite Retry-After is none (the requeue's backoff applies).
    assert len(pauses) == (0 if retry_after == "inf" else 1)
    assert rate_limit._available() is not None, "a 429 took Redis for down"


def test_a_cancel_requested_during_a_rate_limit_wait_sends_no_call_after_it(
    queue, fake_openai, settings
):
    """20 requests a minute (a bucket of one, a turn every 3 s): the first
    run goes at once, the second waits its turn; cancelled meanwhile, it
    ends ``cancelled`` and the provider never sees its call (G9: a cancel
    noticed before the next call spends nothing more)."""
    from runs import transitions
    from tests.fake_openai import completion
    from tests.test_openai_provider import request

    settings.NRLLM_PROVIDER_RATE_LIMITS = {"openai:*": {"requests_per_minute": 20}}
    fake_openai.default = Reply(body=completion("done"))
    assert run_in_process(request()).status == RunStatus.COMPLETED
    thread, ended = waiting_in_a_thread(lambda: run_in_process(request()))
    waiting = next(pk for pk in AgentRun.objects.values_list("pk", flat=True) if waiting_for(pk))
    transitions.cancel(waiting)
    thread.join(10)

    assert ended["run"].status == RunStatus.CANCELLED
    assert len(fake_openai.arrivals) == 1, "the cancelled run's call went out after its wait"


def test_a_run_waiting_for_its_rate_limit_holds_no_budget_reservation(
    queue, fake_openai, settings, operator
):
    """G21 beside a wait: a submitter's budget fits one call's reservation,
    not two. Their run on a paused configuration waits 3 s for it; their
    other run, on a model with no limit, is not kept from its call (nor
    stopped ``budget_exhausted`` after NRLLM_RESERVATION_WAIT_SECONDS) by a
    reservation for a call that is not being made. Both complete."""
    from spend.call_size import largest_tokens
    from spend.models import SubmitterBudget
    from tests.fake_openai import completion
    from tests.test_openai_provider import request

    settings.NRLLM_PROVIDER_RATE_LIMITS = {"openai:limited": {"requests_per_minute": 600}}
    settings.NRLLM_RESERVATION_WAIT_SECONDS = 1
    settings.NRLLM_RESERVE_MAX_TOKENS = 40
    fake_openai.default = Reply(body=completion("done"))
    largest = largest_tokens([{"role": "user", "content": "do it"}], [], 40)
    SubmitterBudget.objects.create(user=operator, period="day", max_tokens=largest * 3 // 2)
    pause = f"nrllm:rate-limit:{{openai {settings.NRLLM_OPENAI_BASE_URL} limited}}:paused"
    queue.connection.set(pause, "1", px=3000)
    thread, ended = waiting_in_a_thread(
        lambda: run_in_process(request(tools=(), model="limited"), submitted_by=operator)
    )
    other = run_in_process(request(tools=()), submitted_by=operator)
    thread.join(10)

    assert (other.status, other.termination_reason) == (RunStatus.COMPLETED, "completed")
    assert ended["run"].status == RunStatus.COMPLETED


def test_redis_down_a_429_with_retry_after_is_not_sent_again_at_once(fake_openai, settings):
    """Redis unreachable (fail open), a provider answering 429 with
    ``Retry-After: 1``: the pause cannot be set, so the call is not sent
    again in a loop until the wait's bound — it fails ``rate_limit`` as it
    would with no limit (the requeue's backoff honours Retry-After)."""
    from tests.fake_openai import error
    from tests.test_openai_provider import request

    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    settings.NRLLM_PROVIDER_RATE_LIMITS = {"openai:*": {"requests_per_minute": 600}}
    settings.NRLLM_RATE_LIMIT_MAX_WAIT_SECONDS = 3
    fake_openai.default = error(429, headers={"retry-after": "1"})
    agent_run = run_in_process(request(tools=()))
    assert agent_run.failure_class == "rate_limit"
    assert len(fake_openai.arrivals) <= 2, f"{len(fake_openai.arrivals)} calls in a loop"
