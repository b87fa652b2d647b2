"""The measurements. Each returns a dict of numbers; ``bench.run`` assembles them."""

import contextlib
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from rq import Queue
from rq.job import Job

from bench.tools import FLOOR_TABLES, database_dsn

ROOT = Path(__file__).resolve().parent.parent


def _steps_request(tool: str, iterations: int) -> dict:
    turn = {"tool_calls": [{"name": tool, "arguments": {}}]}
    return {
        "prompt": "bench",
        "tools": [tool],
        "provider": {"kind": "scripted", "turns": [turn] * (iterations - 1) + [{"content": "ok"}]},
        "max_iterations": iterations,
    }


STEP_TOOLS = ("noop_read", "noop_idempotent_write", "noop_non_idempotent_write")


def step_figures(steps: int, rounds: int) -> tuple[dict, dict]:
    """The step-overhead figures and their durable baseline, each the median of
    ``rounds`` measurements taken in turn, so drift on a shared machine hits
    both sides of a ratio alike. Statements are counted first, in a pass of
    their own that is not timed (and warms up): counting turns on Django's
    debug cursor, which renders every statement with its parameters, and a
    timed run under it would measure that instead of the runtime."""
    statements = {tool: step_statements(tool, steps) for tool in STEP_TOOLS}
    samples = {tool: [] for tool in STEP_TOOLS}
    baselines, one_statement = [], []
    for _ in range(rounds):
        baselines.append(durable_baseline(steps))
        one_statement.append(one_statement_baseline(steps))
        for tool in STEP_TOOLS:
            samples[tool].append(step_overhead(tool, steps))
    figures = {}
    for tool, measured in samples.items():
        middle = median_by(measured, "steps_per_second")
        figures[tool] = {
            **middle,
            **statements[tool],
            "rounds": [round(m["steps_per_second"]) for m in measured],
            # Each round's rate over the same round's floor: the spread of the ratio.
            "ratio_rounds": [
                round(m["steps_per_second"] / b["steps_per_second"], 2)
                for m, b in zip(measured, baselines, strict=True)
            ],
            "one_statement_ratio_rounds": [
                round(m["steps_per_second"] / b["steps_per_second"], 2)
                for m, b in zip(measured, one_statement, strict=True)
            ],
        }
    baseline = median_by(baselines, "steps_per_second")
    baseline["rounds"] = [round(b["steps_per_second"]) for b in baselines]
    baseline["commits_per_second"] = commit_rate(steps)
    baseline["one_statement"] = {
        **median_by(one_statement, "steps_per_second"),
        "rounds": [round(b["steps_per_second"]) for b in one_statement],
    }
    return figures, baseline


@contextlib.contextmanager
def commits_not_waiting_for_the_flush():
    """While active, every new connection to the bench database commits
    without waiting for its WAL to reach disk (``synchronous_commit = off``)
    by default: the floor's and the peer's figures then measure CPU per step,
    the limit a faster disk approaches. Ours still wait where they must (a
    write's fence and record, a settle: ``nrllm_ops.commits``), whatever the
    default says — a deployment tuned this way keeps G6 and G12. Django's
    connection is reopened on the way in and out, so the setting reaches it."""
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    connection.close()
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'ALTER DATABASE "{name}" RESET synchronous_commit')
        connection.close()


def median_by(measurements: list[dict], key: str) -> dict:
    ordered = sorted(measurements, key=lambda m: m[key])
    return dict(ordered[len(ordered) // 2])


def step_overhead(tool: str, steps: int) -> dict:
    """Steps per second of one in-process run of ``tool`` calls, timed with
    nothing watching the database adapter."""
    from runs.models import AgentRun
    from runs.runtime import enqueue

    request = _steps_request(tool, steps // 2)
    started = time.perf_counter()
    run = enqueue(request)  # without REDIS_URL: executed here, as a worker would
    elapsed = time.perf_counter() - started
    run = AgentRun.objects.get(pk=run.pk)
    assert run.status == "completed", run.error_message
    return {"steps": run.step_count, "steps_per_second": run.step_count / elapsed}


def step_statements(tool: str, steps: int) -> dict:
    """Round trips per step of the same run as ``step_overhead``'s, and how
    many of them commit a change waiting for its WAL flush (a model turn's or
    a read's record does not, G12), counted in an untimed run."""
    from runs.models import AgentRun
    from runs.runtime import enqueue
    from runs.step_journal import COMMIT_WITHOUT_FLUSH

    with CaptureQueriesContext(connection) as queries:
        run = enqueue(_steps_request(tool, steps // 2))
    run = AgentRun.objects.get(pk=run.pk)
    assert run.status == "completed", run.error_message
    flushed = [
        query
        for query in queries
        if not query["sql"].lstrip().upper().startswith("SELECT")
        and COMMIT_WITHOUT_FLUSH not in query["sql"]
    ]
    return {
        "statements_per_step": len(queries) / run.step_count,
        "flushes_per_step": len(flushed) / run.step_count,
    }


def _resumable_request(steps: int) -> dict:
    """The live run of ``_steps_request("noop_read", steps // 2)`` with a
    scripted auth failure, on the first attempt only, before its answer: that
    attempt records ``steps - 1`` steps (the request, ``steps // 2 - 1``
    no-op read calls and their llm turns) and fails ``not_retryable``; the
    next attempt replays those calls and answers live."""
    turn = {"tool_calls": [{"name": "noop_read", "arguments": {}}]}
    calls = steps // 2 - 1
    turns = [turn] * calls + [{"error": "auth", "attempts": 1}, {"content": "ok"}]
    return {
        "prompt": "bench resume",
        "tools": ["noop_read"],
        "provider": {"kind": "scripted", "turns": turns},
        "max_iterations": steps // 2,
    }


def _queued_run(request: dict):
    """A stored ``queued`` run of ``request``, not yet dispatched: the caller
    executes it with ``run_queued``, as a worker's job would."""
    from runs import transitions
    from runs.run_request import parse_run_request

    parsed = parse_run_request(request)
    return transitions.create_queued_run(parsed.as_json(), parsed.prompt)


def _requeued_after_failure(steps: int):
    """A run whose first attempt (executed here, untimed) recorded its journal
    and was dead-lettered, put back in the queue by an operator requeue."""
    from runs import transitions
    from runs.models import AgentRun
    from runs.runtime import enqueue
    from runs.vocabulary import StepKind

    run = AgentRun.objects.get(pk=enqueue(_resumable_request(steps)).pk)
    assert (run.status, run.termination_reason) == ("failed", "not_retryable"), run.error_message
    requeued = transitions.operator_requeue(
        run.pk,
        seen_status=run.status,
        seen_step_count=run.step_count,
        step={
            "kind": StepKind.OPERATOR,
            "result": {"operator": "bench", "action": "requeue", "note": "bench resume"},
        },
    )
    assert requeued, "the operator requeue did not match"
    return run


def _check_resumed(run_id, replayed_turns: int) -> int:
    """The resumed attempt completed, replayed ``replayed_turns`` turns and
    their tool results, and recorded only its request, one resume step and
    the final answer. Returns the journal steps it replayed."""
    from runs.models import AgentRun

    run = AgentRun.objects.get(pk=run_id)
    assert run.status == "completed", (run.status, run.termination_reason, run.error_message)
    attempt = list(
        run.steps.filter(lease_token=run.lease_token)
        .values_list("kind", "result")
        .order_by("sequence")
    )
    kinds = [kind for kind, _ in attempt]
    assert kinds == ["request", "resume", "llm"], kinds
    assert run.steps.filter(kind="resume").count() == 1
    resume = attempt[1][1]
    assert resume["model_turns"] == resume["tool_results"] == replayed_turns, resume
    return resume["model_turns"] + resume["tool_results"]


def _timed_run_queued(run_id) -> float:
    from runs.runtime import run_queued

    started = time.perf_counter()
    run_queued(run_id)
    return time.perf_counter() - started


def _statements_of_run_queued(run_id) -> int:
    from runs.runtime import run_queued

    with CaptureQueriesContext(connection) as queries:
        run_queued(run_id)
    return len(queries)


def resume_figures(steps: int, rounds: int) -> dict:
    """Resuming a run of ``steps`` recorded steps next to executing it live.

    Each round, in turn: a live run of ``steps`` no-op read steps, then the
    resumed attempt of a run whose first attempt recorded the same calls
    (claim, one journal read, the resume step, the live final answer); both
    timed from ``run_queued`` to its return, as a worker's job. Reported: the
    round with the median ratio resumed / live, and every round's values.
    Statements are counted in a separate, untimed pass first (which also
    warms up), at ``steps`` and at a tenth of it, so a count that grows with
    the journal shows."""
    from runs.models import AgentRun

    replayed_turns = steps // 2 - 1
    statements = {}
    for size in sorted({steps, max(steps // 10, 4)}):
        run = _requeued_after_failure(size)
        count = _statements_of_run_queued(run.pk)
        statements[_check_resumed(run.pk, size // 2 - 1)] = count
    live = _queued_run(_steps_request("noop_read", steps // 2))
    live_statements = _statements_of_run_queued(live.pk)
    live_steps = AgentRun.objects.get(pk=live.pk).step_count

    measured = []
    for _ in range(rounds):
        resumable = _requeued_after_failure(steps)
        live = _queued_run(_steps_request("noop_read", steps // 2))
        live_seconds = _timed_run_queued(live.pk)
        resumed_seconds = _timed_run_queued(resumable.pk)
        live = AgentRun.objects.get(pk=live.pk)
        assert live.status == "completed", live.error_message
        replayed = _check_resumed(resumable.pk, replayed_turns)
        measured.append(
            {
                "live_steps": live.step_count,
                "live_seconds": live_seconds,
                "live_steps_per_second": live.step_count / live_seconds,
                "replayed_steps": replayed,
                "resumed_seconds": resumed_seconds,
                "resumed_ms_per_replayed_step": resumed_seconds * 1000 / replayed,
                "ratio": resumed_seconds / live_seconds,
            }
        )
    middle = median_by(measured, "ratio")
    return {
        **middle,
        "rounds": [round(m["ratio"], 3) for m in measured],
        "live_rounds_steps_per_second": [round(m["live_steps_per_second"]) for m in measured],
        "resumed_rounds_ms": [round(m["resumed_seconds"] * 1000, 2) for m in measured],
        "resumed_rounds_ms_per_replayed_step": [
            round(m["resumed_ms_per_replayed_step"], 4) for m in measured
        ],
        "statements_per_resumed_attempt": statements[middle["replayed_steps"]],
        # Replayed steps → statements of the resumed attempt (a constant).
        "statements_per_resumed_attempt_by_replayed_steps": statements,
        "statements_per_live_step": live_statements / live_steps,
    }


def _floor_tables(conn) -> str:
    """The floors' step and lease tables, made afresh; the ~1 KB step body."""
    conn.execute("DROP TABLE IF EXISTS bench_step, bench_lease")
    conn.execute("CREATE TABLE bench_step (id bigserial primary key, run int, body text)")
    conn.execute("CREATE TABLE bench_lease (id int primary key, expires timestamptz)")
    conn.execute("INSERT INTO bench_lease VALUES (1, now())")
    return "x" * 1024


def durable_baseline(steps: int) -> dict:
    """The minimal durable work of a step in plain psycopg: insert a ~1 KB row
    and update one lease row, in one committed transaction."""
    with psycopg.connect(database_dsn(), autocommit=True) as conn:
        body = _floor_tables(conn)
        started = time.perf_counter()
        for _ in range(steps):
            with conn.transaction():
                conn.execute("INSERT INTO bench_step (run, body) VALUES (1, %s)", [body])
                conn.execute(
                    "UPDATE bench_lease SET expires = now() + interval '1 minute' WHERE id = 1"
                )
        elapsed = time.perf_counter() - started
        fsync = conn.execute("SHOW fsync").fetchone()[0]
        synchronous_commit = conn.execute("SHOW synchronous_commit").fetchone()[0]
    return {
        "steps_per_second": steps / elapsed,
        "fsync": fsync,
        "synchronous_commit": synchronous_commit,
    }


def one_statement_baseline(steps: int) -> dict:
    """The same durable work as ``durable_baseline`` in one statement (a
    data-modifying CTE, as the runtime records a step): one round trip, the
    stricter floor for the runtime's CPU per step."""
    with psycopg.connect(database_dsn(), autocommit=True) as conn:
        body = _floor_tables(conn)
        started = time.perf_counter()
        for _ in range(steps):
            conn.execute(
                "WITH lease AS (UPDATE bench_lease SET expires = now() + interval '1 minute' "
                "WHERE id = 1 RETURNING id) "
                "INSERT INTO bench_step (run, body) SELECT id, %s FROM lease",
                [body],
            )
        elapsed = time.perf_counter() - started
    return {"steps_per_second": steps / elapsed}


def commit_rate(commits: int) -> float:
    """Commits per second of the smallest durable transaction (one row
    updated): what this machine's disk flush allows today, so a reader can
    tell a disk change from a runtime change."""
    with psycopg.connect(database_dsn(), autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_commit")
        conn.execute("CREATE TABLE bench_commit (id int primary key, n bigint)")
        conn.execute("INSERT INTO bench_commit VALUES (1, 0)")
        started = time.perf_counter()
        for _ in range(commits):
            conn.execute("UPDATE bench_commit SET n = n + 1 WHERE id = 1")
        elapsed = time.perf_counter() - started
        conn.execute("DROP TABLE bench_commit")
    return commits / elapsed


def ten_step_runs(runs: int) -> dict:
    """The peer workload on our side: ``runs`` runs of ten recorded steps each
    (request, four no-op read calls with their llm turns, the answer), each
    created, claimed, executed and settled in-process, one after another."""
    from runs.models import AgentRun
    from runs.runtime import enqueue

    request = _steps_request("noop_read", 5)
    enqueue(request)  # warm-up, as the peer does
    started = time.perf_counter()
    ids = [enqueue(request).pk for _ in range(runs)]
    elapsed = time.perf_counter() - started
    steps = sum(AgentRun.objects.filter(pk__in=ids).values_list("step_count", flat=True))
    assert steps == 10 * runs, steps
    return {"runs": runs, "steps": steps, "steps_per_second": steps / elapsed}


def dbos_peer(
    python: str, base_url: str, workflows: int, database: str, *, wait_for_flush: bool = True
) -> dict:
    """The same workload on DBOS Transact, run by ``bench/dbos_peer.py`` in its
    own virtualenv against a fresh database on the same server; without
    ``wait_for_flush`` no commit in that database waits for its WAL to reach
    disk (as ``commits_not_waiting_for_the_flush`` does for ours)."""
    server, _, _ = base_url.rpartition("/")
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{database}"')
        if not wait_for_flush:
            conn.execute(f'ALTER DATABASE "{database}" SET synchronous_commit = off')
    script = ROOT / "bench" / "dbos_peer.py"
    completed = subprocess.run(
        [python, str(script), f"{server}/{database}", str(workflows)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    with psycopg.connect(f"{server}/{database}") as conn:
        (synchronous_commit,) = conn.execute("SHOW synchronous_commit").fetchone()
    return {
        **json.loads(completed.stdout.strip().splitlines()[-1]),
        "synchronous_commit": synchronous_commit,
    }


WORKER_CLASSES = {
    # The default: RQ's worker, forking a work horse per job (a new database
    # connection each); without PROMETHEUS_MULTIPROC_DIR it is RQ's own.
    "runs.worker.Worker": {},
    # Jobs in the worker itself, on a database connection kept between jobs.
    "rq.worker.SimpleWorker": {"DATABASE_CONN_MAX_AGE": "600"},
}


def _drain_with_workers(env: dict, workers: int, worker_class: str, job_ids: list) -> float:
    """Seconds from the first of ``job_ids`` starting to the last one ending:
    the workers' own start-up (importing Django) is left out, for ours and
    bare RQ alike."""
    from runs.dispatch import run_queue

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
    runs: int, rounds: int, worker_env: dict, worker_classes: tuple = tuple(WORKER_CLASSES)
) -> dict:
    """One-step runs drained by 2 rqworkers, next to bare no-op RQ jobs drained
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
            samples[worker_class].append(_queue_round(runs, worker_class, worker_env))
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
    return {"worker_classes": figures, "worker_peak_rss_mb": peak_kb / 1024}


def _enqueue_many(queue, function: str, arguments: list[tuple]) -> list[str]:
    """Jobs of ``function``, one per argument tuple, in one Redis pipeline."""
    jobs = queue.enqueue_many([Queue.prepare_data(function, args=args) for args in arguments])
    return [job.id for job in jobs]


def _queue_round(runs: int, worker_class: str, worker_env: dict) -> dict:
    from runs.dispatch import job_id_for, run_queue
    from runs.models import AgentRun
    from runs.runtime import enqueue

    queue = run_queue()
    queue.empty()
    prompt = f"through {worker_class}"
    request = {"prompt": prompt, "provider": {"kind": "scripted", "turns": [{"content": "ok"}]}}
    done_before = AgentRun.objects.filter(prompt=prompt, status="completed").count()
    with transaction.atomic():  # one commit for the setup; jobs go out after it
        ours_jobs = [job_id_for(enqueue(request).pk, 0) for _ in range(runs)]
    ours = _drain_with_workers(worker_env, 2, worker_class, ours_jobs)
    done = AgentRun.objects.filter(prompt=prompt, status="completed").count() - done_before
    bare_jobs = _enqueue_many(queue, "bench.tools.noop_job", [()] * runs)
    bare = _drain_with_workers(worker_env, 2, worker_class, bare_jobs)
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
    floor = _drain_with_workers(worker_env, 2, worker_class, floor_jobs)
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
