"""A write whose record, or the fence before it, the database lost after the
write ran (G6, G12, G13): the attempt knows the write ran, the database no
longer shows it, and a retry would resume before it and could send it
again. The run is dead-lettered ``write_interrupted`` with the call
standing on its fence, as the attempt knew it — never retried.

The database loses the fence's commit, which waited for the flush, the way
a failover to a replica that lagged loses it: the server is replaced, on
its address, by a copy of itself taken (``pg_basebackup``) after the run
was claimed and before its model turn asked for the write.
"""

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest

from tests.drifting_model import request_for
from tests.harness import postgres_server
from tests.helpers import manage, wait_until
from tests.processes import paused

pytestmark = pytest.mark.worker

TOOLS = {
    "non_idempotent_write": "tests.tools_for_tests.WriteBeforeFailover",
    "idempotent_write": "tests.tools_for_tests.IdempotentWriteBeforeFailover",
}
NAMES = {
    "non_idempotent_write": "write_before_failover",
    "idempotent_write": "idempotent_write_before_failover",
}

#: What an operator is told of a requeue and a restart of the run.
VERDICTS = """
from runs.models import AgentRun
from runs.operators.requeue_safety import requeue_safety, restart_safety
run = AgentRun.objects.get(pk="{run_id}")
print(requeue_safety(run).code, restart_safety(run).code)
"""


def _pg_bin(name: str) -> str:
    (found,) = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))[-1:]
    return str(found)


def _as_postgres() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def _snapshot(port: int, into: Path) -> None:
    """A copy of the server as it is now, startable on its own (a replica
    that stops receiving here)."""
    done = subprocess.run(
        [*_as_postgres(), _pg_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(port)]
        + ["-U", "postgres", "-D", str(into), "-X", "stream", "-c", "fast"],
        capture_output=True,
        text=True,
        cwd="/tmp",
    )
    assert done.returncode == 0, done.stderr


def _accepts(url: str) -> bool:
    try:
        psycopg.connect(url).close()
    except psycopg.OperationalError:  # still recovering
        return False
    return True


def _run(url: str, run_id: str) -> dict:
    with psycopg.connect(url) as conn:
        status, reason, fence, call = conn.execute(
            "SELECT status, termination_reason, pending_effect, pending_call"
            " FROM runs_agentrun WHERE id = %s",
            [run_id],
        ).fetchone()
        letters = conn.execute(
            "SELECT reason FROM runs_deadletter WHERE run_id = %s", [run_id]
        ).fetchall()
    return {
        "status": status,
        "reason": reason,
        "fence": fence,
        "call": call,
        "dead_letters": [letter for (letter,) in letters],
    }


# Each effect once, and each provider once: a failover costs a dozen seconds.
@pytest.mark.parametrize(
    ("model", "effect"),
    [("scripted", "non_idempotent_write"), ("drifting", "idempotent_write")],
    indirect=["model"],
)
def test_a_write_whose_fence_a_failover_lost_is_dead_lettered_in_doubt_never_retried(
    model, effect, workers, worker_env, tmp_path
):
    """Whatever the write's effect: an idempotent write whose turn is gone
    cannot run again with its key (the model, asked again, words it
    otherwise), so an operator reconciles it before a requeue."""
    tool, name = TOOLS[effect], NAMES[effect]
    workdir = Path(tempfile.mkdtemp(prefix="nrllm-failover-"))
    workdir.chmod(0o755)
    server = postgres_server(workdir)
    with server:
        url = f"postgres://postgres@127.0.0.1:{server.port}/postgres"
        writes, failed_over = tmp_path / "writes", tmp_path / "failed-over"
        env = {
            **worker_env,
            "DJANGO_SETTINGS_MODULE": "nrllm_ops.settings",
            "SECRET_KEY": "tests-only-secret-key",
            "DATABASE_URL": url,
            "NRLLM_TOOLS": tool,
            "NRLLM_OPENAI_API_KEY": "sk-test-not-a-real-key",
        }
        done = manage("migrate", "--verbosity=0", env=env)
        assert done.returncode == 0, done.stderr
        write = {"name": name, "arguments": {"to": "ops {take}"}}
        # The model takes 2 s to ask for the write, the worker stopped
        # meanwhile for the snapshot.
        plan = [{"calls": [write], "delay_seconds": 2}, {"answer": "done {take}"}]
        kind = "drifting" if model else "scripted"
        request = request_for(kind, plan, [name])
        done = manage("enqueue_run", "-", env=env, stdin=json.dumps(request))
        assert done.returncode == 0, done.stderr
        run_id = done.stdout.strip()
        worker = workers.start(
            burst=True,
            DATABASE_URL=url,
            NRLLM_TOOLS=tool,
            NRLLM_RETRY_BACKOFF_SECONDS=0,
            NRLLM_TEST_WRITES_FILE=str(writes),
            NRLLM_TEST_FAILOVER_DONE=str(failed_over),
        )
        wait_until(lambda: _run(url, run_id)["status"] == "running", what="the claim")
        datadir = Path(server.datadir)
        replica = datadir.parent / "replica"  # where the server's user may write
        with paused(worker):
            _snapshot(server.port, replica)
        wait_until(writes.exists, timeout=60, what="the write")

        # The failover: the server's place is taken by the copy, which has
        # the claim but neither the turn that asked for the write nor its fence.
        server.stop()
        shutil.move(datadir, datadir.parent / "lost-primary")
        shutil.move(replica, datadir)
        server.start()
        wait_until(lambda: _accepts(url), what="the copy to take connections")
        assert _run(url, run_id)["fence"] == ""
        failed_over.touch()

        output, _ = worker.communicate(timeout=120)
        assert worker.returncode == 0, output.decode()
        ended = _run(url, run_id)
        # One write, never repeated: not by a retry, not asked of the model again.
        (sent,) = [json.loads(line) for line in writes.read_text().splitlines()]
        assert ended == {
            "status": "failed",
            "reason": "write_interrupted",
            "fence": effect,
            "call": {
                "tool": name,
                "arguments": {"to": sent["to"]},
                "idempotency_key": sent["key"],
            },
            "dead_letters": ["write_interrupted"],
        }, output.decode()[-3000:]
        if model:
            assert model.requests_by_turn == {0: 1}, model.requests_by_turn
        done = manage("shell", "-c", VERDICTS.format(run_id=run_id), env=env)
        requeue, restart = done.stdout.splitlines()[-1].split()
        assert requeue == "write_in_doubt", done.stderr
        # A restart replays nothing and repeats idempotent writes by design
        # (G10): only a non-idempotent write in doubt stops it.
        assert restart == ("write_in_doubt" if effect == "non_idempotent_write" else "safe")
