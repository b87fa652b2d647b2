"""A worker with N slots holds N model calls open at once, for N past the
``openai`` SDK's own pool (1,000), in pools of about a hundred, and N
answers that come together do not wake its threads every 5 ms each; its
open-files limit is raised to what the slots hold, or it refuses to start
naming both settings (G15)."""

import resource
import sys

import pytest
from django.db import transaction

from ground.connection_pools import CONNECTIONS_PER_POOL, LeastBusy, pool_sizes
from runs.models import AgentRun
from runs.runtime import enqueue
from tests.counting_model import CountingModel
from tests.helpers import ROOT, wait_until
from tests.processes import WorkerProcess, voluntary_context_switches

pytestmark = pytest.mark.django_db(transaction=True)

#: Past the SDK's default pool of 1,000 connections a client.
SLOTS = 1_100
#: The most times a run's thread and the others may sleep, a run, from the
#: model's answers to the runs' ends: 53–56 measured, and 250–594 with
#: CPython's switch interval of 5 ms (a thread waiting for the GIL wakes
#: every interval to ask for it again), under which two workers at 4,000
#: runs in flight collapsed (``runs.workers.run_threads``). A loaded host
#: hides the herd (a review saw 86–149 with 5 ms beside CPU hogs): the
#: worker's start line, read in ``test_worker_defaults.py``, always shows
#: the interval.
SLEEPS_A_RUN_AFTER_THE_ANSWERS = 150


@pytest.fixture
def counting_model(settings):
    model = CountingModel(release_at=SLOTS)
    settings.NRLLM_OPENAI_BASE_URL = model.base_url
    settings.NRLLM_OPENAI_API_KEY = "sk-test-not-a-real-key"
    yield model
    model.stop()


def _soft_open_files_limit(soft: int):
    """For a child: its soft open-files limit set to ``soft`` (the hard one kept)."""

    def limit():
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        )

    return limit


def _worker(workers, *, slots: int, preexec_fn, **env) -> WorkerProcess:
    from django.conf import settings

    process = WorkerProcess(
        [sys.executable, "manage.py", "rqworker", settings.NRLLM_QUEUE_NAME],
        cwd=ROOT,
        env={
            **workers.env,
            "NRLLM_OPENAI_BASE_URL": settings.NRLLM_OPENAI_BASE_URL,
            "NRLLM_OPENAI_API_KEY": settings.NRLLM_OPENAI_API_KEY,
            "NRLLM_WORKER_CONCURRENCY": str(slots),
            **env,
        },
        start_new_session=True,
        preexec_fn=preexec_fn,
    )
    workers.processes.append(process)
    return process


@pytest.mark.worker
def test_a_worker_holds_a_model_call_open_in_each_of_more_slots_than_the_sdks_pool(
    counting_model, workers, queue
):
    """1,100 runs, each a model call the server answers only once 1,100 wait
    at once; the worker starts under the usual soft limit of 1,024 open
    files, which it raises for its slots. The answers then come together:
    1,100 threads want the GIL at once, and finish without each waking
    every few milliseconds to ask for it."""
    request = {"prompt": "hold", "provider": {"kind": "openai", "model": "counting"}}
    with transaction.atomic():
        for _ in range(SLOTS):
            enqueue(request)
    worker = _worker(
        workers,
        slots=SLOTS,
        preexec_fn=_soft_open_files_limit(1024),
        # Claims and settles borrow a connection for their statements only.
        DATABASE_POOL_MAX_SIZE="40",
    )
    # Fails once no call has come in for a minute: the worker has stopped
    # opening connections, short of its slots.
    wait_until(
        counting_model.released.is_set,
        timeout=60,
        interval=0.5,
        what=f"{SLOTS} model calls open at once",
        progress=lambda: (counting_model.most_waiting, worker.poll()),
    )
    assert counting_model.most_waiting == SLOTS
    assert counting_model.most_open >= SLOTS
    sleeps_at_the_answers = voluntary_context_switches(worker)
    wait_until(
        lambda: not AgentRun.objects.exclude(status="completed").exists(),
        timeout=60,
        interval=0.5,
        what="every run completed",
        progress=lambda: AgentRun.objects.filter(status="completed").count(),
    )
    assert counting_model.answered == SLOTS
    sleeps_a_run = (voluntary_context_switches(worker) - sleeps_at_the_answers) / SLOTS
    assert sleeps_a_run < SLEEPS_A_RUN_AFTER_THE_ANSWERS


@pytest.mark.worker
def test_a_worker_whose_slots_need_more_files_than_its_hard_limit_is_refused_at_start(
    counting_model, workers, queue
):
    agent_run = enqueue({"prompt": "p", "provider": {"kind": "openai", "model": "counting"}})
    hard = 512

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    worker = _worker(workers, slots=1_000, preexec_fn=low_limit)
    output = worker.ended(60).decode()
    assert worker.returncode != 0
    assert "rqworker not started: NRLLM_WORKER_CONCURRENCY=1000 needs up to" in output
    assert f"(RLIMIT_NOFILE: {hard}, at most {hard})" in output
    assert "Traceback" not in output
    agent_run.refresh_from_db()
    assert agent_run.status == "queued" and agent_run.lease_token == 0


@pytest.mark.parametrize("connections", [1, 99, 100, 101, 150, 1_000, 1_100, 2_000, 4_001])
def test_the_pools_hold_every_connection_and_none_is_past_a_hundred(connections):
    sizes = pool_sizes(connections)
    assert sum(sizes) >= connections
    assert max(sizes) <= CONNECTIONS_PER_POOL
    assert sum(sizes) - connections < len(sizes)  # as even as they divide


def test_the_least_busy_pool_has_a_connection_free_while_any_slot_is():
    """Calls taken and given back in an adversarial order: while fewer
    calls than connections are in flight, the pool chosen has room."""
    connections = 250
    sizes = pool_sizes(connections)
    least_busy = LeastBusy(len(sizes))
    taken = []
    for round_ in range(5):
        while len(taken) < connections:
            index = least_busy.take()
            assert least_busy.in_flight()[index] <= sizes[index]
            taken.append(index)
        # Give back the calls of the fullest pools first, then refill.
        taken.sort(key=lambda index: (index * (round_ + 1)) % len(sizes))
        for index in taken[: 60 + 20 * round_]:
            least_busy.give_back(index)
        del taken[: 60 + 20 * round_]


def test_an_mcp_sessions_http_client_holds_a_call_open_for_each_slot(settings):
    """The client of a session with an MCP server over HTTP (every run's
    calls to that server go over it) holds a request open for each of 150
    slots at once, past httpx's default pool of 100."""
    import asyncio

    from tools.mcp.declaration import StreamableHttp
    from tools.mcp.server_session import http_client_of

    slots = 150
    settings.NRLLM_WORKER_CONCURRENCY = slots
    server = CountingModel(release_at=slots)

    async def calls() -> list[int]:
        async with http_client_of(StreamableHttp(url=server.base_url)) as client:
            # Bounded only for a broken pool: the server answers all at once.
            async with asyncio.timeout(60):
                answers = await asyncio.gather(
                    *(client.post(f"{server.base_url}/mcp", json={"id": n}) for n in range(slots))
                )
        return [answer.status_code for answer in answers]

    try:
        assert asyncio.run(calls()) == [200] * slots
    finally:
        server.stop()
    assert server.most_waiting == slots
