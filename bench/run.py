"""``make bench``: the runtime's cost, each figure next to a baseline measured
in the same run. Writes ``bench/results.json`` and ``bench/results.md``.

Run beside a PostgreSQL and Redis (``tests.harness`` starts them; with
``NRLLM_HARNESS_DURABLE=1`` PostgreSQL keeps fsync and synchronous_commit on).
``--smoke`` runs every figure small, to check that each is produced.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import psycopg

SIZES = {
    "full": {
        "steps": 200,
        "step_rounds": 7,
        "flushless_rounds": 3,
        "peer_workflows": 300,
        "peer_rounds": 5,
        "queue_runs": 2000,
        "queue_rounds": 3,
        "scale_runs": 1_000_000,
        "steps_per_run": 10,
        "latency_processes": 20,
        # (processes, runs in flight each) of runs.worker.ConcurrentWorker.
        "latency_concurrent": (2, 100),
        # (model latency, runs per slot): 5 per slot at 1 s, 3 at 5 s.
        "latency_workloads": [(1.0, 5), (5.0, 3)],
        "recovery_runs": 20,
        "recovery_overrides": None,
        "recovery_model_seconds": 60,
    },
    "smoke": {
        "steps": 40,
        "step_rounds": 1,
        "flushless_rounds": 1,
        "peer_workflows": 5,
        "peer_rounds": 1,
        "queue_runs": 40,
        "queue_rounds": 1,
        "scale_runs": 2000,
        "steps_per_run": 10,
        "latency_processes": 2,
        "latency_concurrent": (1, 4),
        "latency_workloads": [(0.2, 2)],
        "recovery_runs": 2,
        "recovery_overrides": {"NRLLM_LEASE_SECONDS": "2", "NRLLM_REAPER_INTERVAL_SECONDS": "1"},
        "recovery_model_seconds": 6,
    },
}
TARGETS = {
    "read step / baseline": 0.7,
    "idempotent write step / baseline": 0.6,
    "non-idempotent write step / baseline": 0.6,
    # The target is SimpleWorker's; the forking worker's figure is
    # context (a fork and a Django child per job, as bare RQ's forks are bare).
    "queue runs / bare RQ (rq.worker.SimpleWorker)": 0.85,
    "ours / DBOS Transact": 5.0,
}
SIMPLE_WORKER = "rq.worker.SimpleWorker"
#: Lower is better.
AT_MOST = {
    "resumed attempt / live run": 0.1,
    "worker peak RSS (MB)": 120,
}


def _fresh_database(base_url: str, name: str) -> str:
    server, _, _ = base_url.rpartition("/")
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{server}/{name}"


def _configure(database_url: str, redis_url: str) -> dict:
    env = {
        "DATABASE_URL": database_url,
        "SECRET_KEY": "bench-only",
        "NRLLM_TOOLS": "bench.tools.NoopRead,bench.tools.NoopIdempotentWrite,"
        "bench.tools.NoopNonIdempotentWrite",
        "NRLLM_MAX_ITERATIONS": "1000",
        # The figures measure execution: writes run unattended, as with no
        # approval policy (an approval is an operator's wait, not a cost).
        "NRLLM_APPROVAL_REQUIRED_FOR": "none",
        "DJANGO_SETTINGS_MODULE": "nrllm_ops.settings",
        "LOG_LEVEL": "WARNING",
        "ALLOWED_HOSTS": "testserver,127.0.0.1,localhost",
        # The in-process figures (no Redis) execute a run as it is enqueued.
        "NRLLM_EXECUTE_IN_CALLER": "true",
    }
    os.environ.update(env)
    os.environ.pop("REDIS_URL", None)  # the step figures execute in-process
    return {**os.environ, **env, "REDIS_URL": redis_url}


def _spread(values: list) -> str:
    """The lowest and highest of a figure's rounds."""
    return f"{min(values)}–{max(values)}" if len(values) > 1 else f"{values[0]}"


def _markdown(results: dict) -> str:
    lines = ["| figure | value | baseline (same run) | ratio | target |", "|---|---|---|---|---|"]
    for row in results["table"]:
        target = f"≥ {row['target']}" if row.get("target") is not None else ""
        if row.get("at_most") is not None:
            target = f"≤ {row['at_most']}"
        ratio = f"{row['ratio']:.2f}" if row.get("ratio") is not None else ""
        lines.append(
            f"| {row['figure']} | {row['value']} | {row.get('baseline', '')} | {ratio} | {target} |"
        )
    scale = results["at_scale"]
    lines += [
        "",
        f"At scale: {scale['runs']:,} runs, {scale['steps']:,} steps "
        f"(generated in {scale['generate_seconds']:.0f} s).",
        "",
        "| at scale | ms | index used |",
        "|---|---|---|",
    ]
    for name, ms in scale["milliseconds"].items():
        lines.append(f"| {name} | {ms:.1f} | |")
    for name, used in scale["index_used"].items():
        lines.append(f"| plan: {name} | | {'yes' if used else 'NO'} |")
    return "\n".join(lines) + "\n"


def _step_rows(steps: dict, baseline: dict, how: str) -> list[dict]:
    """The floor's row and each effect's, measured ``how``."""
    base = baseline["steps_per_second"]
    rows = [
        {
            "figure": f"{'step baseline' if how else 'durable step baseline'} "
            f"(psycopg{how}; rounds {_spread(baseline['rounds'])})",
            "value": f"{base:.0f} steps/s",
            "baseline": f"{baseline['commits_per_second']:.0f} one-row commits/s"
            + (" (the disk's flush today)" if not how else " (no flush waited for)"),
        },
    ]
    one = baseline["one_statement"]
    rows.append(
        {
            "figure": f"the same step in one statement (psycopg{how}, a CTE as ours; "
            f"rounds {_spread(one['rounds'])})",
            "value": f"{one['steps_per_second']:.0f} steps/s",
        }
    )
    for tool, label in [
        ("noop_read", "read step"),
        ("noop_idempotent_write", "idempotent write step"),
        ("noop_non_idempotent_write", "non-idempotent write step"),
    ]:
        rate = steps[tool]["steps_per_second"]
        one_ratio = rate / one["steps_per_second"]
        rows.append(
            {
                "figure": f"{label}{how} ({steps[tool]['statements_per_step']:.1f} "
                f"statements/step, {steps[tool]['flushes_per_step']:.1f} waiting for the flush; "
                f"rounds {_spread(steps[tool]['rounds'])} steps/s, "
                f"ratio {_spread(steps[tool]['ratio_rounds'])}; {one_ratio:.2f} of the "
                f"one-statement step, rounds {_spread(steps[tool]['one_statement_ratio_rounds'])})",
                "value": f"{rate:.0f} steps/s",
                "baseline": f"{base:.0f} steps/s",
                "ratio": rate / base,
                "target": TARGETS[f"{label} / baseline"],
            }
        )
    return rows


def _resume_rows(resume: dict) -> list[dict]:
    replayed = resume["replayed_steps"]
    by_size = ", ".join(
        f"{count} at {steps} replayed"
        for steps, count in sorted(
            resume["statements_per_resumed_attempt_by_replayed_steps"].items()
        )
    )
    return [
        {
            "figure": f"resume a {resume['live_steps']}-step run ({replayed} steps replayed): "
            f"resumed attempt / live run (median of rounds {resume['rounds']})",
            "value": f"{resume['resumed_seconds'] * 1000:.1f} ms "
            f"({resume['resumed_ms_per_replayed_step'] * 1000:.0f} µs/replayed step)",
            "baseline": f"{resume['live_seconds'] * 1000:.1f} ms live "
            f"({resume['live_steps_per_second']:.0f} steps/s)",
            "ratio": resume["ratio"],
            "at_most": AT_MOST["resumed attempt / live run"],
        },
        {
            "figure": f"statements per resumed attempt ({by_size}), next to statements "
            "per live step",
            "value": f"{resume['statements_per_resumed_attempt']} statements",
            "baseline": f"{resume['statements_per_live_step']:.2f} statements/live step",
        },
    ]


def _part(name: str) -> None:
    """Say which part runs: the bench takes minutes."""
    print(f"bench: {name}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--output", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--database", default="nrllm_bench")
    parser.add_argument(
        "--only",
        choices=["steps", "peer", "queue", "resume", "latency"],
        help="measure only these figures and print them (results files untouched)",
    )
    args = parser.parse_args(argv)
    size = SIZES["smoke" if args.smoke else "full"]

    base_url = os.environ["NRLLM_TEST_DATABASE_URL"]
    redis_url = f"{os.environ['NRLLM_TEST_REDIS_URL']}/{15 if args.smoke else 0}"
    worker_env = _configure(_fresh_database(base_url, args.database), redis_url)

    import django

    django.setup()
    from django.core.management import call_command

    from bench import scale
    from bench.measuring import commits_not_waiting_for_the_flush
    from bench.model_latency import latency_rows, model_latency_figures
    from bench.peer import peer_figures
    from bench.recovery import recovery_after_sigkill, recovery_row
    from bench.resume import resume_figures
    from bench.steps import step_figures
    from bench.through_the_queue import through_the_queue

    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    if args.only == "queue":
        from django.conf import settings

        settings.REDIS_URL = redis_url
        queue = through_the_queue(size["queue_runs"], size["queue_rounds"], worker_env)
        print(json.dumps(queue, indent=2))
        return 0
    if args.only == "latency":
        from django.conf import settings

        settings.REDIS_URL = redis_url
        figures = model_latency_figures(
            worker_env,
            size["latency_processes"],
            size["latency_concurrent"],
            size["latency_workloads"],
        )
        recovery = recovery_after_sigkill(
            worker_env,
            size["recovery_runs"],
            overrides=size["recovery_overrides"],
            model_seconds=size["recovery_model_seconds"],
        )
        print(json.dumps({"latency": figures, "recovery": recovery}, indent=2))
        return 0
    if args.only == "resume":
        resume = resume_figures(size["steps"], size["step_rounds"])
        print(json.dumps(resume, indent=2))
        return 0
    if args.only == "peer":
        peer = peer_figures(base_url, size, args.database)
        print(json.dumps(peer, indent=2))
        return 0
    _part("the step figures, commits waiting for the flush")
    steps, baseline = step_figures(size["steps"], size["step_rounds"])
    _part("the step figures, the database's commits not waiting for the flush")
    with commits_not_waiting_for_the_flush():
        flushless = step_figures(size["steps"], size["flushless_rounds"])
    if args.only == "steps":
        print(json.dumps({"steps": steps, "baseline": baseline, "flushless": flushless}, indent=2))
        return 0
    _part("DBOS Transact, the peer")
    peer = peer_figures(base_url, size, args.database)
    # In-process, as the step figures: before runs go to Redis below.
    _part("resume")
    resume = resume_figures(size["steps"], size["step_rounds"])

    from django.conf import settings

    # From here on runs are dispatched to Redis, as in production: the
    # reaper's requeues must not execute in this process.
    settings.REDIS_URL = redis_url
    _part("through the queue")
    queue = through_the_queue(size["queue_runs"], size["queue_rounds"], worker_env)
    # SimpleWorker's again with no commit waiting for the flush: how close the
    # runs come to bare RQ where the disk is not what limits them.
    with commits_not_waiting_for_the_flush():
        flushless_queue = through_the_queue(
            size["queue_runs"], size["flushless_rounds"], worker_env, (SIMPLE_WORKER,)
        )
    _part("runs waiting on a model")
    latency = model_latency_figures(
        worker_env,
        size["latency_processes"],
        size["latency_concurrent"],
        size["latency_workloads"],
    )
    _part("recovery after a SIGKILL, shipped defaults")
    recovery = recovery_after_sigkill(
        worker_env,
        size["recovery_runs"],
        overrides=size["recovery_overrides"],
        model_seconds=size["recovery_model_seconds"],
    )
    _part("the pages at scale")
    at_scale = scale.at_scale(size["scale_runs"], size["steps_per_run"])

    table = _step_rows(steps, baseline, "")
    table += _step_rows(
        *flushless,
        ", the database's commits not waiting for the flush (ours that must, still do)",
    )
    table += _resume_rows(resume)
    for worker_class, figure in queue["worker_classes"].items():
        table.append(
            {
                "figure": f"through the queue, 2 rqworkers ({worker_class}), "
                f"{figure['runs']} one-step runs (median of rounds {figure['rounds']})",
                "value": f"{figure['runs_per_second']:.1f} runs/s",
                "baseline": f"{figure['bare_rq_jobs_per_second']:.1f} bare RQ jobs/s",
                "ratio": figure["ratio"],
                "target": TARGETS.get(f"queue runs / bare RQ ({worker_class})"),
            }
        )
        floor = figure["floor"]
        table.append(
            {
                "figure": f"the same runs ({worker_class}) next to RQ jobs making their two "
                f"commits and nothing else (median of rounds {figure['floor_rounds']})",
                "value": f"{floor['runs_per_second']:.1f} runs/s",
                "baseline": f"{floor['floor_jobs_per_second']:.1f} floor jobs/s",
                "ratio": floor["ratio_to_floor"],
            }
        )
    figure = flushless_queue["worker_classes"][SIMPLE_WORKER]
    table.append(
        {
            "figure": f"the same runs ({SIMPLE_WORKER}), no commit waiting for the flush "
            f"(median of rounds {figure['rounds']}; {figure['floor']['ratio_to_floor']:.2f} "
            f"of the floor jobs, rounds {figure['floor_rounds']})",
            "value": f"{figure['runs_per_second']:.1f} runs/s",
            "baseline": f"{figure['bare_rq_jobs_per_second']:.1f} bare RQ jobs/s",
            "ratio": figure["ratio"],
        }
    )
    table += latency_rows(latency)
    table.append(recovery_row(recovery))
    table.append(
        {
            "figure": "worker peak RSS",
            "value": f"{queue['worker_peak_rss_mb']:.0f} MB",
            "at_most": f"{AT_MOST['worker peak RSS (MB)']} MB",
        }
    )
    table.append(
        {
            "figure": f"10-step no-op runs, {peer['ours']['runs']} in a row, "
            f"vs DBOS Transact {peer['dbos']['dbos_version']} workflows "
            "(ours: 2 of 12 statements per run wait for the flush, the run's creation "
            "and its settle, since model turns and reads do not, G12; DBOS commits as "
            "the server's default has it, waiting) "
            f"(median of rounds {peer['rounds']})",
            "value": f"{peer['ours']['steps_per_second']:.0f} steps/s",
            "baseline": f"{peer['dbos']['steps_per_second']:.0f} DBOS steps/s",
            "ratio": peer["ratio"],
            "target": TARGETS["ours / DBOS Transact"],
        }
    )
    flushless_peer = peer["not_waiting_for_the_flush"]
    table.append(
        {
            "figure": "the same, the database's default not waiting for the flush (DBOS's "
            "commits none; ours the run's creation and settle still, G12) "
            f"(median of rounds {flushless_peer['rounds']})",
            "value": f"{flushless_peer['ours']['steps_per_second']:.0f} steps/s",
            "baseline": f"{flushless_peer['dbos']['steps_per_second']:.0f} DBOS steps/s",
            "ratio": flushless_peer["ratio"],
        }
    )
    results = {
        "mode": "smoke" if args.smoke else "full",
        "seconds": time.perf_counter() - started,
        "step_overhead": steps,
        "durable_baseline": baseline,
        "step_overhead_not_waiting_for_the_flush": flushless[0],
        "baseline_not_waiting_for_the_flush": flushless[1],
        "peer": peer,
        "resume": resume,
        "through_the_queue": queue,
        "through_the_queue_not_waiting_for_the_flush": flushless_queue,
        "waiting_on_a_model": latency,
        "recovery_after_sigkill": recovery,
        "at_scale": at_scale,
        "table": table,
    }
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    (output / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (output / "results.md").write_text(_markdown(results))
    print(_markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
