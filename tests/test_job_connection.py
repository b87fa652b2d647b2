"""A job's database connection: kept between jobs, checked by the claim
itself, and opened without a round trip of its own.

Django's health check (CONN_HEALTH_CHECKS) would send ``SELECT 1`` before
every job on a kept connection. A job skips it: its first statement is the
claim, and a claim that fails on a dead connection reconnects and claims.
"""

import contextlib
import importlib
import signal
import tempfile

import psycopg
import pytest
from django.db import connection, connections
from psycopg.pq import Trace

from runs.jobs import execute_run_job
from runs.models import AgentRun
from runs.runtime import enqueue
from tests.helpers import answer, scripted, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

UTC_ALIASES = importlib.import_module(
    "runs.migrations.0012_database_time_zone_named_utc"
).UTC_ALIASES


def _completed(agent_run) -> AgentRun | None:
    current = AgentRun.objects.get(pk=agent_run.pk)
    return current if current.status == "completed" else None


@pytest.mark.worker
def test_a_kept_connection_the_server_closed_between_jobs_is_replaced_at_the_claim(workers, queue):
    worker = workers.start(NRLLM_WORKER_CLASS="runs.worker.SimpleWorker", DATABASE_CONN_MAX_AGE=600)
    first = enqueue(scripted(answer("one")))
    wait_until(lambda: _completed(first), what="the first run")
    with connection.cursor() as cursor:
        # The worker's kept connection, idle between jobs (the server restarted, say).
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert cursor.fetchone()[0] == 1

    second = enqueue(scripted(answer("two")))
    second = wait_until(lambda: _completed(second), what="the run after the terminated connection")
    assert (second.output, second.lease_token, second.requeue_count) == ("two", 1, 0)
    assert list(second.steps.values_list("kind", flat=True)) == ["request", "llm"]
    workers.signal(worker, signal.SIGTERM)
    output = worker.communicate(timeout=30)[0].decode()
    # The claim noticed the dead connection (no health check had replaced it)
    # and says so as what it is, not as a refused step.
    assert "connection lost at the claim" in output
    assert " ERROR " not in output, output


@contextlib.contextmanager
def _statements_sent(db_connection):
    """The statements ``db_connection`` sends meanwhile, read from libpq's
    trace of the wire protocol: one entry per Execute or simple Query."""
    statements = []
    pgconn = db_connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
        try:
            yield statements
        finally:
            pgconn.untrace()  # flushes the trace
            trace.seek(0)
            for line in trace:
                # "F<TAB>length<TAB>Message ..."; a query's own newlines
                # continue a line without the prefix.
                fields = line.split("\t")
                if fields[0] == "F" and fields[2].split(" ")[0] in ("Execute", "Query"):
                    statements.append(line.strip())


def test_a_one_step_run_on_a_kept_connection_sends_two_statements(queue, monkeypatch):
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 600)
    connection.close()  # reopened with the kept connection's lifetime
    warm = enqueue(scripted(answer()))
    execute_run_job(str(warm.pk))
    assert connection.connection is not None, "the job closed the kept connection"

    agent_run = enqueue(scripted(answer("traced")))
    with _statements_sent(connection) as statements:
        execute_run_job(str(agent_run.pk))
    assert _completed(agent_run).output == "traced"
    # The claim with its request step, then the final answer with the settle:
    # no health check, nothing else.
    assert len(statements) == 2, statements


def test_a_new_connection_sends_nothing_before_its_first_statement():
    """Django names a new session's time zone unless the server already
    reports 'UTC'. Migration 0012 names the database's default 'UTC' when it
    is UTC under another name (Debian's 'Etc/UTC'), so connecting costs no
    round trip: each forked work horse connects once per job."""
    fresh = connections.create_connection("default")
    try:
        # Django's connect(), traced from the moment the connection exists.
        fresh.connection = fresh.get_new_connection(fresh.get_connection_params())
        fresh.set_autocommit(fresh.settings_dict["AUTOCOMMIT"])
        with _statements_sent(fresh) as statements:
            fresh.init_connection_state()
        server_default = _server_time_zone(fresh)
    finally:
        fresh.close()
    named_utc = server_default == "UTC" or server_default in UTC_ALIASES
    assert len(statements) == (0 if named_utc else 1), (server_default, statements)


def _server_time_zone(db_connection) -> str:
    """The server's own default, as a session of another database starts with."""
    params = {**db_connection.get_connection_params(), "dbname": "postgres"}
    with psycopg.connect(**params) as other:
        return other.info.parameter_status("TimeZone")


def test_naming_the_zone_utc_is_skipped_for_a_role_that_does_not_own_the_database():
    """Migration 0012 must not fail a deploy whose role may not alter the
    database: PostgreSQL refuses, the migration notes it and goes on."""
    migration = importlib.import_module("runs.migrations.0012_database_time_zone_named_utc")
    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as owner:
        owner.execute("DROP ROLE IF EXISTS nrllm_not_owner")
        owner.execute("CREATE ROLE nrllm_not_owner LOGIN")
    try:
        notices = []
        with psycopg.connect(**{**params, "user": "nrllm_not_owner"}) as other:
            other.add_notice_handler(lambda notice: notices.append(notice.message_primary))
            other.execute(migration.NAME_IT_UTC)  # no exception
        assert notices == ["not the owner of the database: its sessions keep their time zone"]
    finally:
        with psycopg.connect(**params, autocommit=True) as owner:
            owner.execute("DROP ROLE nrllm_not_owner")
