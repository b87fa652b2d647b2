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
        "fairness": (1000, 10),
        "queue_rounds": 3,
        "queue_workers": 2,
        "scale_runs": 1_000_000,
        "steps_per_run": 10,
        "latency_processes": 20,
        # (model latency, runs per slot): 5 per slot at 1 s, 3 at 5 s.
        "latency_workloads": [(1.0, 5), (5.0, 3)],
        # runs.worker.ConcurrentWorker in steady state (#52): (runs in flight,
        # model latency) on 2 processes, each window whole run lengths (2 L),
        # at least three and 30 s: 60 s, 240 s, 30 s and 120 s, the four rows
        # some 12 min. The 40 s row asks for the 1,000 row's 50 runs a second
        # with 4,000 in flight: what the runs in flight cost, apart from
        # what the host's CPU can give (the 200 and 20 s rows ask for 100 a
        # second). Those two, whose worker CPU per run the targets set
        # against each other, are measured last and back to back: the
        # host's speed drifts from minute to minute (its fixed loop 100 ms
        # in the one and 203 ms in the other, once, with the 1,000 row
        # between them), and both see a database that the rows before them
        # filled and emptied. The table sorts the rows.
        "steady": {
            "rows": [(1000, 10.0), (4000, 40.0), (200, 1.0), (4000, 20.0)],
            "processes": 2,
            "window_at_least": 30,
        },
        "recovery_runs": 20,
        "recovery_overrides": None,
        "recovery_model_seconds": 60,
        # (processes, runs in flight each, the model's limit a minute, runs).
        "rate_limited": (2, 100, 3000, 1500),
    },
    "smoke": {
        "steps": 40,
        "step_rounds": 1,
        "flushless_rounds": 1,
        "peer_workflows": 5,
        "peer_rounds": 1,
        "queue_runs": 40,
        "fairness": (40, 4),
        "queue_rounds": 1,
        "queue_workers": 1,
        "scale_runs": 2000,
        "steps_per_run": 10,
        "latency_processes": 1,
        "latency_workloads": [(0.2, 2)],
        "steady": {"rows": [(8, 0.3)], "processes": 2, "window_at_least": 3},
        "recovery_runs": 2,
        "recovery_overrides": {"NRLLM_LEASE_SECONDS": "2", "NRLLM_REAPER_INTERVAL_SECONDS": "1"},
        "recovery_model_seconds": 6,
        "rate_limited": (1, 4, 600, 20),
    },
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


def _part(name: str) -> None:
    """Say which part runs: the bench takes minutes."""
    print(f"bench: {name}", file=sys.stderr, flush=True)


def _steady_rows(text: str) -> list[tuple[int, float]]:
    """``4000x20,200x1`` as ``[(4000, 20.0), (200, 1.0)]``; runs in flight and
    latency both above zero."""
    try:
        rows = [
            (int(in_flight), float(latency))
            for in_flight, latency in (row.split("x") for row in text.split(","))
        ]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not IN_FLIGHTxLATENCY rows: {text!r}") from None
    if any(in_flight < 1 or not latency > 0 for in_flight, latency in rows):
        raise argparse.ArgumentTypeError(f"runs in flight and latency above zero: {text!r}")
    if len(set(rows)) < len(rows):
        # The results keep a figure per row: a second would stand beside the first.
        raise argparse.ArgumentTypeError(f"a row given twice: {text!r}")
    return rows


def _merge_steady_state(output: Path, steady: list[dict]) -> None:
    """The results files with ``steady``'s figures in place of those of the
    same row (runs in flight and latency) and the others kept, in order,
    the new rows after them; the table's steady-state rows made again from
    them where they were (at the end if there were none), every other row
    kept: one row measured again without the whole bench's hour."""
    from bench.table import STEADY_STATE_ROWS, markdown, steady_state_rows

    results = json.loads((output / "results.json").read_text())

    def row_of(figure: dict) -> tuple:
        return figure["in_flight"], figure["latency_seconds"]

    measured = {row_of(figure): figure for figure in steady}
    kept = [figure for figure in results.get("steady_state", []) if row_of(figure) not in measured]
    # In the order the figures had (sort is stable: new rows after them,
    # in the order measured).
    order = [row_of(figure) for figure in results.get("steady_state", [])]
    merged = sorted(
        kept + steady,
        key=lambda figure: order.index(row_of(figure)) if row_of(figure) in order else len(order),
    )
    table = results["table"]
    at = {index for index, row in enumerate(table) if row["figure"].startswith(STEADY_STATE_ROWS)}
    first = min(at) if at else len(table)
    others = [row for index, row in enumerate(table) if index not in at]
    results["table"] = others[:first] + steady_state_rows(merged) + others[first:]
    results["steady_state"] = merged
    (output / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (output / "results.md").write_text(markdown(results))


def _refuse_merge_into_other_results(output: Path, mode: str) -> str | None:
    """Why ``--merge`` may not write into ``output``'s results files (none
    there, or another size's: the smoke's rows must never land in the full
    bench's), or None."""
    path = output / "results.json"
    if not path.exists():
        return f"--merge: no {path} to merge into (run the whole bench first)"
    measured_as = json.loads(path.read_text()).get("mode")
    if measured_as != mode:
        return f"--merge: {path} holds the {measured_as} bench's results, not the {mode}'s"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--output", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--database", default="nrllm_bench")
    parser.add_argument(
        "--only",
        choices=[
            "steps",
            "peer",
            "queue",
            "resume",
            "latency",
            "scale",
            "rate_limited",
            "fairness",
            "steady",
        ],
        help="measure only these figures and print them (results files untouched)",
    )
    parser.add_argument(
        "--rows",
        type=_steady_rows,
        help="with --only steady: the rows, each IN_FLIGHTxLATENCY, comma-separated (4000x20)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="with --only steady: its rows replace the steady-state rows of the results "
        "files, the rest of them kept",
    )
    args = parser.parse_args(argv)
    if (args.merge or args.rows) and args.only != "steady":
        parser.error("--rows and --merge go with --only steady")
    if args.merge and (
        why := _refuse_merge_into_other_results(
            Path(args.output), "smoke" if args.smoke else "full"
        )
    ):
        parser.error(why)
    size = SIZES["smoke" if args.smoke else "full"]
    if args.rows:
        size = {**size, "steady": {**size["steady"], "rows": args.rows}}

    base_url = os.environ["NRLLM_TEST_DATABASE_URL"]
    redis_url = f"{os.environ['NRLLM_TEST_REDIS_URL']}/{15 if args.smoke else 0}"
    worker_env = _configure(_fresh_database(base_url, args.database), redis_url)

    import django

    django.setup()
    from django.core.management import call_command

    from bench import scale
    from bench.measuring import commits_not_waiting_for_the_flush
    from bench.model_latency import model_latency_figures
    from bench.peer import peer_figures
    from bench.rate_limited import rate_limited_figure, rate_limited_rows
    from bench.recovery import recovery_after_sigkill
    from bench.resume import resume_figures
    from bench.steady_state import steady_state_figures
    from bench.steps import step_figures
    from bench.table import SIMPLE_WORKER, markdown, results_table
    from bench.team_fairness import team_fairness, team_fairness_rows
    from bench.through_the_queue import through_the_queue

    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    if args.only == "queue":
        from django.conf import settings

        settings.REDIS_URL = redis_url
        queue = through_the_queue(
            size["queue_runs"], size["queue_rounds"], worker_env, workers=size["queue_workers"]
        )
        print(json.dumps(queue, indent=2))
        return 0
    if args.only == "fairness":
        from django.conf import settings

        settings.REDIS_URL = redis_url
        fairness = team_fairness(*size["fairness"], worker_env, workers=size["queue_workers"])
        print(json.dumps(fairness, indent=2))
        return 0
    if args.only == "latency":
        from django.conf import settings

        settings.REDIS_URL = redis_url
        figures = model_latency_figures(
            worker_env, size["latency_processes"], size["latency_workloads"]
        )
        recovery = recovery_after_sigkill(
            worker_env,
            size["recovery_runs"],
            overrides=size["recovery_overrides"],
            model_seconds=size["recovery_model_seconds"],
        )
        print(json.dumps({"latency": figures, "recovery": recovery}, indent=2))
        return 0
    if args.only == "steady":
        from django.conf import settings

        settings.REDIS_URL = redis_url
        steady = steady_state_figures(worker_env, **size["steady"])
        print(json.dumps(steady, indent=2, default=str))
        if args.merge:
            _merge_steady_state(Path(args.output), steady)
        return 0
    if args.only == "rate_limited":
        from django.conf import settings

        settings.REDIS_URL = redis_url
        figure = rate_limited_figure(worker_env, *size["rate_limited"])
        print(json.dumps(figure, indent=2))
        return 0
    if args.only == "scale":
        from django.conf import settings

        settings.REDIS_URL = redis_url
        figures = scale.at_scale(size["scale_runs"], size["steps_per_run"])
        print(json.dumps({**figures, "plans": None}, indent=2))
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
    queue = through_the_queue(
        size["queue_runs"], size["queue_rounds"], worker_env, workers=size["queue_workers"]
    )
    # SimpleWorker's again with no commit waiting for the flush: how close the
    # runs come to bare RQ where the disk is not what limits them.
    with commits_not_waiting_for_the_flush():
        flushless_queue = through_the_queue(
            size["queue_runs"],
            size["flushless_rounds"],
            worker_env,
            (SIMPLE_WORKER,),
            workers=size["queue_workers"],
        )
    _part("fairness across teams")
    fairness = team_fairness(*size["fairness"], worker_env, workers=size["queue_workers"])
    _part("runs waiting on a model")
    latency = model_latency_figures(
        worker_env, size["latency_processes"], size["latency_workloads"]
    )
    _part("the concurrent worker in steady state")
    steady = steady_state_figures(worker_env, **size["steady"])
    _part("recovery after a SIGKILL, shipped defaults")
    recovery = recovery_after_sigkill(
        worker_env,
        size["recovery_runs"],
        overrides=size["recovery_overrides"],
        model_seconds=size["recovery_model_seconds"],
    )
    _part("runs under a provider's rate limit")
    rate_limited = rate_limited_figure(worker_env, *size["rate_limited"])
    _part("the pages at scale")
    at_scale = scale.at_scale(size["scale_runs"], size["steps_per_run"])

    table = (
        results_table(
            steps,
            baseline,
            flushless,
            resume,
            queue,
            flushless_queue,
            latency,
            steady,
            recovery,
            peer,
        )
        + rate_limited_rows(rate_limited)
        + team_fairness_rows(fairness)
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
        "steady_state": steady,
        "recovery_after_sigkill": recovery,
        "under_a_provider_limit": rate_limited,
        "fairness_across_teams": fairness,
        "at_scale": at_scale,
        "table": table,
    }
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    (output / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (output / "results.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
