"""Prometheus' multiprocess directory: the forking worker folds each work
horse's files and every process its own as it exits, so the directory stays
bounded and the totals stay right."""

import subprocess
import sys
import threading

import pytest
from django.test import Client

from ground import metrics_files
from runs.runtime import enqueue
from tests.helpers import answer, collected, scripted

WRITER = """
from prometheus_client import Counter, Histogram
Counter("demo_total", "demo", ["kind"]).labels("a").inc({count})
Histogram("demo_seconds", "demo").observe(0.2)
"""


def write_metrics_in_a_process(path, count: int) -> int:
    """A real process writing its own multiprocess files; returns its pid."""
    script = WRITER.format(count=count) + "import os; print(os.getpid())"
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={"PROMETHEUS_MULTIPROC_DIR": str(path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return int(result.stdout.strip())


def test_folding_keeps_the_totals_and_removes_the_process_files(tmp_path):
    pids = [write_metrics_in_a_process(tmp_path, count) for count in (1, 2, 3)]
    before = collected(tmp_path)
    for pid in pids:
        metrics_files.fold_process(pid, tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.db")) == [
        "counter_folded.db",
        "histogram_folded.db",
    ]
    after = collected(tmp_path)
    assert after == pytest.approx(before)
    assert after[("demo_total", (("kind", "a"),))] == 6
    assert after[("demo_seconds_count", ())] == 3


def test_a_scrape_in_progress_holds_folding_back(tmp_path):
    pid = write_metrics_in_a_process(tmp_path, 1)
    folding = threading.Thread(target=metrics_files.fold_process, args=(pid, tmp_path))
    with metrics_files.reading_lock(tmp_path):
        folding.start()
        folding.join(timeout=0.5)
        # Still waiting for the scrape: the process's file is untouched.
        assert folding.is_alive() and (tmp_path / f"counter_{pid}.db").exists()
    folding.join(timeout=5)
    assert not (tmp_path / f"counter_{pid}.db").exists()


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "worker_class",
    ["runs.worker.ConcurrentWorker", "runs.worker.Worker", "runs.worker.SimpleWorker"],
)
def test_a_worker_leaves_only_folded_files(
    workers, queue, settings, tmp_path, monkeypatch, worker_class
):
    """The forking worker folds each work horse as it ends; a worker process
    folds its own files as it exits (with the concurrent worker and
    SimpleWorker they hold the jobs')."""
    assert (
        settings.RQ["WORKER_CLASS"] == "runs.worker.ConcurrentWorker"
    )  # the default: the first case
    runs = [enqueue(scripted(answer("x"))) for _ in range(4)]
    worker = workers.start(
        burst=True, PROMETHEUS_MULTIPROC_DIR=str(tmp_path), NRLLM_WORKER_CLASS=worker_class
    )
    output, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, output.decode()
    assert all(run.__class__.objects.get(pk=run.pk).status == "completed" for run in runs)
    left = {path.name for path in tmp_path.glob("*.db")}
    assert left == {"counter_folded.db", "histogram_folded.db", "summary_folded.db"}
    # The web process reads the same directory.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    settings.NRLLM_METRICS_TOKEN = "t"
    text = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer t").content.decode()
    assert 'nrllm_steps_total{effect="none",kind="llm"} 4.0' in text
    assert 'nrllm_steps_total{effect="none",kind="request"} 4.0' in text
