"""What ``rqworker`` runs with nothing set: the concurrent worker (G15) on a
database pool. The settings are read in processes of their own with a clean
environment; the workers are real ``rqworker`` and ``rqworker-pool``
processes against the test database and Redis."""

import json
import select
import signal
import subprocess
import sys

import psycopg
import pytest
from django.conf import settings as django_settings

from runs.models import AgentRun
from runs.runtime import enqueue
from tests.conftest import Workers
from tests.helpers import (
    ROOT,
    answer,
    call,
    scripted,
    step_inserts_held,
    wait_until,
)
from tests.processes import WorkerProcess

#: Variables that choose the worker or its connections: a test of the
#: defaults leaves them all unset.
CHOOSERS = (
    "NRLLM_WORKER_CLASS",
    "NRLLM_WORKER_CONCURRENCY",
    "DATABASE_POOL_MAX_SIZE",
    "DATABASE_CONN_MAX_AGE",
)

READ_SETTINGS = (
    "import json\n"
    "import nrllm_ops.settings as s\n"
    "pool = s.DATABASES['default']['OPTIONS'].get('pool')\n"
    "if pool:\n"
    "    pool = {**pool, 'check': pool['check'].__qualname__}\n"
    "print(json.dumps([s.RQ['WORKER_CLASS'], pool]))\n"
)


def settings_read_with(**variables) -> list:
    """The worker class and the pool settings.py gives with only
    ``variables`` set (and PATH): a process of its own."""
    result = subprocess.run(
        [sys.executable, "-c", READ_SETTINGS],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "SECRET_KEY": "defaults-test", **variables},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def test_with_nothing_set_rqworker_runs_the_concurrent_worker_on_a_pool_of_20_on_postgresql():
    assert settings_read_with(DATABASE_URL="postgres://nrllm@db.internal/nrllm") == [
        "runs.worker.ConcurrentWorker",
        {"min_size": 1, "max_size": 20, "timeout": 10, "check": "closed_by_the_server"},
    ]


def test_the_embedded_default_sqlite_gets_no_pool(tmp_path):
    assert settings_read_with() == ["runs.worker.ConcurrentWorker", None]
    assert settings_read_with(DATABASE_URL=f"sqlite:///{tmp_path / 'x.sqlite3'}")[1] is None


def test_kept_connections_or_an_explicit_0_leave_the_pool_out_and_a_contradiction_is_refused():
    from django.core.exceptions import ImproperlyConfigured

    from ground.database import database_from_url

    url = "postgres://u@db/n"
    kept = database_from_url(url, conn_max_age=600, prepared_statements=True, pool_max_size=None)
    off = database_from_url(url, conn_max_age=0, prepared_statements=True, pool_max_size=0)
    assert "pool" not in kept["OPTIONS"] and "pool" not in off["OPTIONS"]
    assert kept["CONN_MAX_AGE"] == 600
    with pytest.raises(ImproperlyConfigured, match="DATABASE_CONN_MAX_AGE exclude each other"):
        database_from_url(url, conn_max_age=600, prepared_statements=True, pool_max_size=20)
    with pytest.raises(ImproperlyConfigured, match="DATABASE_POOL_MAX_SIZE needs a PostgreSQL"):
        database_from_url(
            "sqlite:///x.db", conn_max_age=0, prepared_statements=True, pool_max_size=20
        )


@pytest.mark.django_db
def test_the_pool_lends_no_connection_the_server_closed(worker_env):
    """After a server restart every idle pooled connection is dead: the
    pool's check finds it so from its socket, with no round trip for a live
    one."""
    from ground.database import closed_by_the_server

    url = worker_env["DATABASE_URL"]
    with psycopg.connect(url, autocommit=True) as live, psycopg.connect(url) as admin:
        closed_by_the_server(live)  # nothing to read: lent as it is
        admin.execute("SELECT pg_terminate_backend(%s)", [live.info.backend_pid])
        select.select([live.fileno()], [], [], 10)  # the server's goodbye arrives
        with pytest.raises(psycopg.OperationalError):
            closed_by_the_server(live)


def default_env(worker_env) -> dict:
    return {key: value for key, value in worker_env.items() if key not in CHOOSERS}


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_real_rqworker_with_nothing_set_is_the_concurrent_worker_and_runs_its_runs(
    workers, queue, worker_env
):
    workers.env = default_env(worker_env)
    runs = [
        enqueue(scripted(call("search_notes", query="x"), answer("hi"), tools=["search_notes"]))
        for _ in range(6)
    ]
    output = workers.run_burst()
    assert "concurrent worker: up to 100 runs in flight, the GIL's switch interval 100 ms" in output
    assert {
        (run.status, run.requeue_count)
        for run in AgentRun.objects.filter(pk__in=[r.pk for r in runs])
    } == {("completed", 0)}


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_each_worker_rqworker_pool_forks_opens_a_pool_of_its_own(queue, worker_env):
    """``rqworker-pool`` asks the database whether it keeps its commits, then
    forks its workers: the pool it opened for that must not go with them. Its
    threads do not survive a fork, so a worker's pool never grows, and its
    one connection would be every worker's. Four runs held at the same
    statement each hold a connection of their own, and then complete."""
    runs = [enqueue(scripted(answer("pooled"))) for _ in range(4)]
    with step_inserts_held("NEW.kind = 'llm'") as (waiting, _):
        pool = WorkerProcess(
            [sys.executable, "manage.py", "rqworker-pool", django_settings.NRLLM_QUEUE_NAME]
            + ["--num-workers", "2", "--burst"],
            cwd=ROOT,
            env=default_env(worker_env),
            start_new_session=True,
        )
        try:
            wait_until(
                lambda: len(set(waiting())) == 4,
                what="four runs at their step, each on a connection",
            )
        except AssertionError:
            Workers.signal(pool, signal.SIGKILL)
            raise AssertionError(pool.communicate(timeout=30)[0].decode()[-3000:]) from None
    output = pool.communicate(timeout=60)[0].decode()
    assert pool.returncode == 0, output[-3000:]
    assert output.count("up to 100 runs in flight, the GIL's switch interval 100 ms") == 2, output
    assert {
        (run.status, run.requeue_count)
        for run in AgentRun.objects.filter(pk__in=[r.pk for r in runs])
    } == {("completed", 0)}
