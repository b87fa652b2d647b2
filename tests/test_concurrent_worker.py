"""G15: many runs in flight in one worker process (``runs.worker.ConcurrentWorker``),
each as safe as alone.

Real ``rqworker`` processes with the concurrent worker class, Django's
connection pool, the drifting model behind the fake chat-completions server,
and the reaper run by the test. Faults are a SIGKILL, a SIGTERM, a tool that
hangs past its limit, and a pool too small for the runs that want it.
"""

import random
import signal
import threading
import time
from collections import Counter

import pytest

from runs import transitions
from runs.models import AgentRun, DeadLetter
from runs.models.vocabulary import RunStatus, StepKind, TerminationReason
from runs.reaper import reap_stale_runs
from runs.runtime import enqueue
from tests.drifting_model import openai_request, scripted_request
from tests.helpers import statements_running, writes_per_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.slow]

CONCURRENT = {
    "NRLLM_WORKER_CLASS": "runs.worker.ConcurrentWorker",
    "NRLLM_WORKER_CONCURRENCY": 50,
    "DATABASE_POOL_MAX_SIZE": 8,
    "NRLLM_LEASE_SECONDS": 2,
    "NRLLM_OPERATION_MARGIN_SECONDS": 1,
    "NRLLM_HTTP_TIMEOUT_SECONDS": 2,
    "NRLLM_MAX_REQUEUES": 8,
    # Fifty runs' INFO lines would fill the pipe the fixture reads at the end.
    "LOG_LEVEL": "WARNING",
}
TOOLS = ["search_notes", "send_notification", "post_webhook"]


def unfinished() -> int:
    return AgentRun.objects.filter(status__in=[RunStatus.QUEUED, RunStatus.RUNNING]).count()


def running(worker=None) -> int:
    """Runs ``running`` now (held by ``worker``'s process, if given)."""
    held = AgentRun.objects.filter(status=RunStatus.RUNNING)
    if worker is not None:
        held = held.filter(lease_owner__contains=f":{worker.pid}:")
    return held.count()


def wait_until(condition, seconds: float, *, reap: bool = False) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        if reap:
            reap_stale_runs()
        time.sleep(0.1)
    return condition()


def writing_request(index: int, http_server) -> dict:
    """A read, a non-idempotent write (a notification or a webhook POST), an
    answer; the model thinks a while on each turn, so runs pile up in flight."""
    write = (
        {"name": "send_notification", "arguments": {"recipient": f"r-{index}", "message": "{take}"}}
        if index % 2
        else {
            "name": "post_webhook",
            "arguments": {"url": http_server.url(f"/c-{index}"), "payload": {"take": "{take}"}},
        }
    )
    plan = [
        {"calls": [{"name": "search_notes", "arguments": {"query": "c"}}], "delay_seconds": 0.6},
        {"calls": [write], "delay_seconds": 0.4},
        {"answer": f"run {index} (take {{take}})", "delay_seconds": 0.4},
    ]
    return openai_request(f"concurrent {index}", plan, TOOLS)


def test_fifty_runs_in_flight_in_one_process_survive_sigkills_writing_each_write_once(
    workers, http_server, drifting_model, settings, record_property
):
    """With the drifting model, one process holds about fifty runs at once;
    SIGKILLed at random moments, every run still ends ``completed`` or
    dead-lettered with its reason, and no non-idempotent write runs twice."""
    settings.NRLLM_REDISPATCH_AFTER_SECONDS = 2
    for index in range(60):
        enqueue(writing_request(index, http_server))
    worker = workers.start(**CONCURRENT)
    peak = 0
    rng = random.Random(28)
    kills = 0
    deadline = time.monotonic() + 120
    while unfinished() and time.monotonic() < deadline:
        peak = max(peak, running(worker))
        if kills < 3 and peak >= 30 and rng.random() < 0.15:
            workers.kill(worker)
            kills += 1
            worker = workers.start(**CONCURRENT)
        reap_stale_runs()
        time.sleep(0.1)

    outcomes = Counter(AgentRun.objects.values_list("status", "termination_reason"))
    sent = writes_per_call(http_server)
    record_property(
        "summary",
        f"concurrent: 60 runs, peak {peak} in flight in one process, {kills} SIGKILLs; "
        f"outcomes {dict(outcomes)}; writes {sent}",
    )
    assert unfinished() == 0, f"runs left unfinished: {dict(outcomes)}"
    assert peak >= 40, f"only {peak} runs were in flight at once"
    assert kills == 3
    assert all(set(counts) <= {1} for counts in sent.values()), f"a write went out twice: {sent}"
    for agent_run in AgentRun.objects.exclude(status=RunStatus.COMPLETED):
        assert agent_run.status == RunStatus.FAILED
        assert DeadLetter.objects.filter(run=agent_run).exists(), agent_run.termination_reason


def test_sigterm_drains_the_runs_that_finish_and_hands_back_the_rest(
    workers, drifting_model, settings
):
    """SIGTERM: nothing is dequeued after it; runs that end within the grace
    end; the others are handed back unsettled, and the reaper requeues them.
    Every model call is held until the worker has taken the SIGTERM, so all
    six are in flight then however slowly a loaded host started them."""
    drifting_model.hold_turn(0, every=True)
    quick = [enqueue(openai_request(f"quick {i}", [{"answer": "done"}], [])) for i in range(3)]
    slow = [
        enqueue(openai_request(f"slow {i}", [{"answer": "late", "delay_seconds": 30}], []))
        for i in range(3)
    ]
    # INFO: the worker's line saying it took the SIGTERM.
    drain = {"NRLLM_WORKER_DRAIN_SECONDS": 3, "NRLLM_LEASE_SECONDS": 30, "LOG_LEVEL": "INFO"}
    worker = workers.start(**{**CONCURRENT, **drain})
    assert wait_until(lambda: drifting_model.requests_by_turn[0] == 6, 60)
    workers.signal(worker, signal.SIGTERM)
    assert wait_until(lambda: "warm shut down requested" in worker.written(), 30)
    late = enqueue(openai_request("after", [{"answer": "x"}], []))
    drifting_model.release.set()
    output, _ = worker.communicate(timeout=15)
    assert worker.returncode == 0, output.decode()

    def status(run):
        return AgentRun.objects.get(pk=run.pk)

    assert {status(run).status for run in quick} == {RunStatus.COMPLETED}
    for run in slow:
        handed = status(run)
        assert handed.status == RunStatus.RUNNING  # not settled as if it ended
        assert not AgentRun.objects.filter(
            pk=run.pk, lease_expires_at__gt=transitions.db_time()
        ).exists()
    assert status(late).status == RunStatus.QUEUED  # never dequeued after the SIGTERM
    assert not DeadLetter.objects.exists()
    assert b"3 run(s) handed back" in output
    reap_stale_runs()
    assert {(status(run).status, status(run).requeue_count) for run in slow} == {
        (RunStatus.QUEUED, 1)
    }


def test_a_cancel_reaches_a_run_in_a_thread(workers, drifting_model, operator):
    from runs.operators.actions import cancel

    drifting_model.hold_turn(1)
    agent_run = enqueue(
        openai_request(
            "cancel me",
            [{"calls": [{"name": "search_notes", "arguments": {"query": "q"}}]}, {"answer": "no"}],
            TOOLS,
        )
    )
    workers.start(**CONCURRENT)
    assert drifting_model.held.wait(20)
    cancel(AgentRun.objects.get(pk=agent_run.pk), operator, "stop it")
    drifting_model.release.set()
    assert wait_until(lambda: AgentRun.objects.get(pk=agent_run.pk).status != "running", 20)
    assert AgentRun.objects.get(pk=agent_run.pk).termination_reason == TerminationReason.CANCELLED


def test_a_hung_tool_delays_no_other_run_a_read_is_a_tool_error_a_write_in_doubt(
    workers, settings, operator_client
):
    """A tool past its limit cannot be interrupted in a thread: its run stops
    counting on it — a read is a tool error, a write is in doubt — while the
    process's other runs go on; the write's late result is recorded, and
    shown beside the write in question to the operator who reconciles it."""
    settings.NRLLM_TOOLS = ["tests.tools_for_tests.SlowTool", "tests.tools_for_tests.SlowWrite"]
    hung_read = enqueue(
        scripted_request(
            "hung read",
            [{"calls": [{"name": "slow_tool", "arguments": {"seconds": 60}}]}, {"answer": "ok"}],
            ["slow_tool"],
        )
    )
    hung_write = enqueue(
        scripted_request(
            "hung write",
            [{"calls": [{"name": "slow_write", "arguments": {"seconds": 2}}]}, {"answer": "ok"}],
            ["slow_write"],
        )
    )
    others = [
        enqueue(scripted_request(f"other {i}", [{"answer": "fine", "delay_seconds": 0.5}], []))
        for i in range(8)
    ]
    started = time.monotonic()
    workers.start(
        **CONCURRENT,
        NRLLM_TOOLS="tests.tools_for_tests.SlowTool,tests.tools_for_tests.SlowWrite",
    )

    def ended(run):
        return AgentRun.objects.get(pk=run.pk).status not in ("queued", "running")

    assert wait_until(lambda: all(ended(run) for run in [*others, hung_read, hung_write]), 30)
    assert time.monotonic() - started < 20  # the 60 s read held nothing up
    assert {AgentRun.objects.get(pk=run.pk).status for run in others} == {"completed"}

    read = AgentRun.objects.get(pk=hung_read.pk)
    assert read.status == "completed"
    assert "exceeded its time limit" in read.steps.get(kind=StepKind.TOOL).error

    write = AgentRun.objects.get(pk=hung_write.pk)
    assert (write.status, write.termination_reason) == ("failed", "write_interrupted")
    assert DeadLetter.objects.filter(run=write).exists()
    # The write's thread finishes after its run stopped counting on it.
    assert wait_until(lambda: write.steps.filter(kind=StepKind.LATE_RESULT).exists(), 10)
    late = write.steps.get(kind=StepKind.LATE_RESULT)
    assert late.result == {"slept": True} and late.tool_name == "slow_write"
    page = operator_client.get(f"/admin/runs/agentrun/{write.pk}/change/").content.decode()
    assert (
        f"It returned after its time limit (step {late.sequence}): "
        '<code class="wraps">{ &quot;slept&quot;: true }</code>'
    ) in page


def test_an_exhausted_connection_pool_is_a_retryable_failure_not_a_hang(workers, settings):
    """One pooled connection, held by a tool for seconds: the runs that find
    the pool empty past its timeout fail to claim as on a database outage,
    their job says why, and each is dispatched again and ends."""
    settings.NRLLM_REDISPATCH_AFTER_SECONDS = 1
    settings.NRLLM_TOOLS = ["tests.tools_for_tests.SlowDatabaseRead"]
    holder = enqueue(
        scripted_request(
            "holder",
            [{"calls": [{"name": "slow_database_read", "arguments": {}}]}, {"answer": "ok"}],
            ["slow_database_read"],
        )
    )
    worker = workers.start(
        # The shipped lease: the heartbeat, which borrows from the same pool,
        # has nothing to renew within the holder's 3 s.
        **{**CONCURRENT, "DATABASE_POOL_MAX_SIZE": 1, "NRLLM_LEASE_SECONDS": 30},
        DATABASE_POOL_TIMEOUT_SECONDS=1,
        NRLLM_TOOLS="tests.tools_for_tests.SlowDatabaseRead",
    )
    # The others come once the holder's tool holds the pool's one connection
    # (its model turn recorded, the tool's 3 s statement under way).
    assert wait_until(lambda: statements_running("SELECT pg_sleep(3)"), 60)
    waiting = [enqueue(scripted_request(f"w {i}", [{"answer": "ok"}], [])) for i in range(3)]
    everyone = [holder, *waiting]
    assert wait_until(
        lambda: all(AgentRun.objects.get(pk=r.pk).status == "completed" for r in everyone),
        40,
        reap=True,
    )
    workers.signal(worker, signal.SIGTERM)
    output, _ = worker.communicate(timeout=15)
    assert b"couldn't get a connection" in output
    assert b"job could not execute the run" in output


def test_a_late_outcome_kept_from_an_abandoned_tool_thread_leaves_no_connection_behind():
    """Off the main thread a tool past its limit is abandoned; what it
    returns late is kept over the tool thread's own connection, which must go
    (back to the pool, with one): a connection left per late write would
    exhaust a worker's pool."""
    from django.db import connection

    from tools.deadline import ToolTimeout, call_within

    def connections_open() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            )
            return cursor.fetchone()[0]

    kept = threading.Event()

    def keep(result, error):
        assert AgentRun.objects.count() == 0  # the database, from the tool's thread
        kept.set()

    def hung():
        time.sleep(0.5)
        return "late"

    def run_in_a_thread():
        with pytest.raises(ToolTimeout):
            call_within(0.1, "hung", hung, on_late=keep)

    before = connections_open()
    caller = threading.Thread(target=run_in_a_thread)
    caller.start()
    caller.join()
    assert kept.wait(5)
    assert wait_until(lambda: connections_open() == before, 5)


def test_every_job_in_flight_gets_its_rq_heartbeat_in_batches(workers, queue):
    """The jobs' RQ heartbeats (which keep each in RQ's started registry)
    go many to a round trip, and every job in flight gets its own: five
    runs waiting on a model, beaten two to a pipeline every second."""
    from rq.job import Job

    from runs.queue.dispatch import job_id_for

    runs = [
        enqueue(scripted_request(f"beat {n}", [{"answer": "ok", "delay_seconds": 30}], []))
        for n in range(5)
    ]
    workers.start(
        **{
            **CONCURRENT,
            "NRLLM_WORKER_CONCURRENCY": 5,
            "NRLLM_WORKER_CLASS": "tests.quick_beats_worker.QuickBeats",
        }
    )
    assert wait_until(lambda: running() == 5, 30)
    jobs = [job_id_for(run.pk, AgentRun.objects.get(pk=run.pk).dispatch_count) for run in runs]

    def beats() -> list:
        return [Job.fetch(job_id, connection=queue.connection).last_heartbeat for job_id in jobs]

    first = beats()
    # Beaten every second; the runs wait on their model for 30 s.
    assert wait_until(lambda: all(now > then for now, then in zip(beats(), first, strict=True)), 15)
    assert running() == 5


def test_a_job_that_ends_as_its_batch_is_beaten_costs_the_others_no_heartbeat(queue):
    """A job's thread drops its RQ execution as the job ends, which may fall
    between the listing of a batch and its beats: that job is passed over,
    and the others of the batch are beaten (the whole batch went unbeaten,
    seen at 4,000 runs in flight)."""
    import copy

    from rq.executions import Execution
    from rq.job import Job

    from runs.queue.dispatch import run_queue
    from runs.workers.concurrent import ConcurrentWorker

    worker = ConcurrentWorker([run_queue()], connection=queue.connection)
    worker.register_birth()
    batch = []
    for _ in range(2):
        job, performer = run_queue().enqueue("os.getcwd"), copy.copy(worker)
        with queue.connection.pipeline() as pipeline:
            performer.execution = Execution.create(job, 60, pipeline, worker_name=worker.name)
            pipeline.execute()
        batch.append((performer, job))
    (ended, ended_job), (beaten, job) = batch
    ended.execution = None
    worker._beat_jobs(batch)

    def last_heartbeat(job_id):
        return Job.fetch(job_id, connection=queue.connection).last_heartbeat

    assert last_heartbeat(job.id) is not None
    assert last_heartbeat(ended_job.id) is None


def test_a_tools_thread_serves_call_after_call_in_a_fresh_context_and_again_once_abandoned():
    """Tool calls off the main thread run in threads kept between calls
    (a thread started per call cost its starter a wait for the GIL): never
    more threads than calls at once, a hung one abandoned serving again once
    its call ends, and no context variable of one call seen by the next."""
    import contextvars

    from tools.deadline import ToolTimeout, call_within

    left = contextvars.ContextVar("left", default=None)
    served, release, hung_ended = [], threading.Event(), threading.Event()

    def quick():
        served.append((threading.get_ident(), left.get()))
        left.set("by the last call")
        return "ok"

    def hung():
        release.wait(10)
        hung_ended.set()

    def calls():
        for _ in range(5):
            assert call_within(5, "quick", quick) == "ok"
        with pytest.raises(ToolTimeout):
            call_within(0.05, "hung", hung)
        assert call_within(5, "quick", quick) == "ok"  # the hung one's thread is busy
        release.set()
        assert hung_ended.wait(5)
        for _ in range(20):
            assert call_within(5, "quick", quick) == "ok"

    caller = threading.Thread(target=calls)
    caller.start()
    caller.join()
    assert len(served) == 26 and {value for _, value in served} == {None}
    assert len({ident for ident, _ in served[:5]}) == 1
    assert len({ident for ident, _ in served}) <= 2


def test_a_redis_outage_lets_the_runs_in_flight_finish_and_the_worker_waits_for_redis(
    workers, settings, own_redis
):
    """The runs in flight need Redis for nothing (the run rows are their
    state): Redis stopping under a busy worker neither ends them nor hands
    them back; they complete, as a forking worker's horse completes its run.
    Their slots free together while Redis is away, so the worker's next turn
    takes jobs for several slots at once, and fails: it waits for Redis,
    and takes the next run once Redis is back."""
    runs = [
        enqueue(scripted_request(f"outage {i}", [{"answer": "ok", "delay_seconds": 3}], []))
        for i in range(4)
    ]
    # Every slot taken: the worker waits for one, heartbeating meanwhile.
    worker = workers.start(
        **{**CONCURRENT, "NRLLM_WORKER_CONCURRENCY": 4}, REDIS_URL=settings.REDIS_URL
    )
    assert wait_until(lambda: running() == 4, 20)
    own_redis.stop()
    assert wait_until(lambda: unfinished() == 0, 30)
    assert {AgentRun.objects.get(pk=run.pk).status for run in runs} == {"completed"}
    time.sleep(2)  # the worker's turns meanwhile find Redis away
    own_redis.start()
    after = enqueue(scripted_request("after the outage", [{"answer": "ok"}], []))
    assert wait_until(lambda: AgentRun.objects.get(pk=after.pk).status == "completed", 30)
    assert worker.poll() is None


def test_more_runs_than_redis_pys_default_pool_keep_their_jobs_books_through_a_redis_stall(
    workers, drifting_model, settings, own_redis
):
    """redis-py 8 refuses a 101st connection of a pool rather than wait for
    one. A worker of 110 slots whose runs all end while Redis stalls has
    each run's thread hold a connection for RQ's books (and the main thread
    one for its heartbeat): its pool is sized to its slots, so every job is
    finished in RQ's books once Redis answers again, none failed."""
    from redis import Redis
    from rq.job import Job

    from runs.queue.dispatch import job_id_for

    # Every run waits on the model until Redis stalls.
    drifting_model.hold_turn(0, every=True)
    runs = [enqueue(openai_request(f"stall {i}", [{"answer": "ok"}], [])) for i in range(110)]
    connection = Redis(port=own_redis.port)
    clients_before = len(connection.client_list())  # the worker's come on top
    workers.start(
        **{**CONCURRENT, "NRLLM_WORKER_CONCURRENCY": 110, "NRLLM_LEASE_SECONDS": 10},
        REDIS_URL=settings.REDIS_URL,
    )
    assert wait_until(lambda: running() == 110, 30)
    assert wait_until(lambda: drifting_model.requests_by_turn[0] == 110, 30)
    # Writes wait from now until every run has ended and each run's thread
    # holds a connection of its own, waiting to keep its job's books.
    connection.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
    try:
        drifting_model.release.set()
        assert wait_until(lambda: unfinished() == 0, 30)
        assert wait_until(lambda: len(connection.client_list()) >= clients_before + 110, 30)
    finally:
        connection.execute_command("CLIENT", "UNPAUSE")

    def books() -> Counter:
        return Counter(
            Job.fetch(job_id_for(run.pk, 0), connection=connection).get_status() for run in runs
        )

    assert wait_until(lambda: books() == {"finished": 110}, 20), books()
