"""The step-overhead figures: steps per second of in-process runs of each
no-op tool, their statements and WAL flushes per step, next to the floors
under them measured in plain psycopg (a durable step in two statements and
in one, and the disk's one-row commit rate)."""

import time

import psycopg
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench.measuring import median_by, steps_request
from bench.tools import database_dsn

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


def step_overhead(tool: str, steps: int) -> dict:
    """Steps per second of one in-process run of ``tool`` calls, timed with
    nothing watching the database adapter."""
    from runs.models import AgentRun
    from runs.runtime import enqueue

    request = steps_request(tool, steps // 2)
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
    from runs.transitions.step_journal import COMMIT_WITHOUT_FLUSH

    with CaptureQueriesContext(connection) as queries:
        run = enqueue(steps_request(tool, steps // 2))
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
