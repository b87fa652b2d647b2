"""The real workload: runs that wait on a model.

A local chat-completions server answers every request after ``latency``
seconds: a run's first turn calls ``read_note``, its second answers. Worker
processes of one class drain ``runs`` such runs; measured while they do:

- throughput against the ideal (runs in flight / the two turns' latency),
  from the commit that makes the runs' jobs go out to the last run's end,
  and in steady state: while every slot freed was taken again;
- runs in flight per worker process, at the peak;
- PSS (``/proc/PID/smaps_rollup``: shared pages count once) of the workers
  and their work horses, per run in flight, at the peak;
- worker CPU per run (the workers' and their reaped horses' user and system
  time while they drained, start-up left out);
- enqueue → start and enqueue → end, p50 and p99 (the run rows' times).
"""

import statistics
import subprocess
import sys
import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from bench.measuring import ROOT
from bench.processes import (
    cpu_seconds,
    family,
    host_loop_milliseconds,
    idle_cpu_seconds,
    parent_of,
    pss_kb,
)


class ModelServer:
    """``bench.model_server`` in a process of its own, answering after
    ``latency`` seconds (a run's first turn calls ``read_note``, its second
    answers)."""

    def __init__(self, latency: float, per_minute: int | None = None):
        limit = [str(per_minute)] if per_minute else []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.model_server", str(latency), *limit],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.base_url = self.process.stdout.readline().strip()
        if not self.base_url:
            raise RuntimeError("the bench's model server did not start")

    def stats(self) -> dict:
        """The client connections open now and the most open at once
        (``connections_open``, ``connections_most``; from each one's first
        model request), and a limited server's moments each request was answered
        and refused (``answered``, ``refused``)."""
        import json
        import urllib.request

        server = self.base_url.removesuffix("/v1")
        with urllib.request.urlopen(f"{server}/stats", timeout=30) as answer:
            return json.loads(answer.read())

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def _in_flight_by_worker(workers: set[int]) -> dict[int, int]:
    """Runs ``running`` now, by the worker process executing them (a horse's
    runs count for its parent)."""
    from runs.models import AgentRun

    counts = dict.fromkeys(workers, 0)
    for owner in AgentRun.objects.filter(status="running").values_list("lease_owner", flat=True):
        pid = int(owner.split(":")[1])
        worker = pid if pid in workers else parent_of(pid)
        if worker in counts:
            counts[worker] += 1
    return counts


def model_latency_round(
    worker_env: dict,
    *,
    worker_class: str,
    processes: int,
    latency: float,
    runs: int,
    concurrency: int = 1,
    env: dict | None = None,
    model_limit: int | None = None,
) -> dict:
    """``runs`` two-turn runs drained by ``processes`` workers of ``worker_class``
    (each executing up to ``concurrency`` at once, with ``env`` added)
    against a model answering after ``latency`` seconds (and refusing past
    ``model_limit`` requests a minute, if set: ``served`` says when)."""
    from runs.models import AgentRun
    from runs.runtime import enqueue
    from tools.models import Note

    model = ModelServer(latency, model_limit)
    served = None
    # This process validates the requests it enqueues: the provider must be
    # configured here too.
    settings.NRLLM_OPENAI_BASE_URL, settings.NRLLM_OPENAI_API_KEY = model.base_url, "sk-bench"
    env = {
        **worker_env,
        "NRLLM_WORKER_CLASS": worker_class,
        "NRLLM_OPENAI_BASE_URL": model.base_url,
        "NRLLM_OPENAI_API_KEY": "sk-bench",
        "NRLLM_OPENAI_READ_TIMEOUT_SECONDS": str(int(latency) + 60),
        "DATABASE_CONN_MAX_AGE": "600",
        **(env or {}),
    }
    workers = []
    try:
        Note.objects.update_or_create(slug="bench", defaults={"body": "hello"})
        workers += start_workers(env, processes)
        pids = {worker.pid for worker in workers}
        wait_for_workers(processes)
        cpu_before = idle_cpu_seconds(pids)
        host_loop_ms = host_loop_milliseconds()
        prompt = f"latency {latency} {worker_class} {time.time()}"
        request = {
            "prompt": prompt,
            "tools": ["read_note"],
            "provider": {"kind": "openai", "model": "bench-model"},
        }
        started = time.monotonic()
        with transaction.atomic():  # one commit; the jobs go out after it
            for _ in range(runs):
                enqueue(request)
            # The workers' clock starts at the commit, before any job can go
            # out: inserting the rows is this process's work, not theirs.
            committing_at = timezone.now()
        mine = AgentRun.objects.filter(prompt=prompt)
        # PSS per run in flight at every look, the largest while the most
        # runs are in flight: a horse grows during its run (a first look,
        # as it claims, would see it before it loaded anything).
        peak_in_flight, peak_per_worker, pss_per_run_kb = 0, 0, 0.0
        while mine.exclude(status__in=["completed", "failed", "cancelled"]).exists():
            if time.monotonic() - started > 600:
                raise RuntimeError(f"{worker_class}: runs still unfinished after 600 s")
            in_flight = _in_flight_by_worker(pids)
            total = sum(in_flight.values())
            if total and total >= peak_in_flight:
                pss = sum(pss_kb(pid) for pid in family(pids)) / total
                if total > peak_in_flight:
                    peak_in_flight, peak_per_worker, pss_per_run_kb = total, 0, 0.0
                peak_per_worker = max(peak_per_worker, *in_flight.values())
                pss_per_run_kb = max(pss_per_run_kb, pss)
            time.sleep(0.2)
        reaped_by = time.monotonic() + 30
        while family(pids) != pids and time.monotonic() < reaped_by:
            time.sleep(0.1)  # a horse's CPU counts for its worker once reaped
        cpu_after = sum(cpu_seconds(pid) for pid in pids)
        if model_limit:
            served = model.stats()
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(timeout=60)
        model.stop()
    rows = list(mine.values_list("status", "created_at", "started_at", "finished_at"))
    completed = [row for row in rows if row[0] == "completed"]
    if len(completed) != runs:
        raise RuntimeError(
            f"{worker_class}: {runs - len(completed)} of {runs} runs did not complete"
        )
    steady = _steady_state([(row[2], row[3]) for row in rows], processes * concurrency)
    wall = (max(row[3] for row in rows) - committing_at).total_seconds()
    to_start = [(row[2] - row[1]).total_seconds() for row in rows if row[2]]
    to_end = [(row[3] - row[1]).total_seconds() for row in rows]
    ideal = min(processes * concurrency, runs) / (2 * latency)
    return {
        "worker_class": worker_class,
        "processes": processes,
        "concurrency": concurrency,
        "latency_seconds": latency,
        "runs": runs,
        "completed": len(completed),
        "runs_per_second": runs / wall,
        "ideal_runs_per_second": ideal,
        "ratio_to_ideal": (runs / wall) / ideal,
        "steady_runs_per_second": steady["runs_per_second"],
        "steady_ratio_to_ideal": steady["runs_per_second"] and steady["runs_per_second"] / ideal,
        "steady_in_flight": steady["in_flight"],
        "steady_seconds": steady["seconds"],
        "peak_in_flight": peak_in_flight,
        "peak_in_flight_per_process": peak_per_worker,
        "pss_mb_per_run_in_flight": pss_per_run_kb / 1024,
        "worker_cpu_ms_per_run": (cpu_after - cpu_before) * 1000 / runs,
        "host_loop_ms": host_loop_ms,
        "enqueue_to_start_p50_s": statistics.median(to_start),
        "enqueue_to_start_p99_s": _p99(to_start),
        "enqueue_to_end_p50_s": statistics.median(to_end),
        "enqueue_to_end_p99_s": _p99(to_end),
        "served": served,
    }


def _steady_state(spans: list[tuple], slots: int) -> dict:
    """Runs ended per second while every slot freed was taken again at once
    (the ideal's premise, ``slots`` in flight): from the ``slots``-th run's
    end to the (runs - ``slots``)-th's, when a run was still waiting for
    each slot that freed. Before it the slots fill, after it they drain with
    nothing to take: the whole round's figure counts both. Counted end to
    end, the window holds whole generations of runs however they bunch (the
    runs that start together end together: a window from the first end
    would count one wave more than it spans). Also the runs in flight then,
    on average (a look every 0.1 s)."""
    ends = sorted(end for _, end in spans)
    if len(ends) <= 2 * slots:
        return {"runs_per_second": None, "in_flight": None, "seconds": 0.0}
    opens, closes = ends[slots - 1], ends[len(ends) - slots - 1]
    seconds = (closes - opens).total_seconds()
    if seconds <= 0:
        return {"runs_per_second": None, "in_flight": None, "seconds": 0.0}
    looks = [opens + timedelta(seconds=0.1 * k) for k in range(int(seconds * 10) + 1)]
    in_flight = [sum(1 for start, end in spans if start <= look < end) for look in looks]
    return {
        "runs_per_second": (len(ends) - 2 * slots) / seconds,
        "in_flight": sum(in_flight) / len(in_flight),
        "seconds": seconds,
    }


def _ordinal(number: int) -> str:
    if 10 <= number % 100 <= 20:
        return f"{number}th"
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def start_workers(env: dict, count: int) -> list[subprocess.Popen]:
    """``count`` ``manage.py rqworker`` processes on the runs' queue, with
    ``env``, their output discarded (they are measured, not read)."""
    return [
        subprocess.Popen(
            [sys.executable, "manage.py", "rqworker", settings.NRLLM_QUEUE_NAME],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]


def wait_for_workers(count: int) -> None:
    """Until ``count`` workers listen (their start-up is not the runs' cost)."""
    from rq import Worker

    from runs.queue.dispatch import run_queue

    connection = run_queue().connection
    deadline = time.monotonic() + 120
    while len(Worker.all(connection=connection)) < count:
        if time.monotonic() > deadline:
            raise RuntimeError("the workers did not start within 120 s")
        time.sleep(0.2)


#: The worker classes measured here, one run in flight per process. The
#: concurrent one, many per process, is measured in steady state with runs
#: arriving paced (``bench.steady_state``, #52).
LATENCY_WORKER_CLASSES = ("runs.worker.Worker", "runs.worker.SimpleWorker")
CONCURRENT_WORKER = "runs.worker.ConcurrentWorker"
#: The issue's targets (#28), per run: worker CPU and PSS per run in flight.
CPU_MS_PER_RUN_AT_MOST = 20
PSS_MB_PER_RUN_AT_MOST = 3


def model_latency_figures(worker_env: dict, processes: int, workloads: list) -> list[dict]:
    """A round per one-run worker class and ``(latency, runs per slot)`` of
    ``workloads``, on ``processes`` workers."""
    return [
        model_latency_round(
            worker_env,
            worker_class=worker_class,
            processes=processes,
            latency=latency,
            runs=runs_per_slot * processes,
        )
        for latency, runs_per_slot in workloads
        for worker_class in LATENCY_WORKER_CLASSES
    ]


def latency_rows(figures: list[dict]) -> list[dict]:
    """The results table's rows: throughput against the ideal, then what a
    run cost and waited."""
    rows = []
    for figure in figures:
        where = (
            f"{figure['processes']} rqworkers ({figure['worker_class']}), a model "
            f"answering in {figure['latency_seconds']:g} s, {figure['runs']} two-turn runs"
        )
        steady = figure.get("steady_runs_per_second")
        rows.append(
            {
                "figure": f"runs waiting on a model: {where} "
                f"({figure['completed']} completed, from the commit that enqueued them to the last "
                "end; ideal = runs in flight / two turns' latency)",
                "value": f"{figure['runs_per_second']:.2f} runs/s",
                "baseline": f"{figure['ideal_runs_per_second']:.2f} runs/s ideal",
                "ratio": figure["ratio_to_ideal"],
            }
        )
        if steady:
            slots = figure["processes"]
            rows.append(
                {
                    "figure": f"the same runs in steady state ({where}): while every slot freed "
                    f"was taken again, the {figure['steady_seconds']:.1f} s from the "
                    f"{_ordinal(slots)} run's end to the {_ordinal(figure['runs'] - slots)}'s, "
                    f"{figure['steady_in_flight']:.0f} in flight on average (the whole round "
                    "adds the slots filling and draining)",
                    "value": f"{steady:.2f} runs/s",
                    "baseline": f"{figure['ideal_runs_per_second']:.2f} runs/s ideal",
                    "ratio": figure["steady_ratio_to_ideal"],
                }
            )
        rows.append(
            {
                "figure": f"worker CPU per run ({where}; at the peak "
                f"{figure['peak_in_flight']} in flight, {figure['peak_in_flight_per_process']} "
                f"per process, {figure['pss_mb_per_run_in_flight']:.1f} MB PSS per run in "
                f"flight; enqueue to start p50 {figure['enqueue_to_start_p50_s']:.2f} s, p99 "
                f"{figure['enqueue_to_start_p99_s']:.2f} s; to end p50 "
                f"{figure['enqueue_to_end_p50_s']:.2f} s, "
                f"p99 {figure['enqueue_to_end_p99_s']:.2f} s; the host's speed then: a fixed "
                f"Python loop in {figure['host_loop_ms']:.0f} ms)",
                "value": f"{figure['worker_cpu_ms_per_run']:.0f} ms",
                "at_most": f"{CPU_MS_PER_RUN_AT_MOST} ms",
            }
        )
        rows.append(
            {
                "figure": f"PSS per run in flight ({where})",
                "value": f"{figure['pss_mb_per_run_in_flight']:.1f} MB",
                "at_most": f"{PSS_MB_PER_RUN_AT_MOST} MB",
            }
        )
    return rows
