"""Driving the embedded default from outside, as `make run` runs it: a real
``manage.py embedded_worker`` process on a SQLite file, the file read and
changed directly (no Django start-up per look), and what shows that the
worker is getting on, for waits bounded by progress rather than a clock."""

import contextlib
import shlex
import signal
import sqlite3
import subprocess
import sys

from tests.helpers import ROOT
from tests.processes import WorkerProcess, cpu_seconds


def sqlite_rows(env, sql, *params) -> list[tuple]:
    """Read the SQLite file directly: no Django start-up per poll."""
    path = env["DATABASE_URL"].removeprefix("sqlite:///")
    with contextlib.closing(sqlite3.connect(path, timeout=20)) as database:
        return database.execute(sql, params).fetchall()


def sqlite_write(env, sql, *params) -> None:
    """Change the SQLite file directly (a test's fault or clock), committed."""
    path = env["DATABASE_URL"].removeprefix("sqlite:///")
    with contextlib.closing(sqlite3.connect(path, timeout=20)) as database, database:
        database.execute(sql, params)


def make_run_setup(**variables: str) -> list[list[str]]:
    """The ``manage.py`` commands `make run` runs before it serves, as the
    Makefile has them today (``make -n``: printed, not run)."""
    dry = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed", "run", f"PY={sys.executable}"]
        + [f"PYTHON={sys.executable}", *(f"{name}={value}" for name, value in variables.items())],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    prefix = f"{sys.executable} manage.py "
    return [
        shlex.split(line.removeprefix(prefix))
        for line in dry.stdout.splitlines()
        # What runs beside the server (&) serves: the set-up is what comes before.
        if line.startswith(prefix) and "&" not in line
    ]


#: A bound on what ends at once unless something is wrong (a process
#: stopping with no run in flight): generous, for a loaded host.
STOPPED_SECONDS = 120


def start_embedded_worker(env) -> WorkerProcess:
    """A real ``manage.py embedded_worker``, making a pass every 0.2 s."""
    return WorkerProcess(
        [sys.executable, "manage.py", "embedded_worker", "--interval", "0.2"],
        cwd=ROOT,
        env=env,
        text=True,
    )


@contextlib.contextmanager
def embedded_worker(env):
    """A real ``manage.py embedded_worker``; stopped with SIGTERM as `make
    run` stops it, which must end it cleanly. If the block failed, it is
    killed instead: its stop (a drain of a run still in flight) must not
    hide why."""
    process = start_embedded_worker(env)
    try:
        yield process
    except BaseException:
        process.kill()
        process.communicate(timeout=STOPPED_SECONDS)
        raise
    process.send_signal(signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=STOPPED_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    assert process.returncode == 0, output[-3000:]
    assert "runs in flight, the GIL's switch interval 100 ms)" in output
    assert "embedded worker: stopped" in output


def progress(env, *processes, model=None):
    """``progress`` for ``wait_until``: what moves while the
    embedded default works. Each process's CPU time until it has written
    its first line (Django's start is CPU-bound), then what it writes (not
    its CPU: an idle worker's passes would look like progress); the runs'
    rows; the model's requests. A loaded host moves them slowly; a stuck
    one not at all."""

    def signs():
        return (
            tuple(len(p.written()) or cpu_seconds(p) for p in processes),
            sqlite_rows(
                env, "SELECT id, status, requeue_count, step_count FROM runs_agentrun ORDER BY id"
            ),
            sum(model.requests_by_turn.values()) if model is not None else None,
        )

    return signs
