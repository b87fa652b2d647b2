"""The concurrent worker in steady state (#52): many runs in flight on 2
``runs.worker.ConcurrentWorker`` processes, the runs arriving at a steady pace.

A round per row (runs in flight, model latency L): the model server answers
each turn after L seconds, and the workers' slots (in flight / processes
each) take two-turn runs (a ``read_note`` call, then the answer) that
arrive at 1.1 times the ideal (in flight / 2L runs a second), in one
transaction every 0.1 s, until the window closes. A little more than the
slots can take: a slot freed always finds a run waiting, the ideal's
premise, while the backlog grows by only a tenth of the ideal a second.

The window opens 2L after the first arrival, as the first runs end, so
the slots filling is left out of every figure; it lasts whole run lengths
(2L), at least three and at least the size's least seconds: runs that
start together end together, so a window of whole generations counts each
once however they bunch, and its first generation still ends the runs
that started as the slots filled, which a window of two would weigh by
half (the rate of each generation is kept, to show whether it is steady).

- rate: runs ended inside the window / its seconds; of ideal = rate / ideal;
- worker CPU per run: the workers' user and system time over the window /
  runs ended in it;
- host CPU per run: the host's busy CPU over the window / runs ended in it:
  PostgreSQL's, Redis's, the model server's and the bench's own enqueuing
  are in it;
- PSS per run in flight: the workers' PSS / their runs ``running``, looked
  at every 2 s during the window; the median look (a look may fall as a
  generation of runs ends and the next is being claimed);
- the most model connections open at once (the model server's count, from
  its start to the window's close): below the runs in flight, the model
  clients' pools held runs back;
- enqueue → start, p50 and p99, of the runs started inside the window (the
  backlog the 1.1x pace builds is in it, growing through the window);
- what says the figures are the runtime's: the arrivals in the window, the
  runs waiting for a slot as it opened and closed, the host's busy share,
  the runs that stopped without ending or were requeued.

The arrivals are enqueued in a thread of their own: on a host the workers
saturate a batch can take seconds, and the window's clock must not wait
for it.

After the window the workers are stopped (a drain of a second: the runs
still in flight are handed back, which the figures never see), and the runs
that did not end are deleted with their jobs: the bench's later parts
(the reaper at scale) must not find them. A run that failed by the window's
close is an error: the round raises.
"""

import math
import os
import statistics
import subprocess
import threading
import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from bench.model_latency import CONCURRENT_WORKER, ModelServer, start_workers, wait_for_workers
from bench.processes import (
    cpu_seconds,
    cpu_seconds_by_kind,
    family,
    host_cpu_seconds,
    host_loop_milliseconds,
    idle_cpu_seconds,
    pss_kb,
    system_cpu_seconds,
)

#: Arrivals a second against the ideal.
ARRIVALS_TO_IDEAL = 1.1
#: Seconds between the batches of arrivals, each one transaction: the
#: bench's own CPU (counted in the host's) stays small.
BATCH_SECONDS = 0.1
#: Seconds between looks at the workers' PSS during the window.
PSS_LOOK_SECONDS = 2.0
#: Each worker process's database pool. A run holds a connection only for
#: its statements (a claim, its steps, its settle; the leases are renewed
#: by one keeper statement a process), but on a host the 4,000 runs in
#: flight saturate, a thread holding one waits for the CPU and the GIL
#: before it gives it back: with 30 a process, one process's runs waited
#: past the pool's timeout (10 s) some 900 times in a window; with 40,
#: once. The two processes and the bench (about 82 connections) stay under
#: half the harness's max_connections (200).
DATABASE_POOL_PER_PROCESS = 40
#: The workers' drain when stopped after the window: the runs still in
#: flight are handed back, which the figures never see.
DRAIN_SECONDS = 1

#: The issue's targets (#52): of the ideal at every row; worker CPU per run
#: at the most runs in flight against the fewest; PSS per run at the most.
RATIO_AT_LEAST = 0.9
CPU_GROWTH_AT_MOST = 1.25
PSS_MB_PER_RUN_AT_MOST = 0.3


def window_seconds(latency: float, at_least: float) -> float:
    """Whole run lengths (2 ``latency``): at least three, and at least
    ``at_least`` seconds."""
    run_seconds = 2 * latency
    return max(3, math.ceil(at_least / run_seconds - 1e-9)) * run_seconds


def steady_state_figures(
    worker_env: dict, rows: list[tuple[int, float]], processes: int, window_at_least: float
) -> list[dict]:
    """A round per ``(runs in flight, model latency)`` of ``rows``."""
    return [
        steady_state_round(
            worker_env,
            in_flight=in_flight,
            latency=latency,
            processes=processes,
            window_at_least=window_at_least,
        )
        for in_flight, latency in rows
    ]


def steady_state_round(
    worker_env: dict, *, in_flight: int, latency: float, processes: int, window_at_least: float
) -> dict:
    """``in_flight`` runs in flight on ``processes`` concurrent workers, a
    model answering after ``latency`` seconds; raises if a run failed by
    the window's close, or a worker exited during the round."""
    from runs.models import AgentRun
    from runs.runtime import enqueue
    from tools.models import Note

    if in_flight % processes:
        raise ValueError(f"{in_flight} runs in flight do not split evenly over {processes}")
    concurrency = in_flight // processes
    ideal = in_flight / (2 * latency)
    window = window_seconds(latency, window_at_least)
    model = ModelServer(latency)
    # This process validates the requests it enqueues: the provider must be
    # configured here too.
    settings.NRLLM_OPENAI_BASE_URL, settings.NRLLM_OPENAI_API_KEY = model.base_url, "sk-bench"
    env = {
        **worker_env,
        "NRLLM_WORKER_CLASS": CONCURRENT_WORKER,
        "NRLLM_WORKER_CONCURRENCY": str(concurrency),
        # Django's pool: a connection serves statements, not model waits.
        "DATABASE_POOL_MAX_SIZE": str(DATABASE_POOL_PER_PROCESS),
        "DATABASE_CONN_MAX_AGE": "0",
        "NRLLM_OPENAI_BASE_URL": model.base_url,
        "NRLLM_OPENAI_API_KEY": "sk-bench",
        # Well above a turn: the client's wait for one of its pool's
        # connections is bounded by the same timeout (httpx's pool timeout).
        "NRLLM_OPENAI_READ_TIMEOUT_SECONDS": str(math.ceil(latency) + 60),
        "NRLLM_WORKER_DRAIN_SECONDS": str(DRAIN_SECONDS),
    }
    prompt = f"steady state, {in_flight} in flight, {latency:g} s, {time.time()}"
    request = {
        "prompt": prompt,
        "tools": ["read_note"],
        "provider": {"kind": "openai", "model": "bench-model"},
    }
    workers = []
    try:
        Note.objects.update_or_create(slug="bench", defaults={"body": "hello"})
        # A run enqueued before the workers start: its job makes its team's
        # queue known to Redis, which a worker looks for as it starts; one
        # that appeared after would be served only after a blocking dequeue
        # (``ServesTeamQueues.dequeue_seconds``, 5 s), in the ramp.
        warm_up = enqueue({**request, "prompt": f"{prompt} (warm-up)"})
        workers += start_workers(env, processes)
        wait_for_workers(processes)
        _wait_for_end(warm_up.pk, seconds=60 + 2 * latency)
        # Their start-up (which goes on after they register) done before the
        # host's speed is taken.
        idle_cpu_seconds({worker.pid for worker in workers})
        host_loop_ms = host_loop_milliseconds()
        measured = _paced_round(
            workers,
            model,
            request,
            rate=ARRIVALS_TO_IDEAL * ideal,
            ramp=2 * latency,
            window=window,
        )
        connections = model.stats()
    finally:
        _stop(workers)
        model.stop()
    mine = AgentRun.objects.filter(prompt=prompt)
    rows = list(
        mine.values_list(
            "status",
            "created_at",
            "started_at",
            "finished_at",
            "lease_expires_at",
            "requeue_count",
        )
    )
    _refuse_failures(mine, measured["closed"]["at"])
    unfinished = _delete_unfinished(mine)
    return {
        "in_flight": in_flight,
        "latency_seconds": latency,
        "processes": processes,
        "concurrency": concurrency,
        "database_pool_per_process": DATABASE_POOL_PER_PROCESS,
        "ideal_runs_per_second": ideal,
        "arrivals_per_second": ARRIVALS_TO_IDEAL * ideal,
        "enqueued": measured["enqueued"],
        "host_loop_ms": host_loop_ms,
        "most_model_connections": connections["connections_most"],
        "unfinished_deleted": unfinished,
        **_figures(rows, measured, ideal=ideal, run_seconds=2 * latency),
    }


def _paced_round(
    workers: list, model: ModelServer, request: dict, *, rate: float, ramp: float, window: float
) -> dict:
    """Runs of ``request`` arriving at ``rate`` a second (``PacedArrivals``)
    until the window, ``window`` seconds from ``ramp`` after the first
    commit, closes; the CPU counters read as it opens and closes, and the
    workers' PSS every ``PSS_LOOK_SECONDS`` in it. The measuring keeps its
    own clock: a batch that takes long (a host the workers saturate) holds
    up the arrivals' thread, not the window."""
    from runs.models import AgentRun

    pids = {worker.pid for worker in workers}
    kinds = {"workers": pids, "bench": {os.getpid()}, "model server": {model.process.pid}}
    running = AgentRun.objects.filter(prompt=request["prompt"], status="running")
    arrivals = PacedArrivals(request, rate)
    arrivals.start()
    looks = []
    try:
        first_at = arrivals.first_commit_at(timeout=60)
        _sleep_until(first_at + ramp, workers, arrivals)
        opened = _counters(pids, kinds)
        closes_at = opened["monotonic"] + window
        next_look = opened["monotonic"]
        while True:
            _sleep_until(min(next_look, closes_at), workers, arrivals)
            if time.monotonic() >= closes_at:
                closed = _counters(pids, kinds)
                break
            looks.append((running.count(), sum(pss_kb(pid) for pid in family(pids))))
            next_look += PSS_LOOK_SECONDS
    finally:
        arrivals.stop()
    return {"opened": opened, "closed": closed, "enqueued": arrivals.enqueued, "looks": looks}


def _sleep_until(moment: float, workers: list, arrivals: "PacedArrivals") -> None:
    """Until the monotonic ``moment``; raises as soon as a worker exits or
    the arrivals fail."""
    while (left := moment - time.monotonic()) > 0:
        exited = [worker.returncode for worker in workers if worker.poll() is not None]
        if exited:
            raise RuntimeError(f"a worker exited during the round (exit status {exited})")
        if arrivals.error is not None:
            raise RuntimeError("the arrivals failed") from arrivals.error
        time.sleep(min(left, 0.5))


class PacedArrivals(threading.Thread):
    """Enqueues ``request`` at ``rate`` a second from its first commit, a
    batch every ``BATCH_SECONDS`` in one transaction (the jobs go out after
    its commit), on a database connection of its own, until ``stop``. A
    batch late on the pace takes what is due, at most a second's worth: it
    catches up over the next commits rather than in one long transaction."""

    def __init__(self, request: dict, rate: float):
        super().__init__(name="paced-arrivals", daemon=True)
        self.request, self.rate = request, rate
        self.enqueued = 0
        self.error: BaseException | None = None
        self._first_at: float | None = None
        self._first_commit = threading.Event()
        self._stopping = threading.Event()

    def run(self) -> None:
        from django.db import connection

        from runs.runtime import enqueue

        try:
            while not self._stopping.is_set():
                tick = time.monotonic()
                due = 1 if self._first_at is None else int(self.rate * (tick - self._first_at)) + 1
                batch = min(due - self.enqueued, math.ceil(self.rate))
                if batch > 0:
                    with transaction.atomic():
                        for _ in range(batch):
                            enqueue(self.request)
                    self.enqueued += batch
                    if self._first_at is None:
                        self._first_at = time.monotonic()
                        self._first_commit.set()
                self._stopping.wait(max(0.0, tick + BATCH_SECONDS - time.monotonic()))
        except BaseException as error:
            self.error = error
        finally:
            connection.close()  # this thread's own

    def first_commit_at(self, timeout: float) -> float:
        """The monotonic moment of the first batch's commit."""
        if not self._first_commit.wait(timeout):
            raise RuntimeError("the first arrivals were not committed") from self.error
        return self._first_at

    def stop(self) -> None:
        """No batch after the one under way; waits for it."""
        self._stopping.set()
        self.join(timeout=120)


def _wait_for_end(run_id, *, seconds: float) -> None:
    """Until the run ``run_id`` completed; raises after ``seconds``."""
    from runs.models import AgentRun

    deadline = time.monotonic() + seconds
    while (status := AgentRun.objects.get(pk=run_id).status) != "completed":
        if status in ("failed", "cancelled") or time.monotonic() > deadline:
            raise RuntimeError(f"the warm-up run did not complete: {status}")
        time.sleep(0.1)


def _counters(pids: set[int], kinds: dict[str, set[int]]) -> dict:
    """The moment (wall and monotonic), the workers' CPU time, the bench's
    own (its arrivals and looks), the host's, and the host's processes' by
    kind (``kinds``, then by command)."""
    host_busy, host_steal = host_cpu_seconds()
    return {
        "at": timezone.now(),
        "monotonic": time.monotonic(),
        "worker_cpu": sum(cpu_seconds(pid) for pid in pids),
        "worker_system_cpu": sum(system_cpu_seconds(pid) for pid in pids),
        "bench_cpu": cpu_seconds(os.getpid()),
        "host_cpu": host_busy,
        "host_steal": host_steal,
        "by_kind": cpu_seconds_by_kind(kinds),
    }


def _figures(rows: list[tuple], measured: dict, *, ideal: float, run_seconds: float) -> dict:
    """The window's figures from the runs' rows (status, created, started,
    finished, lease expiry, requeues) and the counters read as it opened
    and closed."""
    opened, closed = measured["opened"], measured["closed"]
    opens_at, closes_at = opened["at"], closed["at"]
    seconds = (closes_at - opens_at).total_seconds()
    ended = [row[3] for row in rows if row[3] and opens_at <= row[3] < closes_at]
    if not ended:
        ends = sorted(row[3] for row in rows if row[3])
        raise RuntimeError(
            f"no run ended in the window ({opens_at} to {closes_at}): {len(rows)} runs, "
            f"{len(ends)} ended, the first at {ends[0] if ends else None}"
        )
    by_run_length = []
    for generation in range(max(1, round(seconds / run_seconds))):
        starts = opens_at + timedelta(seconds=generation * run_seconds)
        stops = min(closes_at, starts + timedelta(seconds=run_seconds))
        count = sum(1 for end in ended if starts <= end < stops)
        by_run_length.append(count / (stops - starts).total_seconds())
    to_start = [
        (row[2] - row[1]).total_seconds()
        for row in rows
        if row[2] and opens_at <= row[2] < closes_at
    ]
    per_run_kb = [pss / running for running, pss in measured["looks"] if running]
    rate = len(ended) / seconds
    host_busy = closed["host_cpu"] - opened["host_cpu"]
    return {
        "window_opens_after_seconds": run_seconds,
        "window_seconds": seconds,
        "ended_in_window": len(ended),
        "runs_per_second": rate,
        "ratio_to_ideal": rate / ideal,
        "runs_per_second_by_run_length": by_run_length,
        "worker_cpu_ms_per_run": (closed["worker_cpu"] - opened["worker_cpu"]) * 1000 / len(ended),
        # The kernel's share of it: threads waking one another (the GIL, the
        # pools' locks) grows it.
        "worker_system_share": (closed["worker_system_cpu"] - opened["worker_system_cpu"])
        / max(closed["worker_cpu"] - opened["worker_cpu"], 1e-9),
        "host_cpu_ms_per_run": host_busy * 1000 / len(ended),
        # The bench process's share of the host's: its enqueuing (in
        # production the web process's), its looks.
        "bench_cpu_ms_per_run": (closed["bench_cpu"] - opened["bench_cpu"]) * 1000 / len(ended),
        # Where the host's went: the workers, the bench, the model server,
        # then every other process by its command (PostgreSQL, Redis).
        "host_cpu_ms_per_run_by_kind": _by_kind(opened["by_kind"], closed["by_kind"], len(ended)),
        "host_steal_ms_per_run": (closed["host_steal"] - opened["host_steal"]) * 1000 / len(ended),
        # Near 1, the host's CPUs are what the runs wait for.
        "host_cpus": os.cpu_count(),
        "host_busy_share": host_busy / (seconds * os.cpu_count()),
        "arrived_per_second_in_window": sum(1 for row in rows if opens_at <= row[1] < closes_at)
        / seconds,
        # Runs waiting for a slot: some at both ends, and no slot freed in
        # the window waited for an arrival.
        "waiting_at_open": _waiting_at(rows, opens_at),
        "waiting_at_close": _waiting_at(rows, closes_at),
        # Runs that stopped without ending (a record the database did not
        # take, a lease lost): still running, their lease lapsed before the
        # close (the workers' stop hands the others back after it). The
        # reaper would run them again; here they only end no more.
        "lapsed_by_close": sum(
            1 for row in rows if row[0] == "running" and row[4] and row[4] < closes_at
        ),
        # Runs put back in the queue after an attempt failed retryably.
        "requeued": sum(1 for row in rows if row[5]),
        "pss_mb_per_run": statistics.median(per_run_kb) / 1024 if per_run_kb else None,
        "pss_looks": len(per_run_kb),
        "running_at_looks_median": statistics.median(running for running, _ in measured["looks"])
        if measured["looks"]
        else 0,
        "started_in_window": len(to_start),
        "enqueue_to_start_p50_s": statistics.median(to_start) if to_start else None,
        "enqueue_to_start_p99_s": _p99(to_start) if to_start else None,
    }


def _by_kind(opened: dict[str, float], closed: dict[str, float], runs: int) -> dict[str, float]:
    """Each kind's CPU over the window per run, the most first; a kind whose
    figure is under a tenth of a millisecond a run either way left out (one
    below zero is kept: a process of it exited and was reaped by another
    kind, ``cpu_seconds_by_kind``)."""
    kinds = set(opened) | set(closed)
    spent = {kind: (closed.get(kind, 0.0) - opened.get(kind, 0.0)) * 1000 / runs for kind in kinds}
    return {
        kind: round(ms, 2)
        for kind, ms in sorted(spent.items(), key=lambda item: -item[1])
        if abs(ms) >= 0.1
    }


def _waiting_at(rows: list[tuple], moment) -> int:
    """Runs enqueued by ``moment`` and not started by then."""
    return sum(1 for row in rows if row[1] <= moment and (row[2] is None or row[2] > moment))


def _p99(values: list[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def _refuse_failures(runs, closes_at) -> None:
    """A run that failed by the window's close is an error of the runtime
    under load (a pool exhausted, a timeout): the figures would hide it."""
    failed = runs.filter(status="failed", finished_at__lte=closes_at)
    count = failed.count()
    if count:
        first = failed.values("termination_reason", "failure_class", "error_message").first()
        raise RuntimeError(f"{count} runs failed by the window's close; the first: {first}")


def _delete_unfinished(runs) -> int:
    """Delete the runs that did not end (queued, or handed back ``running``)
    and every job in Redis; how many runs. The reaper of a later part would
    take them up otherwise, and its workers their jobs."""
    from runs.queue.dispatch import run_queue
    from runs.reaper.retention import delete_whole_runs

    ids = list(runs.filter(finished_at__isnull=True).values_list("id", flat=True))
    for start in range(0, len(ids), 1000):
        delete_whole_runs(ids[start : start + 1000])
    run_queue().connection.flushdb()
    return len(ids)


def _stop(workers: list) -> None:
    """SIGTERM: each drains ``DRAIN_SECONDS`` and hands back the rest. One
    that has not exited a minute later is killed."""
    for worker in workers:
        worker.terminate()
    for worker in workers:
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
