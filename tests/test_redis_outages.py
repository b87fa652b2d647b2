"""The processes around the runtime outlive a Redis outage (G4, G7, G15):
``rqcron runs.cron`` and every worker class wait for Redis and go on, saying
so once, never with a traceback per try; a job that ends while Redis is away
ends its run all the same. Real ``rqcron`` and ``rqworker`` processes, and a
redis-server of the test's own (``own_redis``), stopped and started again on
the same port, empty."""

import re
import signal
import sys
from datetime import datetime

import psutil
import pytest

from runs import transitions
from runs.models import AgentRun
from runs.models.last_passes import REAPER, LastPass
from runs.runtime import enqueue
from runs.transitions import db_time
from spend.budgets import database_now
from tests.drifting_model import MODELS, request_for
from tests.fake_openai import error
from tests.helpers import ROOT, answer, fresh, scripted, stored, wait_until
from tests.processes import WorkerProcess

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.slow]

UNREACHABLE = "Redis unreachable"
ANSWERS_AGAIN = "Redis answers again"
#: A bound for what a loaded host may take to start a process and run a
#: run: each wait below ends as soon as what it waits for happens.
LOADED_HOST_SECONDS = 120

WORKER_CLASSES = {
    "concurrent": "runs.worker.ConcurrentWorker",
    "forking": "runs.worker.Worker",
    "simple": "runs.worker.SimpleWorker",
}


def start_rqcron(workers, own_redis) -> WorkerProcess:
    """``manage.py rqcron runs.cron``, a reaper pass due every second; the
    ``workers`` fixture stops it with the workers."""
    process = WorkerProcess(
        [sys.executable, "manage.py", "rqcron", "runs.cron"],
        cwd=ROOT,
        env={**workers.env, "REDIS_URL": own_redis.url, "NRLLM_REAPER_INTERVAL_SECONDS": "1"},
        start_new_session=True,
    )
    workers.processes.append(process)
    return process


def said(process: WorkerProcess, words: str) -> bool:
    """Whether ``process`` has logged ``words``, or a traceback, or has
    exited: then it never will."""
    output = process.written()
    return words in output or "Traceback" in output or process.poll() is not None


def said_once_per_outage(process: WorkerProcess) -> None:
    """The outage in one line and its end in another: no traceback, no line per try."""
    output = process.written()
    assert "Traceback" not in output, output[-4000:]
    assert output.count(UNREACHABLE) == 1 and output.count(ANSWERS_AGAIN) == 1, output[-4000:]


def liveness_table(operator_client) -> str:
    page = operator_client.get("/admin/").content.decode()
    return re.search(r'id="liveness">.*?</table>', page, re.S)[0]


def stale_run():
    """A running run whose worker died: its lease expired a minute ago."""
    agent_run = transitions.create_queued_run(stored(scripted(answer())), "p")
    transitions.claim(agent_run.pk, "dead-worker", 60)
    AgentRun.objects.filter(pk=agent_run.pk).update(lease_expires_at=db_time(-60))
    return agent_run


def test_rqcron_outlives_a_redis_restart_and_the_reaper_passes_again(
    workers, settings, own_redis, operator_client
):
    """RQ's cron scheduler exited on Redis's first error: the reaper stopped
    without a word. Now it waits for Redis, and the reaper's passes resume:
    a run whose worker died during the outage is reaped once Redis is back."""
    cron = start_rqcron(workers, own_redis)
    worker = workers.start(REDIS_URL=own_redis.url)
    wait_until(
        lambda: LastPass.objects.filter(name=REAPER).exists(),
        timeout=LOADED_HOST_SECONDS,
        what="the reaper's first pass",
    )
    workers.kill(worker)  # this test is the cron's: no worker lives through the outage
    own_redis.stop()
    wait_until(lambda: said(cron, UNREACHABLE), timeout=LOADED_HOST_SECONDS, what="the outage")
    assert cron.poll() is None, cron.written()[-4000:]
    # While Redis is away the overview says so, and no reaper pass is made.
    assert "Redis unreachable (ConnectionError)" in liveness_table(operator_client)
    agent_run = stale_run()

    own_redis.start()  # empty: the cron's jobs and records are gone
    restarted_at = database_now()
    workers.start(REDIS_URL=own_redis.url)
    wait_until(
        lambda: fresh(agent_run).status == "completed",
        timeout=LOADED_HOST_SECONDS,
        what="the stale run reaped and run again",
    )
    reaped = fresh(agent_run)
    assert (reaped.requeue_count, reaped.termination_reason) == (1, "completed")
    assert [
        step["decision"]
        for step in reaped.steps.filter(kind="reaper").values_list("result", flat=True)
    ] == ["requeued"]
    # A pass made after the restart: the overview shows the reaper alive.
    wait_until(
        lambda: LastPass.objects.get(name=REAPER).at >= restarted_at,
        timeout=LOADED_HOST_SECONDS,
        what="a reaper pass recorded after the restart",
    )
    reaper = liveness_table(operator_client).split("Reaper (rqcron runs.cron)")[1]
    assert '<span class="badge alive">alive</span>' in reaper.split("</tr>")[0]
    assert cron.poll() is None
    wait_until(lambda: said(cron, ANSWERS_AGAIN), timeout=LOADED_HOST_SECONDS, what="its note")
    said_once_per_outage(cron)


@pytest.mark.parametrize("worker_class", WORKER_CLASSES.values(), ids=WORKER_CLASSES.keys())
def test_a_worker_started_while_redis_is_down_waits_and_then_runs(
    workers, settings, own_redis, operator_client, worker_class
):
    """RQ's worker exited at once without Redis. Now it waits, and once
    Redis is up it registers (the overview lists it) and executes runs."""
    own_redis.stop()
    worker = workers.start(REDIS_URL=own_redis.url, NRLLM_WORKER_CLASS=worker_class)
    wait_until(lambda: said(worker, UNREACHABLE), timeout=LOADED_HOST_SECONDS, what="the wait")
    assert worker.poll() is None, worker.written()[-4000:]

    own_redis.start()
    agent_run = enqueue(scripted(answer("after the outage")))
    wait_until(
        lambda: fresh(agent_run).status == "completed",
        timeout=LOADED_HOST_SECONDS,
        what="the run, once Redis is up",
    )
    assert '<span class="badge alive">1 alive</span>' in liveness_table(operator_client)
    assert worker.poll() is None
    said_once_per_outage(worker)


#: A Redis that is there but does not serve: stalled (a paused host, a
#: network dropping packets: the worker's socket times out, 15 s for the
#: concurrent worker) or demoted to a replica by a failover (a blocked
#: dequeue is ended, every write refused). The forking worker's socket waits
#: 415 s: it meets the demotion only.
NOT_SERVING = [
    pytest.param(WORKER_CLASSES["concurrent"], "stalled", id="concurrent-stalled"),
    pytest.param(WORKER_CLASSES["concurrent"], "demoted", id="concurrent-demoted"),
    pytest.param(WORKER_CLASSES["forking"], "demoted", id="forking-demoted"),
]


@pytest.mark.parametrize(("worker_class", "fault"), NOT_SERVING)
def test_a_worker_outlives_a_redis_that_stops_serving_without_closing(
    workers, settings, own_redis, operator_client, worker_class, fault
):
    """RQ's dequeue waits out only a Redis that refuses connections: one
    whose answer times out, or that refuses the dequeue's write (READONLY,
    UNBLOCKED: a failover's old master), ended RQ's loop, and the worker
    exited ("Redis connection timeout, quitting...", or a traceback). Each
    is an outage as well: the worker waits, says so once, and takes the
    next run once Redis serves again."""
    worker = workers.start(REDIS_URL=own_redis.url, NRLLM_WORKER_CLASS=worker_class)
    before = enqueue(scripted(answer("before")))
    wait_until(
        lambda: fresh(before).status == "completed",
        timeout=LOADED_HOST_SECONDS,
        what="a run before the fault",
    )
    with getattr(own_redis, fault)():
        wait_until(lambda: said(worker, UNREACHABLE), timeout=LOADED_HOST_SECONDS, what="it")
        assert worker.poll() is None, worker.written()[-4000:]
    after = enqueue(scripted(answer("after")))
    wait_until(
        lambda: fresh(after).status == "completed" or worker.poll() is not None,
        timeout=LOADED_HOST_SECONDS,
        what="the next run, once Redis serves again",
    )
    output = worker.written()
    assert worker.poll() is None and "quitting" not in output, output[-4000:]
    assert fresh(after).status == "completed"
    wait_until(lambda: said(worker, ANSWERS_AGAIN), timeout=LOADED_HOST_SECONDS, what="its note")
    said_once_per_outage(worker)
    assert '<span class="badge alive">1 alive</span>' in liveness_table(operator_client)


#: The concurrent worker's Redis socket timeout: RQ's, its dequeue's 5 s and 10.
STALLED_ANSWER_SECONDS = 15


def logged_at(output: str, words: str) -> datetime:
    """When the worker logged the line holding ``words`` (its own clock)."""
    line = next(line for line in output.splitlines() if words in line)
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


def test_sigterm_while_redis_stalls_hands_the_runs_back_after_the_drains_grace(
    workers, http_server, own_redis
):
    """G15: after a SIGTERM the runs in flight get ``NRLLM_WORKER_DRAIN_SECONDS``
    and are then handed back. The drain sent the worker's heartbeat to Redis
    every second: to a Redis that stalls, each held the drain a socket
    timeout past its grace, and the runs were handed back 15 s late (after
    the supervisor's stop timeout, often). While Redis is away the drain
    sends none. (The drain's length is read from the worker's own log: the
    grace is 1 s, and a heartbeat tried would make it 16 s.)"""
    hold = {"name": "http_get", "arguments": {"url": http_server.url("/hold")}}
    agent_run = enqueue(
        request_for("scripted", [{"calls": [hold]}, {"answer": "read"}], ["http_get"])
    )
    worker = workers.start(
        REDIS_URL=own_redis.url,
        NRLLM_WORKER_DRAIN_SECONDS=1,
        NRLLM_HTTP_TIMEOUT_SECONDS=LOADED_HOST_SECONDS,
    )
    wait_until(http_server.held.is_set, timeout=LOADED_HOST_SECONDS, what="the run's read")
    with own_redis.stalled():
        wait_until(lambda: said(worker, UNREACHABLE), timeout=LOADED_HOST_SECONDS, what="it")
        workers.signal(worker, signal.SIGTERM)
        wait_until(
            lambda: said(worker, "handed back to the reaper"),
            timeout=LOADED_HOST_SECONDS,
            what="the hand-back",
        )
    http_server.release.set()
    output = worker.ended(LOADED_HOST_SECONDS).decode()
    drained = logged_at(output, "handed back to the reaper") - logged_at(output, "draining 1")
    assert drained.total_seconds() < STALLED_ANSWER_SECONDS - 1, output[-4000:]
    assert fresh(agent_run).status == "running" and "Traceback" not in output


#: Each worker class, and the concurrent one (the default) with both models.
ENDING_WHILE_AWAY = [
    pytest.param(WORKER_CLASSES["concurrent"], "scripted", id="concurrent-scripted"),
    pytest.param(WORKER_CLASSES["concurrent"], "drifting", id="concurrent-drifting"),
    pytest.param(WORKER_CLASSES["forking"], "scripted", id="forking-scripted"),
    pytest.param(WORKER_CLASSES["simple"], "drifting", id="simple-drifting"),
]


@pytest.mark.parametrize(("worker_class", "model"), ENDING_WHILE_AWAY, indirect=["model"])
def test_a_run_ending_while_redis_is_down_ends_and_its_job_logs_no_traceback(
    workers, http_server, settings, own_redis, operator_client, worker_class, model
):
    """A job whose run ends while Redis is away cannot keep RQ's books for
    it (its registries, the worker's counts); the run's row is its state
    (G4), so the run ends as it would have, with no traceback for books
    nobody needs, and the worker goes on once Redis is back."""
    hold = {"name": "http_get", "arguments": {"url": http_server.url("/hold")}}
    plan = [{"calls": [hold]}, {"answer": "read it (take {take})"}]
    agent_run = enqueue(request_for(model, plan, ["http_get"]))
    worker = workers.start(
        REDIS_URL=own_redis.url,
        NRLLM_WORKER_CLASS=worker_class,
        NRLLM_HTTP_TIMEOUT_SECONDS=LOADED_HOST_SECONDS,
    )
    wait_until(http_server.held.is_set, timeout=LOADED_HOST_SECONDS, what="the run's read")
    own_redis.stop()
    http_server.release.set()  # the run ends now, with Redis away
    wait_until(
        lambda: fresh(agent_run).status != "running",
        timeout=LOADED_HOST_SECONDS,
        what="the run's end",
    )
    ended = fresh(agent_run)
    assert (ended.status, ended.termination_reason, ended.requeue_count) == (
        "completed",
        "completed",
        0,
    )
    assert ended.output.startswith("read it")
    wait_until(lambda: said(worker, UNREACHABLE), timeout=LOADED_HOST_SECONDS, what="the outage")
    assert worker.poll() is None, worker.written()[-4000:]
    assert "Traceback" not in worker.written(), worker.written()[-4000:]

    own_redis.start()
    after = enqueue(request_for(model, [{"answer": "after (take {take})"}], []))
    wait_until(
        lambda: fresh(after).status == "completed",
        timeout=LOADED_HOST_SECONDS,
        what="the next run, once Redis is back",
    )
    assert '<span class="badge alive">1 alive</span>' in liveness_table(operator_client)
    output = worker.written()
    assert "Traceback" not in output, output[-4000:]
    # Once per process that met the outage: the forking worker's horse is one.
    assert 1 <= output.count(UNREACHABLE) <= 2, output[-4000:]
    assert worker.poll() is None


def scheduler_processes(worker) -> int:
    """RQ's scheduler runs in a child process of the worker (the concurrent
    worker's runs are threads); one that ended is a zombie until the worker
    looks at it."""
    children = psutil.Process(worker.pid).children()
    return sum(child.status() != psutil.STATUS_ZOMBIE for child in children)


@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_the_scheduler_a_redis_outage_ended_is_started_again_and_moves_a_retry(
    workers, settings, own_redis, model
):
    """RQ's scheduler (``--with-scheduler``) moves each retry to the queue
    when its backoff is over. A Redis outage ends its process, and RQ's
    worker starts it again only at its maintenance, every ten minutes:
    now as soon as Redis answers, and a retry due after the outage runs."""
    worker = workers.start(
        with_scheduler=True, REDIS_URL=own_redis.url, NRLLM_RETRY_BACKOFF_SECONDS=1
    )
    wait_until(lambda: scheduler_processes(worker) == 1, timeout=LOADED_HOST_SECONDS, what="it")
    own_redis.stop()
    wait_until(
        lambda: scheduler_processes(worker) == 0,
        timeout=LOADED_HOST_SECONDS,
        what="the scheduler's end",
    )
    own_redis.start()
    wait_until(
        lambda: scheduler_processes(worker) == 1,
        timeout=LOADED_HOST_SECONDS,
        what="the scheduler started again",
    )
    plan = [{"answer": "done (take {take})"}]
    failure = {"error": "rate_limit", "attempts": 1}
    if model is not None:
        model.fail_turn(0, error(429))
    agent_run = enqueue(
        request_for("drifting" if model else "scripted", plan, [], scripted_before={0: failure})
    )
    wait_until(
        lambda: fresh(agent_run).status == "completed",
        timeout=LOADED_HOST_SECONDS,
        what="the run, its retry moved to the queue by the scheduler",
    )
    assert fresh(agent_run).requeue_count == 1
    assert worker.poll() is None
