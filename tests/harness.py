"""Run a command (the test suite) beside a throwaway PostgreSQL and redis-server.

    python -m tests.harness python -m pytest [args]

Process management is pytest-postgresql's and pytest-redis's executors; this
module only picks free ports, makes their directories (owned by ``postgres``
when running as root, since PostgreSQL refuses root), exports
``NRLLM_TEST_DATABASE_URL`` and ``NRLLM_TEST_REDIS_URL``, and stops both
servers however the command ends.
"""

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import port_for
import psycopg
from pytest_postgresql.executors import PostgreSQLExecutor
from pytest_redis.executor import RedisExecutor

ROOT = Path(__file__).resolve().parent.parent


def postgres_server(workdir: Path, *, options: str = "") -> PostgreSQLExecutor:
    """A PostgreSQL server (not yet started) in ``workdir``, on a free port,
    with the server ``options`` (``-c name=value ...``) added."""
    pgdir = workdir / "postgresql"
    pgdir.mkdir()
    if os.geteuid() == 0:
        postgres = pwd.getpwnam("postgres")
        os.chown(pgdir, postgres.pw_uid, postgres.pw_gid)
    return PostgreSQLExecutor(
        executable=str(ROOT / "scripts" / "pg_ctl"),
        host="127.0.0.1",
        port=port_for.select_random(),
        datadir=str(pgdir / "data"),
        unixsocketdir=str(pgdir),
        logfile=str(pgdir / "server.log"),
        startparams="-w",
        dbname="nrllm",
        user="postgres",
        # Tests start several worker processes per xdist worker. The bench
        # measures durable commits: it turns fsync back on (pg_ctl's -F is off).
        postgres_options="-c max_connections=200"
        + (
            " -c fsync=on -c synchronous_commit=on"
            if os.environ.get("NRLLM_HARNESS_DURABLE")
            else ""
        )
        + f" {options}",
    )


@contextlib.contextmanager
def transaction_pooler(workdir: Path, server_port: int):
    """PgBouncer in transaction mode in front of the PostgreSQL server on
    ``server_port``, as a deployment behind a pooler runs: each transaction
    may get another server connection, and a server crash does not break
    the client's. Yields its URL for the ``postgres`` database."""
    executable = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    if executable is None:
        sys.exit("tests.harness: pgbouncer not found; run scripts/install-system-deps")
    pooler_dir = workdir / "pgbouncer"
    pooler_dir.mkdir()
    port = port_for.select_random()
    (pooler_dir / "users.txt").write_text('"postgres" ""\n')
    (pooler_dir / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"postgres = host=127.0.0.1 port={server_port} dbname=postgres user=postgres\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\n"
        f"auth_type = trust\nauth_file = {pooler_dir}/users.txt\n"
        "pool_mode = transaction\nunix_socket_dir =\n"
        f"logfile = {pooler_dir}/pgbouncer.log\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        "max_client_conn = 200\ndefault_pool_size = 20\n"
        # A login refused while the server recovers from a crash is tried
        # again after this many seconds (15 by default: a test behind the
        # pooler then waited 15 s, or not, as the crash's timing fell).
        "server_login_retry = 1\n"
    )
    # PgBouncer refuses to run as root.
    as_postgres = {}
    if os.geteuid() == 0:
        postgres = pwd.getpwnam("postgres")
        for path in (pooler_dir, *pooler_dir.iterdir()):
            os.chown(path, postgres.pw_uid, postgres.pw_gid)
        as_postgres = {"user": postgres.pw_uid}
    # Its log is in pgbouncer.log (quiet=1 keeps it off stderr).
    process = subprocess.Popen(
        [executable, "--quiet", str(pooler_dir / "pgbouncer.ini")], **as_postgres
    )
    url = f"postgres://postgres@127.0.0.1:{port}/postgres"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                psycopg.connect(url, connect_timeout=2, prepare_threshold=None).close()
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline or process.poll() is not None:
                    log = pooler_dir / "pgbouncer.log"
                    said = log.read_text()[-2000:] if log.exists() else "(no log)"
                    sys.exit(f"tests.harness: pgbouncer did not start: {said}")
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def _redis(workdir: Path) -> RedisExecutor:
    redis_dir = workdir / "redis"
    redis_dir.mkdir()
    executable = shutil.which("redis-server")
    if executable is None:
        sys.exit("tests.harness: redis-server not found; run scripts/install-system-deps")
    return RedisExecutor(
        executable=executable,
        databases=32,
        redis_timeout=30,
        loglevel="warning",
        host="127.0.0.1",
        port=port_for.select_random(),
        datadir=redis_dir,
    )


def main(command: list[str]) -> int:
    if not command:
        sys.exit("usage: python -m tests.harness COMMAND [ARGS...]")
    workdir = Path(tempfile.mkdtemp(prefix="nrllm-test-"))
    workdir.chmod(0o755)
    try:
        with postgres_server(workdir) as postgres, _redis(workdir) as redis:
            env = {
                **os.environ,
                "NRLLM_TEST_DATABASE_URL": (
                    f"postgres://postgres@127.0.0.1:{postgres.port}/{postgres.dbname}"
                ),
                "NRLLM_TEST_REDIS_URL": f"redis://127.0.0.1:{redis.port}",
                # The throwaway server runs with fsync off (pg_ctl's -F) unless
                # the bench asks for a durable one: the app is told it knows.
                "NRLLM_ALLOW_NON_DURABLE_DATABASE": os.environ.get(
                    "NRLLM_ALLOW_NON_DURABLE_DATABASE",
                    "false" if os.environ.get("NRLLM_HARNESS_DURABLE") else "true",
                ),
            }
            print(
                f"tests.harness: PostgreSQL on {postgres.port}, redis-server on {redis.port}",
                flush=True,
            )
            return subprocess.call(command, env=env, cwd=ROOT)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
