"""The commits that do not wait for the WAL flush — the claim
(``runs/transitions/step_journal.py``) and the record of model turns and reads that
stamp no write's fence (``runs/transitions/steps.must_reach_disk``): what a
server crash can lose, and what it cannot.

Each test crashes a PostgreSQL server of its own at the moment that matters.
The server's WAL writer is stopped first (SIGSTOP), so the WAL reaches the
operating system only through a commit that waits for it. Killing the
stopped writer (SIGKILL) then makes the server restart and recover from that
WAL alone, as after a host crash inside the flush delay. The server runs no
autovacuum and no background writer, either of which could flush the WAL too.

The crashable server and its helpers are here; the same crash with the
database's default ``synchronous_commit = off`` is in
``test_commit_durability_default_off.py``, after a record in doubt in
``test_commit_durability_doubts.py``.
"""

import json
import os
import signal
import tempfile
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.utils import timezone

from tests.drifting_model import MODELS, NOTIFY, SEARCH, request_for
from tests.harness import postgres_server, transaction_pooler
from tests.helpers import answer, call, manage, scripted, wait_until
from tests.processes import paused

CRASH_TOOL = "tests.tools_for_tests.WriteDuringServerCrash"
CRASH_TOOLS = (
    f"{CRASH_TOOL},tests.tools_for_tests.ReadDuringServerCrash,"
    "tests.tools_for_tests.SlowReadDuringServerCrash"
)

pytestmark = pytest.mark.worker


@pytest.fixture(scope="module")
def server_url():
    """A migrated PostgreSQL server the tests may crash: its URL."""
    with tempfile.TemporaryDirectory(prefix="nrllm-crash-") as workdir:
        Path(workdir).chmod(0o755)
        server = postgres_server(
            Path(workdir), options="-c autovacuum=off -c bgwriter_lru_maxpages=0"
        )
        with server:
            url = f"postgres://postgres@127.0.0.1:{server.port}/postgres"
            _manage(_app_env(os.environ, url), "migrate", "--verbosity=0")
            yield url


@pytest.fixture(scope="module")
def pooler_url(server_url):
    """PgBouncer in transaction mode in front of that server: its URL."""
    port = int(server_url.rsplit(":", 1)[1].split("/")[0])
    with tempfile.TemporaryDirectory(prefix="nrllm-pooler-") as workdir:
        Path(workdir).chmod(0o755)
        with transaction_pooler(Path(workdir), port) as url:
            yield url


def _app_env(base: dict, url: str) -> dict:
    return {
        **base,
        "DJANGO_SETTINGS_MODULE": "nrllm_ops.settings",
        "SECRET_KEY": "tests-only-secret-key",
        "DATABASE_URL": url,
        "NRLLM_TOOLS": CRASH_TOOLS,
    }


def _manage(env: dict, *args: str, stdin: str | None = None) -> str:
    done = manage(*args, env=env, stdin=stdin)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def _wal_writer(url: str) -> int | None:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'"
        ).fetchone()
    return row[0] if row else None


def _stall_wal_writer(url: str) -> int:
    pid = _wal_writer(url)
    assert pid is not None, "the server runs no WAL writer"
    os.kill(pid, signal.SIGSTOP)
    return pid


def _restarted_without(url: str, wal_writer: int) -> bool:
    """The server is back after a crash that took ``wal_writer`` with it."""
    try:
        current = _wal_writer(url)
    except psycopg.OperationalError:  # still recovering
        return False
    return current is not None and current != wal_writer


def _run(url: str, run_id: str, *fields: str) -> dict:
    """The run's ``fields`` as the server holds them ("steps": their kinds)."""
    with psycopg.connect(url) as conn:
        status, reason, token, fence, output = conn.execute(
            "SELECT status, termination_reason, lease_token, pending_effect, output"
            " FROM runs_agentrun WHERE id = %s",
            [run_id],
        ).fetchone()
        steps = conn.execute(
            "SELECT kind FROM runs_runstep WHERE run_id = %s ORDER BY sequence", [run_id]
        ).fetchall()
    run = {
        "status": status,
        "reason": reason,
        "lease_token": token,
        "fence": fence,
        "output": output,
        "steps": [kind for (kind,) in steps],
    }
    return {field: run[field] for field in fields or run}


def _run_with_the_wal_writer_stalled(workers, url: str, env: dict, request: dict, **options):
    """Enqueue ``request``, stall the server's WAL writer, and start a worker
    whose crash tools kill it: (run id, the WAL writer's pid, the worker)."""
    run_id = _manage(env, "enqueue_run", "-", stdin=json.dumps(request))
    wal_writer = _stall_wal_writer(url)
    worker_options = {"DATABASE_URL": url, "NRLLM_TOOLS": CRASH_TOOLS, **options}
    worker = workers.start(NRLLM_TEST_STALLED_WAL_WRITER=wal_writer, **worker_options)
    return run_id, wal_writer, worker


#: What a worker logs when it writes steps the database lost again.
REWRITTEN = "recorded step(s) lost by the database; writing them again"


def _output_of(worker) -> str:
    """What a burst worker printed, once it has ended well."""
    output, _ = worker.communicate(timeout=120)
    assert worker.returncode == 0, output.decode()
    return output.decode()


def _reap_as_of(env: dict, moment) -> str:
    return _manage(env, "reap_stale_runs", f"--as-of={moment.isoformat()}")


def test_a_claim_a_server_crash_lost_leaves_the_run_queued_and_the_reaper_dispatches_it_again(
    server_url, workers, worker_env
):
    env = _app_env(worker_env, server_url)
    run_id = _manage(
        env, "enqueue_run", "-", stdin=json.dumps(scripted(answer("after", delay_seconds=2)))
    )
    wal_writer = _stall_wal_writer(server_url)
    worker = workers.start(burst=True, DATABASE_URL=server_url)
    # Other sessions see the claim at once; the WAL has it only in memory.
    wait_until(lambda: _run(server_url, run_id)["status"] == "running", what="the claim")
    with paused(worker):  # the provider answers after the crash and recovery
        os.kill(wal_writer, signal.SIGKILL)
        wait_until(lambda: _restarted_without(server_url, wal_writer), what="crash recovery")
        lost_claim = {"status": "queued", "lease_token": 0, "steps": []}
        assert _run(server_url, run_id, *lost_claim) == lost_claim
    # The worker's attempt ends on its broken connection and settles nothing.
    worker.communicate(timeout=60)
    assert _run(server_url, run_id, *lost_claim) == lost_claim

    # Its job is spent: the reaper dispatches the run again once it is overdue.
    summary = _reap_as_of(env, timezone.now() + timedelta(minutes=5))
    assert "redispatched 1" in summary, summary
    workers.run_burst(DATABASE_URL=server_url)
    expected = {
        "status": "completed",
        "output": "after",
        # The lost claim's token was never given: this attempt is token 1.
        "lease_token": 1,
        "steps": ["reaper", "request", "llm"],
    }
    assert _run(server_url, run_id, *expected) == expected


def test_a_write_runs_only_after_a_flush_that_made_its_claim_durable(
    server_url, workers, worker_env
):
    """A write tool runs after its fence's commit, which waits for the WAL
    flush and so carries the claim before it. A crash during the write keeps
    both, and the reaper dead-letters the run instead of running it again."""
    env = _app_env(worker_env, server_url)
    request = scripted(
        call("write_during_server_crash"), answer("unreached"), tools=["write_during_server_crash"]
    )
    # The tool kills the stalled WAL writer: the server crashes mid-write.
    run_id, wal_writer, worker = _run_with_the_wal_writer_stalled(
        workers, server_url, env, request, NRLLM_TOOLS=CRASH_TOOL
    )
    wait_until(
        lambda: _restarted_without(server_url, wal_writer), timeout=60, what="the crash mid-write"
    )
    expected = {
        "status": "running",
        "lease_token": 1,
        "fence": "non_idempotent_write",
        "steps": ["request", "llm"],
    }
    assert _run(server_url, run_id, *expected) == expected
    workers.kill(worker)

    _reap_as_of(env, timezone.now() + timedelta(hours=1))
    expected = {
        "status": "failed",
        "reason": "write_interrupted",
        "steps": ["request", "llm", "reaper"],
    }
    assert _run(server_url, run_id, *expected) == expected


@pytest.mark.parametrize("model", MODELS, indirect=True)
@pytest.mark.parametrize(
    "crashing_read",
    [
        # The crash breaks the connection: the read's record meets the error.
        "read_during_server_crash",
        # The read then outlives its time limit, and the runtime closes the
        # connection: the record goes out on a new one, with no error seen.
        "slow_read_during_server_crash",
    ],
)
def test_a_server_crash_loses_only_model_turns_and_reads_which_the_attempt_writes_again(
    crashing_read, model, server_url, workers, worker_env
):
    """A model turn's record that stamps no fence commits without waiting for
    the flush, and a read's too. A crash during the read loses the turn that
    asked for it — never the write before it, whose fence and record waited.
    The read's record, guarded on how many steps the attempt has recorded,
    matches nothing (whether it meets the broken connection or goes out on a
    new one), and the attempt writes the lost turn again, as the model
    worded it, ahead of the read: one attempt, no gap, no turn asked twice,
    the write once."""
    env = {**_app_env(worker_env, server_url), "NRLLM_OPENAI_API_KEY": "sk-test-not-a-real-key"}
    crash_read = {"name": crashing_read, "arguments": {"q": "take {take}"}}
    plan = [{"calls": [NOTIFY]}, {"calls": [crash_read]}, {"answer": "done {take}"}]
    kind = "drifting" if model else "scripted"
    request = request_for(kind, plan, ["send_notification", crashing_read])
    run_id, _, worker = _run_with_the_wal_writer_stalled(
        workers, server_url, env, request, burst=True
    )
    assert REWRITTEN in _output_of(worker)

    expected = {
        "status": "completed",
        "output": "done 3" if model else "done same",
        "steps": ["request", "llm", "tool", "llm", "tool", "llm"],
    }
    assert _run(server_url, run_id, *expected) == expected
    with psycopg.connect(server_url) as conn:
        (notifications,) = conn.execute(
            "SELECT count(*) FROM tools_outboxnotification WHERE run_id = %s", [run_id]
        ).fetchone()
        turns = conn.execute(
            "SELECT result FROM runs_runstep WHERE run_id = %s AND kind = 'llm' ORDER BY sequence",
            [run_id],
        ).fetchall()
        (tokens,) = conn.execute(
            "SELECT prompt_tokens FROM runs_agentrun WHERE id = %s", [run_id]
        ).fetchone()
    assert notifications == 1
    if model:
        assert model.requests_by_turn == {0: 1, 1: 1, 2: 1}, model.requests_by_turn
        contents = [turn["content"] for (turn,) in turns]
        assert contents == ["on it (take 1)", "on it (take 2)", "done 3"]
        # The lost turn's tokens are counted once, with its step written again.
        assert tokens == sum(turn["usage"]["prompt_tokens"] for (turn,) in turns)


@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_server_crash_while_the_model_answers_loses_nothing_the_answer_came_from(
    model, server_url, workers, worker_env
):
    """The crash comes while the model writes its final answer, after a read
    and the turn that asked for it were recorded without the flush: they
    are lost. The final record is the first statement to meet the broken
    connection (a call the circuit breaker let through closed sends no
    statement after it): the attempt asks the database what it holds,
    writes the lost turn and read again and then the answer. The run
    completes with every step its answer came from, no turn is asked of the
    model again, and the write ran once."""
    env = {**_app_env(worker_env, server_url), "NRLLM_OPENAI_API_KEY": "sk-test-not-a-real-key"}
    plan = [
        {"calls": [NOTIFY]},
        {"calls": [SEARCH]},
        {"answer": "after {take}", "delay_seconds": 2},
    ]
    request = request_for(
        "drifting" if model else "scripted", plan, ["send_notification", "search_notes"]
    )
    run_id, wal_writer, worker = _run_with_the_wal_writer_stalled(
        workers, server_url, env, request, burst=True, NRLLM_RETRY_BACKOFF_SECONDS=0
    )
    every_step = ["request", "llm", "tool", "llm", "tool"]
    # Other sessions see the last two; the WAL has them only in memory.
    wait_until(
        lambda: _run(server_url, run_id, "steps")["steps"] == every_step, what="the read recorded"
    )
    # The crash, while the model answers: the worker waits for the server to
    # recover before the final record goes out.
    with paused(worker):
        os.kill(wal_writer, signal.SIGKILL)
        wait_until(lambda: _restarted_without(server_url, wal_writer), what="crash recovery")
    output = _output_of(worker)
    assert REWRITTEN in output
    expected = {
        "status": "completed",
        "output": "after 3" if model else "after same",
        "steps": [*every_step, "llm"],
    }
    if model:
        assert model.requests_by_turn == {0: 1, 1: 1, 2: 1}, model.requests_by_turn
    assert _run(server_url, run_id, *expected) == expected
    with psycopg.connect(server_url) as conn:
        (notifications,) = conn.execute(
            "SELECT count(*) FROM tools_outboxnotification WHERE run_id = %s", [run_id]
        ).fetchone()
    assert notifications == 1


@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_behind_a_pooler_the_records_guard_sees_lost_steps_and_no_write_runs_over_them(
    model, server_url, pooler_url, workers, worker_env
):
    """Behind a transaction-mode pooler a server crash does not break the
    worker's connection: the pooler gives its next transaction another
    server connection, and no statement fails. The turn that asked for a
    read and then a write was recorded without the flush and is lost; the
    read's record, which would stamp the write's fence, is guarded on how
    many steps the attempt has recorded and matches nothing. The attempt
    writes the lost turn again first: the write runs once, after its turn."""
    env = {**_app_env(worker_env, server_url), "NRLLM_OPENAI_API_KEY": "sk-test-not-a-real-key"}
    crash_read = {"name": "read_during_server_crash", "arguments": {"q": "take {take}"}}
    second = {"name": "send_notification", "arguments": {"recipient": "two", "message": "{take}"}}
    plan = [{"calls": [NOTIFY]}, {"calls": [crash_read, second]}, {"answer": "done {take}"}]
    kind = "drifting" if model else "scripted"
    request = request_for(kind, plan, ["send_notification", "read_during_server_crash"])
    run_id, _, worker = _run_with_the_wal_writer_stalled(
        workers,
        server_url,
        env,
        request,
        burst=True,
        DATABASE_URL=pooler_url,
        DATABASE_PREPARED_STATEMENTS="false",
        NRLLM_RETRY_BACKOFF_SECONDS=0,
    )
    assert REWRITTEN in _output_of(worker)
    expected = {
        "status": "completed",
        "output": "done 3" if model else "done same",
        "steps": ["request", "llm", "tool", "llm", "tool", "tool", "llm"],
    }
    assert _run(server_url, run_id, *expected) == expected
    with psycopg.connect(server_url) as conn:
        recipients = conn.execute(
            "SELECT recipient FROM tools_outboxnotification WHERE run_id = %s ORDER BY id",
            [run_id],
        ).fetchall()
    assert [recipient for (recipient,) in recipients] == ["team", "two"]
    if model:
        assert model.requests_by_turn == {0: 1, 1: 1, 2: 1}, model.requests_by_turn
