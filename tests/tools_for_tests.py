"""Tool classes the tests register through ``NRLLM_TOOLS``."""

import contextlib
import json
import os
import signal
import time

import psycopg
from django.db import connection

from runs.models import AgentRun
from tools.builtin.http import PostWebhook
from tools.contract import Tool, ToolOutcomeUnknown, WhereToCheck
from tools.effects import ToolEffect
from tools.models import OutboxNotification

_ANY = {"type": "object", "properties": {}, "additionalProperties": True}


class FenceProbe(Tool):
    """Reports the run's write fence as the database holds it mid-call."""

    name = "fence_probe_write"
    description = "idempotent write that reports the fence it runs under"
    effect = ToolEffect.IDEMPOTENT_WRITE
    parameters = _ANY

    def run(self, arguments, context):
        run = AgentRun.objects.get(pk=context.run_id)
        return {"pending_effect": run.pending_effect, "lease_token": run.lease_token}


class ReadFenceProbe(FenceProbe):
    name = "fence_probe_read"
    description = "read-only tool that reports the fence it runs under"
    effect = ToolEffect.READ_ONLY


class ProcessProbe(Tool):
    """Reports which process and which database backend executed it."""

    name = "process_probe"
    description = "read-only tool that reports its process id and database backend"
    parameters = _ANY

    def run(self, arguments, context):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backend = cursor.fetchone()[0]
        return {"pid": os.getpid(), "backend_pid": backend}


class NoEffectDeclared(Tool):
    name = "no_effect_declared"
    description = "declares no effect"
    parameters = _ANY

    def run(self, arguments, context):
        return {}


class StringEffect(Tool):
    name = "string_effect"
    description = "declares its effect as a plain string"
    effect = "read_only"  # type: ignore[assignment]
    parameters = _ANY


class DuplicateReadNote(Tool):
    name = "read_note"
    description = "clashes with the builtin"
    parameters = _ANY


class Nameless(Tool):
    description = "has no name"
    parameters = _ANY


class SchemaLess(Tool):
    name = "schema_less"
    description = "has no parameters schema"


class BrokenSchema(Tool):
    name = "broken_schema"
    description = "parameters is not a JSON Schema"
    parameters = {"type": "no-such-type"}


class NotATool:
    name = "not_a_tool"


class IdempotentWebhook(PostWebhook):
    """A webhook whose receiver deduplicates by Idempotency-Key: safe to repeat."""

    name = "put_webhook"
    description = "idempotent variant of post_webhook"
    effect = ToolEffect.IDEMPOTENT_WRITE


class SlowTool(Tool):
    """Sleeps past its own time limit."""

    name = "slow_tool"
    description = "sleeps for the given seconds; limited to 1 second"
    parameters = {"type": "object", "properties": {"seconds": {"type": "number"}}}
    timeout_seconds = 1

    def run(self, arguments, context):
        time.sleep(arguments.get("seconds", 5))
        return {"slept": True}


class LeaseProbe(Tool):
    """Reports how long the lease has left while it runs."""

    name = "lease_probe"
    description = "reports the lease's remaining seconds mid-call; limit 600 seconds"
    effect = ToolEffect.IDEMPOTENT_WRITE
    parameters = _ANY
    timeout_seconds = 600

    def run(self, arguments, context):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT EXTRACT(EPOCH FROM lease_expires_at - now()) FROM runs_agentrun "
                "WHERE id = %s",
                [context.run_id],
            )
            (remaining,) = cursor.fetchone()
        return {"lease_remaining_seconds": float(remaining)}


class WriteDuringServerCrash(Tool):
    """A non-idempotent write in flight when the database server crashes: it
    kills the server's WAL writer that the test stopped (its pid in
    ``NRLLM_TEST_STALLED_WAL_WRITER``), then stays "in flight" until the test
    kills the worker."""

    name = "write_during_server_crash"
    description = "non-idempotent write during which the database server crashes"
    effect = ToolEffect.NON_IDEMPOTENT_WRITE
    parameters = _ANY

    def run(self, arguments, context):
        os.kill(int(os.environ["NRLLM_TEST_STALLED_WAL_WRITER"]), signal.SIGKILL)
        time.sleep(600)
        return {"written": True}


class ReadDuringServerCrash(Tool):
    """A read during which the database server crashes: the first call kills
    the server's WAL writer that the test stopped (its pid in
    ``NRLLM_TEST_STALLED_WAL_WRITER``) and answers once the server is back,
    so the attempt's next record meets the broken connection; later calls
    just answer."""

    name = "read_during_server_crash"
    description = "read-only tool during whose first call the database server crashes"
    effect = ToolEffect.READ_ONLY
    parameters = _ANY

    def run(self, arguments, context):
        stalled = int(os.environ["NRLLM_TEST_STALLED_WAL_WRITER"])
        with contextlib.suppress(ProcessLookupError):
            os.kill(stalled, signal.SIGKILL)
            _wait_for_a_server_without(stalled)
        return {"read": arguments}


class SlowReadDuringServerCrash(ReadDuringServerCrash):
    """The same crash, and then the first call runs past its time limit: the
    runtime closes its database connection after a call it stopped (which
    the crash had broken), and the next statement goes out on a new one with
    no error seen."""

    name = "slow_read_during_server_crash"
    description = "read-only tool that outlives its time limit after the database server crashed"
    timeout_seconds = 1

    def run(self, arguments, context):
        stalled = int(os.environ["NRLLM_TEST_STALLED_WAL_WRITER"])
        with contextlib.suppress(ProcessLookupError):
            os.kill(stalled, signal.SIGKILL)
            _wait_for_a_server_without(stalled)
            time.sleep(30)
        return {"read": arguments}


class ReadDuringAFlush(Tool):
    """A read during which another session commits waiting for the flush,
    which carries every earlier commit's WAL to disk (as any other run's
    fence or settle does); its result holds a marker only its record
    carries (``ZZR1``), for a proxy rule to find."""

    name = "read_during_a_flush"
    description = "read-only tool during which another session's commit flushes the WAL"
    effect = ToolEffect.READ_ONLY
    parameters = _ANY

    def run(self, arguments, context):
        flush_another_commit(os.environ["NRLLM_TEST_DIRECT_DATABASE_URL"])
        return {"mark": "ZZ" + "R1"}


def flush_another_commit(url: str) -> None:
    """A commit of another session that waits for the WAL flush."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS flushed_by_a_test (x int)")
        conn.execute("INSERT INTO flushed_by_a_test VALUES (1)")


def _wait_for_a_server_without(wal_writer: int) -> None:
    url = os.environ["DATABASE_URL"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(psycopg.OperationalError):
            with psycopg.connect(url, connect_timeout=2) as conn:
                row = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'"
                ).fetchone()
            if row and row[0] != wal_writer:
                return
        time.sleep(0.1)
    raise RuntimeError("the database server did not come back")


class UnsureWrite(Tool):
    """A write that cannot tell whether it landed the first time it is called
    with an idempotency key: it records the attempt (an outbox row under the
    key), then raises ``ToolOutcomeUnknown``; called again with that key, it
    records again and answers."""

    name = "unsure_write"
    description = "non-idempotent write whose first outcome for a call is unknown"
    effect = ToolEffect.NON_IDEMPOTENT_WRITE
    parameters = _ANY

    def run(self, arguments, context):
        earlier = OutboxNotification.objects.filter(idempotency_key=context.idempotency_key)
        attempts = earlier.count()
        OutboxNotification.objects.create(
            recipient=self.name,
            message=json.dumps(arguments, sort_keys=True),
            run_id=context.run_id,
            idempotency_key=context.idempotency_key,
        )
        if attempts == 0:
            raise ToolOutcomeUnknown("the receiver did not answer after the request went out")
        return {"attempt": attempts + 1}


class UnsureLedgerWrite(UnsureWrite):
    """``unsure_write`` whose record, as it says where to check it, holds
    markup and a link no page may carry."""

    name = "unsure_ledger_write"

    def where_to_check(self, arguments, idempotency_key):
        return WhereToCheck(f"the <i>ledger</i> of {arguments.get('text')}", "javascript:alert(1)")


class UnsureIdempotentWrite(UnsureWrite):
    name = "unsure_idempotent_write"
    description = "idempotent write whose first outcome for a call is unknown"
    effect = ToolEffect.IDEMPOTENT_WRITE


class UnsureRead(Tool):
    name = "unsure_read"
    description = "read-only tool that cannot tell what it read"
    parameters = _ANY

    def run(self, arguments, context):
        raise ToolOutcomeUnknown("the reply was cut off")


class SlowWrite(SlowTool):
    """A non-idempotent write stopped at its time limit: it may have landed."""

    name = "slow_write"
    description = "non-idempotent write that sleeps past its 1 second limit"
    effect = ToolEffect.NON_IDEMPOTENT_WRITE


class CrashingWrite(Tool):
    """A non-idempotent write that fails without saying it changed nothing."""

    name = "crashing_write"
    description = "non-idempotent write that raises an unexpected exception"
    effect = ToolEffect.NON_IDEMPOTENT_WRITE
    parameters = _ANY

    def run(self, arguments, context):
        raise RuntimeError("connection pool exhausted halfway through")


class SlowDatabaseWrite(Tool):
    """A non-idempotent write whose database statement outlasts its 1 second
    limit (a lock wait, a slow server): the alarm stops it mid-statement."""

    name = "slow_database_write"
    description = "non-idempotent write whose statement takes 3 s; limit 1 s"
    effect = ToolEffect.NON_IDEMPOTENT_WRITE
    parameters = _ANY
    timeout_seconds = 1

    def run(self, arguments, context):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(3)")
        return {"ok": True}


class SlowDatabaseIdempotentWrite(SlowDatabaseWrite):
    name = "slow_database_idempotent_write"
    effect = ToolEffect.IDEMPOTENT_WRITE


class SlowDatabaseRead(SlowDatabaseWrite):
    """A read that holds a database connection for 3 s, within its limit."""

    name = "slow_database_read"
    description = "read whose statement takes 3 s; limit 10 s"
    effect = ToolEffect.READ_ONLY
    timeout_seconds = 10


class ExitingWrite(Tool):
    """A write whose library exits the process (a BaseException) after writing."""

    name = "exiting_write"
    description = "non-idempotent write that raises SystemExit after writing"
    effect = ToolEffect.NON_IDEMPOTENT_WRITE
    parameters = _ANY

    def run(self, arguments, context):
        raise SystemExit(3)


class WriteBeforeFailover(Tool):
    """A non-idempotent write whose effect is outside the database (a line
    appended to the file ``NRLLM_TEST_WRITES_FILE``: a failover cannot take
    it back), still in flight while the test fails the database over; it
    returns once the file ``NRLLM_TEST_FAILOVER_DONE`` exists."""

    name = "write_before_failover"
    description = "non-idempotent write during which the database fails over"
    effect = ToolEffect.NON_IDEMPOTENT_WRITE
    parameters = _ANY
    timeout_seconds = 120

    def run(self, arguments, context):
        with open(os.environ["NRLLM_TEST_WRITES_FILE"], "a") as writes:
            writes.write(json.dumps({"key": context.idempotency_key, **arguments}) + "\n")
        done = os.environ["NRLLM_TEST_FAILOVER_DONE"]
        for _ in range(1000):
            if os.path.exists(done):
                break
            time.sleep(0.1)
        return {"written": True}


class IdempotentWriteBeforeFailover(WriteBeforeFailover):
    """``WriteBeforeFailover``, declared an idempotent write."""

    name = "idempotent_write_before_failover"
    effect = ToolEffect.IDEMPOTENT_WRITE


class Unprintable(Exception):
    """An exception whose ``str()`` raises: its ``__str__`` returns no string."""

    def __str__(self):
        return {"detail": "not a string"}


class UnprintableRead(Tool):
    name = "unprintable_read"
    description = "read-only tool that raises an exception which cannot be printed"
    effect = ToolEffect.READ_ONLY
    parameters = _ANY

    def run(self, arguments, context):
        raise Unprintable()


class UnprintableWrite(UnprintableRead):
    name = "unprintable_write"
    description = "idempotent write that raises an exception which cannot be printed"
    effect = ToolEffect.IDEMPOTENT_WRITE
