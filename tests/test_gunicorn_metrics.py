"""Prometheus' multiprocess directory under a real gunicorn: the master folds
the files of every web worker it replaces, so the directory stays bounded and
the totals stay right."""

import socket
import subprocess
import sys
import time

import httpx
import pytest
from django.contrib.auth.models import Permission

from runs.models import AgentRun
from tests.conftest import ROOT
from tests.helpers import answer, collected, scripted

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 8


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_serving(base: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert server.poll() is None, server.communicate()[0].decode()[-3000:]
        try:
            if httpx.get(f"{base}/healthz").status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError("gunicorn did not start serving")


def test_gunicorn_folds_the_metric_files_of_the_workers_it_replaces(
    worker_env, operator, api_token, tmp_path
):
    operator.user_permissions.add(Permission.objects.get(codename="add_agentrun"))
    token = api_token(operator)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--config",
            "python:nrllm_ops.gunicorn_conf",
            "--workers",
            "2",
            # Every worker is replaced after two requests: many exit meanwhile.
            "--max-requests",
            "2",
            "--bind",
            f"127.0.0.1:{port}",
            "nrllm_ops.wsgi",
        ],
        cwd=ROOT,
        env={
            **worker_env,
            # Without Redis a run executes in the web worker that created it,
            # so each one counts its steps in that worker's files.
            "REDIS_URL": "",
            "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
            "NRLLM_METRICS_TOKEN": "t",
            "ALLOWED_HOSTS": "127.0.0.1",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_until_serving(base, server)
        for _ in range(RUNS):
            response = httpx.post(
                f"{base}/api/runs/",
                json=scripted(answer("x")),
                headers={"Authorization": token},
            )
            assert response.status_code == 201, response.text
        scraped = httpx.get(f"{base}/metrics", headers={"Authorization": "Bearer t"}).text
        assert f'nrllm_steps_total{{effect="none",kind="llm"}} {RUNS}.0' in scraped
    finally:
        server.terminate()  # a graceful stop: the master reaps its last workers
        output, _ = server.communicate(timeout=60)
    assert server.returncode == 0, output.decode()[-3000:]
    assert "not folded" not in output.decode()
    # Every worker has exited and been folded: no process's own file is left.
    left = sorted(path.name for path in tmp_path.glob("*.db"))
    assert "counter_folded.db" in left
    assert [name for name in left if not name.endswith("_folded.db")] == []
    assert AgentRun.objects.filter(status="completed").count() == RUNS
    totals = collected(tmp_path)
    assert totals[("nrllm_steps_total", (("effect", "none"), ("kind", "llm")))] == RUNS
    assert totals[("nrllm_steps_total", (("effect", "none"), ("kind", "request")))] == RUNS
