"""Prometheus' multiprocess directory under a real gunicorn: a web worker's
metric files are folded whichever way it ends, so the directory stays bounded
and the totals stay right."""

import subprocess
import sys

import httpx
import port_for
import psutil
import pytest
from django.contrib.auth.models import Permission

from runs.models import AgentRun
from tests.conftest import ROOT
from tests.helpers import answer, collected, scripted, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 8


def _serving(base: str, server: subprocess.Popen) -> bool:
    assert server.poll() is None, server.communicate()[0].decode()[-3000:]
    try:
        return httpx.get(f"{base}/healthz").status_code == 200
    except httpx.TransportError:
        return False


def test_gunicorn_folds_the_metric_files_of_a_worker_that_was_killed(
    worker_env, operator, api_token, tmp_path
):
    """A worker that exits normally folds its own files (``fold_at_exit``);
    one killed (a timeout, the OOM killer) cannot, so the master does."""
    operator.user_permissions.add(Permission.objects.get(codename="add_agentrun"))
    token = api_token(operator)
    port = port_for.select_random()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--config",
            "python:nrllm_ops.gunicorn_conf",
            "--workers",
            "1",
            "--bind",
            f"127.0.0.1:{port}",
            "nrllm_ops.wsgi",
        ],
        cwd=ROOT,
        env={
            **worker_env,
            # Without Redis, and executed in the caller, a run executes in the
            # web worker that created it, so each one counts its steps in that
            # worker's files.
            "REDIS_URL": "",
            "NRLLM_EXECUTE_IN_CALLER": "true",
            "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
            "NRLLM_METRICS_TOKEN": "t",
            "ALLOWED_HOSTS": "127.0.0.1",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_until(lambda: _serving(base, server), timeout=30, what="gunicorn serving")
        for _ in range(RUNS):
            response = httpx.post(
                f"{base}/api/runs/",
                json=scripted(answer("x")),
                headers={"Authorization": token},
            )
            assert response.status_code == 201, response.text
        [worker] = psutil.Process(server.pid).children()
        assert (tmp_path / f"counter_{worker.pid}.db").exists()
        worker.kill()
        wait_until(
            lambda: not (tmp_path / f"counter_{worker.pid}.db").exists(),
            what="the killed worker's files folded",
        )
        # By the worker the master started instead.
        wait_until(lambda: _serving(base, server), timeout=30, what="gunicorn serving again")
        scraped = httpx.get(f"{base}/metrics", headers={"Authorization": "Bearer t"}).text
        assert f'nrllm_steps_total{{effect="none",kind="llm"}} {RUNS}.0' in scraped
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=60)
    assert server.returncode == 0, output.decode()[-3000:]
    assert "not folded" not in output.decode()
    assert AgentRun.objects.filter(status="completed").count() == RUNS
    # The replacement folded its own files as it exited: only the folds are left.
    left = sorted(path.name for path in tmp_path.glob("*.db"))
    assert "counter_folded.db" in left
    assert [name for name in left if not name.endswith("_folded.db")] == []
    totals = collected(tmp_path)
    assert totals[("nrllm_steps_total", (("effect", "none"), ("kind", "llm")))] == RUNS
    assert totals[("nrllm_steps_total", (("effect", "none"), ("kind", "request")))] == RUNS
