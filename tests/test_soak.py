"""Soak: hundreds of runs through real workers that are SIGKILLed every few
seconds, with the reaper running. Every run must end terminal, and no
non-idempotent call may execute twice. A third of the runs talk to a model
that words every answer differently (``tests.drifting_model``): a retry that
asked it again would word a write anew, and send it again."""

import random
import time
from collections import Counter

import pytest
from rq import Worker

from runs.models import AgentRun
from runs.models.vocabulary import RunStatus
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from tests.drifting_model import openai_request, scripted_request
from tests.helpers import writes_per_call
from tools.models import OutboxNotification

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.slow]

RUNS = 200
WORKERS = 3
#: At most this often (the loop looks every 0.3 s: about every 0.6 s).
KILL_EVERY_SECONDS = 0.4
#: Then the killing stops and the survivors finish. Without a bound, a
#: loaded host made more kills: each restart (a second of CPU) slowed the
#: runs, which let the clock bring the next kill before they ended (200
#: kills in 160 s inside ``make test``, 125 in 94 s alone). A kill waits
#: for a worker that serves (``serving_workers``).
KILLS = 80
DEADLINE_SECONDS = 150
WORKER_ENV = {
    "NRLLM_LEASE_SECONDS": 2,
    "NRLLM_HTTP_TIMEOUT_SECONDS": 2,
    "NRLLM_OPERATION_MARGIN_SECONDS": 1,
    "NRLLM_MAX_REQUEUES": 5,
}
# The worker classes docs/operations.md describes: RQ's forking worker, jobs
# run in the worker itself on a kept database connection, and many runs in
# flight in one process, a thread each, on Django's pool (G15).
WORKER_KINDS = [
    {"NRLLM_WORKER_CLASS": "runs.worker.Worker"},
    {"NRLLM_WORKER_CLASS": "runs.worker.SimpleWorker", "DATABASE_CONN_MAX_AGE": 60},
    {
        "NRLLM_WORKER_CLASS": "runs.worker.ConcurrentWorker",
        "NRLLM_WORKER_CONCURRENCY": 20,
        "DATABASE_POOL_MAX_SIZE": 5,
    },
]


TOOLS = ["search_notes", "read_note", "upsert_note", "send_notification", "post_webhook"]


def request_for(index: int, http_server) -> dict:
    read = {"name": "search_notes", "arguments": {"query": "soak"}}
    writes = [
        {"name": "read_note", "arguments": {"slug": "missing"}},
        {"name": "upsert_note", "arguments": {"slug": f"soak-{index}", "body": "v {take}"}},
        {
            "name": "send_notification",
            "arguments": {"recipient": f"soak-{index}", "message": "m {take}"},
        },
        {
            "name": "post_webhook",
            "arguments": {"url": http_server.url(f"/soak-{index}"), "payload": {"take": "{take}"}},
        },
    ]
    plan = [{"calls": [read]}, {"calls": [writes[index % 4]]}, {"answer": f"run {index}"}]
    if index % 3 == 0:
        # The model thinks a while before its answer, after the write is
        # recorded: kills land there too, and the retry must not ask again.
        plan[-1]["delay_seconds"] = 0.2
        return openai_request(f"soak {index}", plan, TOOLS)
    return scripted_request(f"soak {index}", plan, TOOLS)


def serving_workers(pool: list, queue) -> list:
    """The workers of ``pool`` that have started and registered with RQ: a
    kill lands on runs in flight, not on a start. (Killing at the clock
    alone, on a loaded host most kills fell on workers still starting: 80
    kills left 117 of 150 runs for after the killing.)"""
    registered = {worker.pid for worker in Worker.all(connection=queue.connection)}
    return [process for process in pool if process.pid in registered]


def unfinished() -> int:
    return AgentRun.objects.filter(status__in=[RunStatus.QUEUED, RunStatus.RUNNING]).count()


def test_runs_survive_workers_killed_every_few_seconds(
    workers, queue, http_server, drifting_model, settings, record_property
):
    settings.NRLLM_REDISPATCH_AFTER_SECONDS = 2
    for index in range(RUNS):
        enqueue(request_for(index, http_server))
    started_workers = iter(range(10_000))

    def start_worker():
        return workers.start(
            **WORKER_ENV, **WORKER_KINDS[next(started_workers) % len(WORKER_KINDS)]
        )

    pool = [start_worker() for _ in range(WORKERS)]
    rng = random.Random(1234)
    kills = 0
    started = time.monotonic()
    next_kill = started + KILL_EVERY_SECONDS
    while unfinished() and kills < KILLS and time.monotonic() - started < DEADLINE_SECONDS:
        time.sleep(0.3)
        reap_stale_runs()
        if time.monotonic() >= next_kill and (serving := serving_workers(pool, queue)):
            victim = rng.choice(serving)
            pool.remove(victim)
            workers.kill(victim)
            kills += 1
            pool.append(start_worker())
            next_kill = time.monotonic() + KILL_EVERY_SECONDS
    ended_under_kills = RUNS - unfinished()
    # The killing has stopped; the survivors and the reaper finish the rest.
    settle_deadline = time.monotonic() + 60
    while unfinished() and time.monotonic() < settle_deadline:
        time.sleep(0.5)
        reap_stale_runs()
    elapsed = time.monotonic() - started

    outcomes = Counter(AgentRun.objects.values_list("status", "termination_reason"))
    requeues = sum(AgentRun.objects.values_list("requeue_count", flat=True))
    sent = writes_per_call(http_server)
    notifications_per_key = sent["notifications per key"]
    notifications_per_run = sent["notifications per run"]
    posts_per_path = sent["posts per call"]
    # Shown in the test summary (conftest), also from an xdist worker.
    record_property(
        "summary",
        f"soak: {RUNS} runs, {WORKERS} workers, {kills} SIGKILLs, {elapsed:.0f}s, "
        f"{ended_under_kills} runs ended while the kills went on; "
        f"outcomes {dict(outcomes)}; notifications per run {dict(notifications_per_run)}, "
        f"per key {dict(notifications_per_key)}; model requests "
        f"{sum(drifting_model.requests_by_turn.values())}; "
        f"webhook POSTs per call {dict(posts_per_path)}; "
        f"requeues {requeues}",
    )
    assert unfinished() == 0, f"runs left unfinished: {dict(outcomes)}"
    assert kills >= 3
    assert requeues, "no kill hit a run"
    assert set(notifications_per_run) <= {1}, "a run sent its notification twice"
    assert set(notifications_per_key) <= {1}, "a notification was sent twice"
    assert set(posts_per_path) <= {1}, "a webhook was POSTed twice"
    assert OutboxNotification.objects.values("run_id").distinct().count() == sum(
        notifications_per_key.values()
    )
