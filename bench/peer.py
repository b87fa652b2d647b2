"""The peer figure: our ten-step no-op runs in-process next to the same
workload on DBOS Transact (``bench/dbos_peer.py``, run in its own
virtualenv), paired in rounds."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from bench.measuring import ROOT, commits_not_waiting_for_the_flush, median_by, steps_request


def ten_step_runs(runs: int) -> dict:
    """The peer workload on our side: ``runs`` runs of ten recorded steps each
    (request, four no-op read calls with their llm turns, the answer), each
    created, claimed, executed and settled in-process, one after another."""
    from runs.models import AgentRun
    from runs.runtime import enqueue

    request = steps_request("noop_read", 5)
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


def peer_figures(base_url: str, size: dict, database: str) -> dict:
    """Rounds of ``ten_step_runs`` and ``dbos_peer``, with commits as the server's
    default has it, then again with none waiting for the flush. Exits when
    ``NRLLM_BENCH_DBOS_PYTHON`` names no interpreter."""
    python = os.environ.get("NRLLM_BENCH_DBOS_PYTHON")
    if not python or not Path(python).exists():
        sys.exit(
            "bench: NRLLM_BENCH_DBOS_PYTHON must name the DBOS virtualenv's python (make bench)"
        )
    # Rounds of ours, then theirs right after; reported: the round with the
    # median ratio, as for the queue. Our cost is mostly the WAL flush and
    # DBOS's mostly CPU, so a shared machine's drift moves the two apart;
    # within a round it hits both alike.
    peer = _peer_rounds(python, base_url, size["peer_workflows"], size["peer_rounds"], database)
    # Like for like: our model turns and reads do not wait for the flush (G12)
    # and DBOS's steps do; with no commit waiting on either side, what is
    # left is each runtime's CPU and round trips per step.
    with commits_not_waiting_for_the_flush():
        peer["not_waiting_for_the_flush"] = _peer_rounds(
            python,
            base_url,
            size["peer_workflows"],
            size["flushless_rounds"],
            database,
            wait_for_flush=False,
        )
    return peer


def _peer_rounds(
    python: str, base_url: str, workflows: int, rounds: int, database: str, **options
) -> dict:
    measured = []
    for _ in range(rounds):
        ours = ten_step_runs(workflows)
        theirs = dbos_peer(python, base_url, workflows, f"{database}_dbos", **options)
        ratio = ours["steps_per_second"] / theirs["steps_per_second"]
        measured.append({"ours": ours, "dbos": theirs, "ratio": ratio})
    return {
        **median_by(measured, "ratio"),
        "rounds": [round(r["ratio"], 2) for r in measured],
    }
