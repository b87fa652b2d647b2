"""A server crash after a record in doubt: the commits that did not wait for
the WAL flush (``runs/transitions/steps.must_reach_disk``) meet a connection
that dropped a committed reply, or a database that cannot be asked.

Faults at real boundaries only: a private PostgreSQL whose WAL writer is
stopped and then SIGKILLed (``tests/test_commit_durability.py``), a TCP
proxy (``tests.db_proxy``) that drops a committed reply and refuses
connections for a while, and another session's commit that waits for the
flush (and so carries every earlier commit to disk).
"""

import json
import os
import signal

import psycopg
import pytest

from tests.db_proxy import FaultProxy, Rule
from tests.helpers import answer, call, scripted, wait_until
from tests.processes import paused
from tests.test_commit_durability import (  # noqa: F401  (server_url: the crashable server)
    CRASH_TOOLS,
    _app_env,
    _manage,
    _restarted_without,
    _run,
    _stall_wal_writer,
    server_url,
)
from tests.tools_for_tests import flush_another_commit

pytestmark = pytest.mark.worker

TOOLS = f"{CRASH_TOOLS},tests.tools_for_tests.ReadDuringAFlush"


def _through_a_proxy(server_url: str) -> tuple[FaultProxy, str]:  # noqa: F811
    port = int(server_url.rsplit(":", 1)[1].split("/")[0])
    proxy = FaultProxy(("127.0.0.1", port))
    return proxy, server_url.replace(f":{port}/", f":{proxy.port}/")


def _journal(url: str, run_id: str) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT kind, tool_name, result FROM runs_runstep WHERE run_id = %s ORDER BY sequence",
            [run_id],
        ).fetchall()


def test_a_doubt_resolved_late_and_then_lost_in_a_crash_is_written_again_in_its_place(
    server_url,  # noqa: F811
    workers,
    worker_env,
):
    """A read's record commits unheard (the proxy drops the reply and refuses
    the count and the heartbeat after it), and is found landed only at the
    next record, the next turn's, which does not wait for the flush. The
    server then crashes, losing both. The attempt writes back exactly those
    two, in order: no step twice, none missing."""
    env = {**_app_env(worker_env, server_url), "NRLLM_TOOLS": TOOLS}
    request = scripted(
        call("read_during_a_flush", q="one"),
        call("read_during_server_crash", q="two"),
        answer("done"),
        tools=["read_during_a_flush", "read_during_server_crash"],
    )
    run_id = _manage(env, "enqueue_run", "-", stdin=json.dumps(request))
    wal_writer = _stall_wal_writer(server_url)
    proxy, proxied = _through_a_proxy(server_url)
    dropped = proxy.add(Rule(b"ZZR1", "drop_reply", then_refuse=2))
    try:
        worker = workers.start(
            burst=True,
            DATABASE_URL=proxied,
            NRLLM_TOOLS=TOOLS,
            NRLLM_TEST_DIRECT_DATABASE_URL=server_url,
            NRLLM_TEST_STALLED_WAL_WRITER=wal_writer,
        )
        output, _ = worker.communicate(timeout=120)
    finally:
        proxy.close()
    output = output.decode()
    assert dropped.fired.is_set(), output
    assert worker.returncode == 0, output
    journal = _journal(server_url, run_id)
    assert [(kind, tool or "") for kind, tool, _ in journal] == [
        ("request", ""),
        ("llm", ""),
        ("tool", "read_during_a_flush"),
        ("llm", ""),
        ("tool", "read_during_server_crash"),
        ("llm", ""),
    ], output
    assert _run(server_url, run_id, "status", "output") == {"status": "completed", "output": "done"}


def _crashed_while_the_model_answers(server_url, workers, worker_env, after_the_crash) -> str:  # noqa: F811
    """A run of a read and then a final answer, through the fault proxy: the
    server crashes while the model writes the answer, after the turn and the
    read were recorded without the flush (the claim flushed by another
    commit). ``after_the_crash(proxy)`` sets the fault the final record meets
    next. The run must complete all the same, with every step its answer
    came from, through a retry that resumes after the last durable step.
    Returns what the worker printed."""
    env = {**_app_env(worker_env, server_url), "NRLLM_TOOLS": TOOLS}
    request = scripted(
        {**call("search_notes", query="one"), "delay_seconds": 2},
        answer("after", delay_seconds=2),
        tools=["search_notes"],
    )
    run_id = _manage(env, "enqueue_run", "-", stdin=json.dumps(request))
    wal_writer = _stall_wal_writer(server_url)
    proxy, proxied = _through_a_proxy(server_url)
    try:
        worker = workers.start(
            burst=True,
            DATABASE_URL=proxied,
            NRLLM_TOOLS=TOOLS,
            NRLLM_RETRY_BACKOFF_SECONDS=0,
            # No heartbeat tick inside the scenario: its statement would
            # meet the refused connections the final record must meet.
            NRLLM_LEASE_SECONDS=900,
            # Unpooled: each question opens a connection, which the proxy
            # refuses. A pool retries refused connections in the background
            # until its timeout, and its borrower does not see them.
            DATABASE_POOL_MAX_SIZE=0,
            # A burst that runs the retry its own run enqueued: the forking
            # worker looks at the queue again after each run; a concurrent
            # one stops taking jobs once the queue is empty.
            NRLLM_WORKER_CLASS="runs.worker.Worker",
        )
        wait_until(lambda: _run(server_url, run_id, "status")["status"] == "running", what="claim")
        flush_another_commit(server_url)  # the claim is on disk
        wait_until(
            lambda: _run(server_url, run_id, "steps")["steps"] == ["request", "llm", "tool"],
            what="the read recorded",
        )
        with paused(worker):  # the crash, while the model answers
            os.kill(wal_writer, signal.SIGKILL)
            wait_until(lambda: _restarted_without(server_url, wal_writer), what="crash recovery")
            after_the_crash(proxy)
        output, _ = worker.communicate(timeout=120)
    finally:
        proxy.close()
    output = output.decode()
    assert worker.returncode == 0, output
    assert "it is not settled without them" in output, output
    expected = {
        "status": "completed",
        "output": "after",
        "steps": ["request", "request", "llm", "tool", "llm"],
    }
    assert _run(server_url, run_id, *expected) == expected, output
    return output


def test_a_final_answer_that_cannot_tell_whether_its_steps_are_there_does_not_complete(
    server_url,  # noqa: F811
    workers,
    worker_env,
):
    """The final record meets the broken connection, and the database
    refuses to be asked what it holds (as a server still recovering does).
    The attempt does not complete the run over the lost steps: it fails
    (``connection``) and its retry resumes after the last durable step,
    asking the lost turn again."""

    def refuse_both_counts(proxy):
        with proxy.lock:
            proxy.refuse = 2  # both of the final record's counts

    _crashed_while_the_model_answers(server_url, workers, worker_env, refuse_both_counts)


def test_a_final_answer_in_doubt_twice_does_not_complete_without_the_steps_it_restored(
    server_url,  # noqa: F811
    workers,
    worker_env,
):
    """The final record meets the broken connection; the database, asked,
    holds neither the turn nor the read, and the attempt restores them ahead
    of the answer — but that record never arrives either (the connection is
    cut before it is sent). The run is not completed without the restored
    steps: the retry resumes after the last durable step."""
    cuts = []

    def cut_the_restoring_record(proxy):
        cuts.append(proxy.add(Rule(b"THEN 'completed' ELSE 'cancelled'", "kill_before")))

    output = _crashed_while_the_model_answers(
        server_url, workers, worker_env, cut_the_restoring_record
    )
    assert cuts[0].fired.is_set(), output
