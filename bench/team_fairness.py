"""The fairness figure (G22): one team's backlog and another team's few
runs, drained by the same rqworkers as the backlog alone. Reported: how
long the few waited for their last start, how many of the backlog's runs
started before it, and the throughput of the two teams' runs against the
one team's alone (the teams' queues taken in turn must cost next to
nothing)."""

import subprocess
import sys

from django.conf import settings
from django.db import transaction

from bench.measuring import ROOT

WORKER = {"NRLLM_WORKER_CLASS": "runs.worker.ConcurrentWorker", "NRLLM_WORKER_CONCURRENCY": "20"}


def team_fairness(backlog: int, few: int, worker_env: dict, workers: int = 2) -> dict:
    from runs.models import AgentRun
    from teams.models import Team

    alpha, _ = Team.objects.get_or_create(slug="bench-alpha", defaults={"name": "bench alpha"})
    bravo, _ = Team.objects.get_or_create(slug="bench-bravo", defaults={"name": "bench bravo"})
    alone = _round({alpha: backlog + few}, worker_env, workers)
    shared = _round({alpha: backlog, bravo: few}, worker_env, workers)
    runs = AgentRun.objects.filter(prompt=shared["prompt"])
    last_bravo = max(runs.filter(team=bravo).values_list("started_at", flat=True))
    first = min(runs.values_list("started_at", flat=True))
    return {
        "backlog": backlog,
        "few": few,
        "workers": workers,
        "few_last_start_seconds": (last_bravo - first).total_seconds(),
        "backlog_started_before": runs.filter(team=alpha, started_at__lt=last_bravo).count(),
        "alone_runs_per_second": alone["runs_per_second"],
        "shared_runs_per_second": shared["runs_per_second"],
        "ratio": shared["runs_per_second"] / alone["runs_per_second"],
    }


def _round(per_team: dict, worker_env: dict, workers: int) -> dict:
    """Enqueue each team's runs, the first team's first, then drain them
    with burst workers; runs per second from the first start to the last end."""
    from runs.models import AgentRun
    from runs.queue.dispatch import run_queue
    from runs.runtime import enqueue

    run_queue().connection.flushdb()
    prompt = f"fairness {'+'.join(team.slug for team in per_team)} {len(AgentRun.objects.all())}"
    request = {"prompt": prompt, "provider": {"kind": "scripted", "turns": [{"content": "ok"}]}}
    with transaction.atomic():  # one commit; the jobs go out after it, in order
        for team, count in per_team.items():
            for _ in range(count):
                enqueue(request, team=team)
    processes = [
        subprocess.Popen(
            [sys.executable, "manage.py", "rqworker", "--burst", settings.NRLLM_QUEUE_NAME],
            cwd=ROOT,
            env={**worker_env, **WORKER},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(workers)
    ]
    for process in processes:
        process.wait(timeout=600)
    runs = AgentRun.objects.filter(prompt=prompt)
    assert not runs.exclude(status="completed").exists(), "a run did not complete"
    first = min(runs.values_list("started_at", flat=True))
    last = max(runs.values_list("finished_at", flat=True))
    return {"prompt": prompt, "runs_per_second": runs.count() / (last - first).total_seconds()}


#: The teams' queues taken in turn against one team's alone (issue #49).
TARGET = 0.95


def team_fairness_rows(figure: dict) -> list[dict]:
    """The results table's row: the few runs' wait, and the throughput."""
    return [
        {
            "figure": f"fairness: team A's {figure['backlog']:,} one-step runs enqueued, then "
            f"team B's {figure['few']}, drained by {figure['workers']} rqworkers "
            f"(runs.worker.ConcurrentWorker); B's last run started "
            f"{figure['few_last_start_seconds']:.2f} s after the first start, "
            f"{figure['backlog_started_before']} of A's before it (runs/s, against "
            f"{figure['backlog'] + figure['few']:,} runs of one team)",
            "value": f"{figure['shared_runs_per_second']:.1f} runs/s",
            "baseline": f"{figure['alone_runs_per_second']:.1f} runs/s one team",
            "ratio": figure["ratio"],
            "target": TARGET,
        }
    ]
