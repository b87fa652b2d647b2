"""The queue figure: one-step runs dispatched to Redis and drained by
rqworkers of each worker class, next to bare RQ jobs and to RQ jobs making
a run's two commits and nothing else (``bench.tools.durable_floor_job``).

Named for the figure, not ``queue``: ``bench/dbos_peer.py`` runs with this
folder on ``sys.path``, where a ``queue.py`` would hide the standard library's."""

import resource
import subprocess
import sys

from django.conf import settings
from django.db import connection, transaction
from rq import Queue
from rq.job import Job

from bench.measuring import ROOT, median_by
from bench.tools import FLOOR_TABLES

WORKER_CLASSES = {
    # RQ's worker, forking a work horse per job (a new database connection
    # each, unpooled: a pool would be the horse's alone); without
    # PROMETHEUS_MULTIPROC_DIR it is RQ's own.
    "runs.worker.Worker": {"DATABASE_POOL_MAX_SIZE": "0"},
    # Jobs in the worker itself, on a database connection kept between jobs.
    "runs.worker.SimpleWorker": {"DATABASE_CONN_MAX_AGE": "600"},
}


def _drain_with_workers(env: dict, workers: int, worker_class: str, job_ids: list) -> float:
    """Seconds from the first of ``job_ids`` starting to the last one ending:
    the workers' own start-up (importing Django) is left out, for ours and
    bare RQ alike."""
    from runs.queue.dispatch import run_queue

    env = {**env, "NRLLM_WORKER_CLASS": worker_class, **WORKER_CLASSES[worker_class]}
    queue = run_queue()
    processes = [
        subprocess.Popen(
            [sys.executable, "manage.py", "rqworker", "--burst", settings.NRLLM_QUEUE_NAME],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(workers)
    ]
    for process in processes:
        process.wait(timeout=600)
    jobs = Job.fetch_many(job_ids, connection=queue.connection)
    assert all(job is not None and job.ended_at for job in jobs), "a job did not finish"
    first = min(job.started_at for job in jobs)
    last = max(job.ended_at for job in jobs)
    return (last - first).total_seconds()


def through_the_queue(
    runs: int,
    rounds: int,
    worker_env: dict,
    worker_classes: tuple = tuple(WORKER_CLASSES),
    workers: int = 2,
) -> dict:
    """One-step runs drained by ``workers`` rqworkers (2; the smoke bench's
    1 spares its start-ups), next to bare no-op RQ jobs drained
    by the same worker class right after, for each worker class; ``rounds``
    such pairs, taken in turn. Reported: the round with the median ratio, so
    drift on a shared machine hits both sides of the ratio alike.

    Each round also drains RQ jobs that make a one-step run's two commits
    (only the settle's waits for the WAL flush) and nothing else
    (``bench.tools.durable_floor_job``): the floor under the runs, as the
    psycopg loop is under the steps."""
    with connection.cursor() as cursor:
        for statement in FLOOR_TABLES:
            cursor.execute(statement)
    samples = {worker_class: [] for worker_class in worker_classes}
    for _ in range(rounds):
        for worker_class in worker_classes:
            samples[worker_class].append(_queue_round(runs, worker_class, worker_env, workers))
    figures = {}
    for worker_class, measured in samples.items():
        figures[worker_class] = {
            **median_by(measured, "ratio"),
            "rounds": [round(m["ratio"], 3) for m in measured],
            # The floor's own median round, which may be another round.
            "floor": median_by(measured, "ratio_to_floor"),
            "floor_rounds": [round(m["ratio_to_floor"], 3) for m in measured],
        }
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"worker_classes": figures, "workers": workers, "worker_peak_rss_mb": peak_kb / 1024}


def _enqueue_many(queue, function: str, arguments: list[tuple]) -> list[str]:
    """Jobs of ``function``, one per argument tuple, in one Redis pipeline."""
    jobs = queue.enqueue_many([Queue.prepare_data(function, args=args) for args in arguments])
    return [job.id for job in jobs]


def _queue_round(runs: int, worker_class: str, worker_env: dict, workers: int) -> dict:
    from runs.models import AgentRun
    from runs.queue.dispatch import job_id_for, run_queue
    from runs.runtime import enqueue

    queue = run_queue()
    queue.empty()
    prompt = f"through {worker_class}"
    request = {"prompt": prompt, "provider": {"kind": "scripted", "turns": [{"content": "ok"}]}}
    done_before = AgentRun.objects.filter(prompt=prompt, status="completed").count()
    with transaction.atomic():  # one commit for the setup; jobs go out after it
        ours_jobs = [job_id_for(enqueue(request).pk, 0) for _ in range(runs)]
    ours = _drain_with_workers(worker_env, workers, worker_class, ours_jobs)
    done = AgentRun.objects.filter(prompt=prompt, status="completed").count() - done_before
    bare_jobs = _enqueue_many(queue, "bench.tools.noop_job", [()] * runs)
    bare = _drain_with_workers(worker_env, workers, worker_class, bare_jobs)
    # The floor is context, and a rate: half as many jobs measure it as well.
    floor_runs = runs // 2
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE bench_floor_run, bench_floor_step")
        cursor.execute(
            "INSERT INTO bench_floor_run SELECT g, 'queued' FROM generate_series(1, %s) g",
            [floor_runs],
        )
    floor_jobs = _enqueue_many(
        queue, "bench.tools.durable_floor_job", [(row,) for row in range(1, floor_runs + 1)]
    )
    floor = _drain_with_workers(worker_env, workers, worker_class, floor_jobs)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM bench_floor_run WHERE status = 'completed'")
        assert cursor.fetchone()[0] == floor_runs, "a floor job did not make its two commits"
    return {
        "runs": runs,
        "completed": done,
        "runs_per_second": runs / ours,
        "bare_rq_jobs_per_second": runs / bare,
        "ratio": bare / ours,
        "floor_jobs_per_second": floor_runs / floor,
        "ratio_to_floor": (runs / ours) / (floor_runs / floor),
    }
