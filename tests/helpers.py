"""Small builders and waiting helpers shared by the tests."""

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

from tests.preloaded import PreloadedPopen

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: How often a test server's loop looks whether it is to stop: ``shutdown()``
#: waits for that look, and socketserver's default (0.5 s) made each test
#: that used a server wait half a second in its teardown (160 tests: 80 s).
POLL_SECONDS = 0.01


def serve_in_a_thread(server) -> None:
    """Serve ``server`` (a socketserver) in a daemon thread; its
    ``shutdown()`` then returns within ``POLL_SECONDS``."""
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True
    ).start()


def scripted(*turns, tools=(), prompt="test prompt", max_iterations=None) -> dict:
    """A run request with the scripted provider playing ``turns``."""
    request = {
        "prompt": prompt,
        "tools": list(tools),
        "provider": {"kind": "scripted", "turns": list(turns)},
    }
    if max_iterations is not None:
        request["max_iterations"] = max_iterations
    return request


def call(name, **arguments) -> dict:
    """A scripted turn that calls one tool."""
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def answer(content="done", **extra) -> dict:
    return {"content": content, **extra}


def stored(request) -> dict:
    """A request as ``enqueue`` stores it."""
    from runs.runtime.run_request import parse_run_request

    return parse_run_request(request).as_json()


def later(seconds=3600):
    """A moment ``seconds`` from now: an ``as_of`` for the reaper past every lease."""
    from django.utils import timezone

    return timezone.now() + timedelta(seconds=seconds)


def fresh(agent_run):
    """``agent_run`` as the database holds it now."""
    from runs.models import AgentRun

    return AgentRun.objects.get(pk=agent_run.pk)


def wait_until(predicate, *, timeout=20.0, interval=0.05, what="condition", progress=None):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``.

    With ``progress`` (a callable returning a snapshot of what the processes
    awaited have done so far: ``WorkerProcess.progress``, ``run_progress``),
    ``timeout`` counts from the snapshot's last change. A wait that spans
    processes starting (a worker, its work horse, a stdio MCP server: seconds
    each on a loaded host) then fails when they stall, never because the host
    is busy, and a hang is still caught ``timeout`` after the last sign of life."""
    deadline = time.monotonic() + timeout
    seen = progress() if progress is not None else None
    while True:
        value = predicate()
        if value:
            return value
        if progress is not None and (now := progress()) != seen:
            seen, deadline = now, time.monotonic() + timeout
        if time.monotonic() > deadline:
            quiet = " with no progress" if progress is not None else ""
            raise AssertionError(f"timed out after {timeout}s{quiet} waiting for {what}")
        time.sleep(interval)


def run_progress(agent_run, *processes) -> tuple:
    """A snapshot of what ``agent_run`` and the worker ``processes`` (each a
    ``WorkerProcess``) driving it have done: the run's state and steps, and
    each process's tree and output (``wait_until``'s ``progress``)."""
    from runs.models import AgentRun

    row = AgentRun.objects.filter(pk=agent_run.pk).values_list(
        "status", "lease_token", "requeue_count"
    )
    return (*row, agent_run.steps.count(), *(process.progress() for process in processes))


def statements_running(sql: str) -> int:
    """How many backends of the test database are running ``sql`` now."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state = 'active' AND query = %s",
            [sql],
        )
        return cursor.fetchone()[0]


@contextlib.contextmanager
def rows_locked_elsewhere(queryset, *, timeout: float = 30):
    """While the block runs, another transaction (a thread of its own) holds
    the rows of ``queryset`` ``FOR UPDATE``: an operator's action or a claim
    on them, as the code under test meets it. Released as the block ends."""
    from django.db import connection, transaction

    locked, release = threading.Event(), threading.Event()

    def hold():
        try:
            with transaction.atomic():
                list(queryset.select_for_update())
                locked.set()
                release.wait(timeout)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(timeout), "the rows were not locked"
        yield
    finally:
        release.set()
        holder.join()


@contextlib.contextmanager
def cancelled_once(run_id, when, *, what="the moment to cancel"):
    """While the block runs (an attempt, say), an operator cancels ``run_id``
    from another thread as soon as ``when()`` holds; the thread is joined as
    the block ends."""
    from django.db import connection

    from runs import transitions

    def cancel():
        try:
            wait_until(when, what=what)
            transitions.cancel(run_id)
        finally:
            connection.close()

    canceller = threading.Thread(target=cancel)
    canceller.start()
    try:
        yield
    finally:
        canceller.join()


def collected(path) -> dict:
    """Every sample Prometheus' multiprocess directory ``path`` exposes:
    {(name, labels): value}."""
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess
    from prometheus_client.parser import text_string_to_metric_families

    from ground import metrics_files

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(path))
    with metrics_files.reading_lock(path):
        text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sqlite_env(database: Path, **variables: str) -> dict:
    """The environment of a ``manage.py`` process on the embedded default:
    the SQLite file ``database``, no Redis, no PostgreSQL."""
    return {
        "PATH": os.environ["PATH"],
        "DATABASE_URL": f"sqlite:///{database}",
        "SECRET_KEY": "embedded-test",
        **variables,
    }


def manage(*args: str, env: dict, stdin: str | None = None) -> subprocess.CompletedProcess:
    """``manage.py *args`` in a process of its own with ``env`` (forked from
    the preloaded interpreter where it can be: ``tests/preloaded.py``); its
    output as text."""
    command = [sys.executable, "manage.py", *args]
    with PreloadedPopen(
        command,
        cwd=ROOT,
        env=env,
        stdin=None if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            output, errors = process.communicate(stdin, timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    return subprocess.CompletedProcess(command, process.returncode, output, errors)


def step_inserts_held(condition: str, *, lock: int = 4242):
    """While active, inserting a step where ``condition`` (SQL on ``NEW``)
    holds waits for an advisory lock this test holds: a worker is stopped
    right before that step is durable. Yields ``(waiting, end_the_wait)``:
    the backends waiting, and a function that terminates them (as the
    server would once it notices their client died)."""
    from runs.models import RunStep

    return inserts_held(RunStep, condition, lock=lock)


@contextlib.contextmanager
def inserts_held(model, condition: str, *, lock: int = 4242):
    """``step_inserts_held`` for the rows of ``model``'s table (a tool's own
    write, say, which holds no lock on the run's row while it waits)."""
    from django.db import connection

    function = "nrllm_hold_step_insert"
    table = model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [lock])
        cursor.execute(
            f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger AS $$ BEGIN "
            f"PERFORM pg_advisory_lock({lock}); PERFORM pg_advisory_unlock({lock}); "
            "RETURN NEW; END $$ LANGUAGE plpgsql"
        )
        # DDL takes no parameters; the conditions are the tests' own.
        cursor.execute(
            f"CREATE TRIGGER {function} BEFORE INSERT ON {table} "
            f"FOR EACH ROW WHEN ({condition}) EXECUTE FUNCTION {function}()"
        )

    def waiting():
        with connection.cursor() as cursor:
            # This database's only: tests on other xdist workers hold the
            # same lock number in databases of their own on the same server.
            cursor.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND objid = %s AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())",
                [lock],
            )
            return [row[0] for row in cursor.fetchall()]

    def end_the_wait():
        with connection.cursor() as cursor:
            for pid in waiting():
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])

    try:
        yield waiting, end_the_wait
    finally:
        with connection.cursor() as cursor:
            # Unlocked first: a step still waiting goes in (the test let it
            # wait, not end), and the DROP does not wait on it for ever.
            cursor.execute("SELECT pg_advisory_unlock(%s)", [lock])
            cursor.execute(f"DROP TRIGGER IF EXISTS {function} ON {table}")
            cursor.execute(f"DROP FUNCTION IF EXISTS {function}()")


@contextlib.contextmanager
def the_turn_lost_when_a_note_is_written():
    """While active, a note written (``upsert_note``, an idempotent_write)
    makes the database lose what a failover to a replica that lagged loses:
    the running run's model turn that asked for it and the fence stamped with
    it. The write ran; its record then finds them gone (``WriteNotDurable``).
    (The append-only trigger is the database's; a recovery does not run it,
    nor does this.)"""
    from django.db import connection

    from runs.models import AgentRun, RunStep
    from tools.models import Note

    runs, steps, function = AgentRun._meta.db_table, RunStep._meta.db_table, "nrllm_lose_turn"
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE FUNCTION {function}() RETURNS trigger AS $$ DECLARE lost uuid; BEGIN "
            f"SELECT id INTO lost FROM {runs} WHERE status = 'running'"
            " AND pending_effect = 'idempotent_write'; "
            "PERFORM set_config('session_replication_role', 'replica', true); "
            f"DELETE FROM {steps} WHERE run_id = lost AND sequence = "
            f"(SELECT max(sequence) FROM {steps} WHERE run_id = lost); "
            f"UPDATE {runs} SET step_count = step_count - 1, attempt_steps = attempt_steps - 1,"
            " pending_effect = '', pending_call = NULL WHERE id = lost; "
            "PERFORM set_config('session_replication_role', 'origin', true); "
            "RETURN NULL; END $$ LANGUAGE plpgsql"
        )
        cursor.execute(
            f"CREATE TRIGGER {function} AFTER INSERT OR UPDATE ON {Note._meta.db_table} "
            f"FOR EACH ROW EXECUTE FUNCTION {function}()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER {function} ON {Note._meta.db_table}")
            cursor.execute(f"DROP FUNCTION {function}()")


def run_when_due(run_id) -> None:
    """``run_queued`` for a run whose retry waits out its backoff, that wait
    skipped by back-dating ``available_at`` (time controlled, not slept: a
    job this early would sleep until the run is due, 2 s by default)."""
    from django.db.models.functions import Now

    from runs.models import AgentRun
    from runs.runtime import run_queued

    AgentRun.objects.filter(pk=run_id, available_at__gt=Now()).update(available_at=Now())
    run_queued(run_id)


def retried_when_due(*, rounds: int = 10) -> None:
    """Execute the queued runs' retries as the embedded worker does once their
    backoff is over, the wait skipped by back-dating ``available_at`` (time
    controlled, not slept); round after round for retries of retries."""
    from django.db.models.functions import Now

    from runs.models import AgentRun
    from runs.models.vocabulary import RunStatus
    from runs.queue.dispatch import executing_in_embedded_worker
    from runs.workers.embedded import execute_due_runs

    with executing_in_embedded_worker():
        for _ in range(rounds):
            if not AgentRun.objects.filter(status=RunStatus.QUEUED).update(available_at=Now()):
                return
            execute_due_runs(limit=100)


def writes_per_call(http_server) -> dict[str, Counter]:
    """How many times each write went out, counted where it landed: the
    notifications per idempotency key and per run (the outbox), and the
    webhook POSTs per path (``http_server``). Each maps a count to how many
    keys, runs or paths had it: ``{1: n}`` when every write went out once."""
    from django.db.models import Count

    from tools.models import OutboxNotification

    def counted(field: str) -> Counter:
        rows = OutboxNotification.objects.values(field).annotate(n=Count("id"))
        return Counter(rows.values_list("n", flat=True))

    return {
        "notifications per key": counted("idempotency_key"),
        "notifications per run": counted("run_id"),
        "posts per call": Counter(Counter(post.path for post in http_server.posts()).values()),
    }
