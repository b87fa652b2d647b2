"""The triggers that record the run-ended webhook's events (G19), shared by
migration 0026 and, on SQLite, the migrate signals (``runs.apps``).

``nrllm_run_event``: after an UPDATE that sets a run's status, for each
row whose status changed to ``completed``, ``failed``, ``cancelled`` or
``waiting_for_approval``, ``waiting_for_input`` (G24) and that has a ``webhook_url``, insert the event
with what the body will say. It is part of the statement that changed the
status, so the event commits with it or not at all, whichever code path
wrote it (the ORM's, the reaper's bulk UPDATE, the raw SQL of
``runs.transitions.step_journal``). A run without a webhook, or an UPDATE
that does not set the status (a step's record, a lease's renewal), costs
nothing: PostgreSQL evaluates ``WHEN`` before it queues the trigger.

``nrllm_run_event_dead_letter``: a dead letter is inserted after its run's
``failed`` status, in the same transaction (``runs.transitions``); it
marks that event ``dead_lettered``. The event is the run's newest, not yet
tried (nothing outside the transaction can have seen it), and on
PostgreSQL one that occurred in this transaction.

On SQLite a table rebuild (how Django alters a table there) drops the
triggers on the rebuilt table, and a trigger that names a table being
rebuilt breaks the rebuild's final RENAME. So on SQLite the triggers are
dropped before every ``migrate`` and created again after it
(``runs.apps``), whatever later migrations rebuild.
"""

RUN_EVENT = "nrllm_run_event"
DEAD_LETTER = "nrllm_run_event_dead_letter"
ENDED = ("completed", "failed", "cancelled", "waiting_for_approval", "waiting_for_input")
#: The models whose tables the triggers name.
MODELS = ("AgentRun", "RunEvent", "DeadLetter")

_SNAPSHOT = (
    "status",
    "termination_reason",
    "failure_class",
    "output",
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens",
    "cost",
    "unpriced_turns",
)
_COLUMNS = ", ".join(
    ("id", "run_id", "event_type", *_SNAPSHOT, "url", "occurred_at", "next_attempt_at")
)
_NEW = ", ".join(f"NEW.{column}" for column in _SNAPSHOT)
_WHEN = (
    f"OLD.status IS DISTINCT FROM NEW.status AND NEW.status IN "
    f"({', '.join(repr(status) for status in ENDED)}) AND NEW.webhook_url <> ''"
)
#: A version 4 UUID, as 32 hex digits (how Django keeps a UUIDField on SQLite).
_SQLITE_UUID = (
    "lower(hex(randomblob(4))) || lower(hex(randomblob(2))) || '4' || "
    "substr(lower(hex(randomblob(2))), 2) || substr('89ab', 1 + (abs(random()) % 4), 1) || "
    "substr(lower(hex(randomblob(2))), 2) || lower(hex(randomblob(6)))"
)
#: The database's clock as Django's ``Now()`` writes it on SQLite.
_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"


def _tables(apps) -> tuple[str, str, str]:
    """The runs', the events' and the dead letters' tables."""
    runs, events, letters = (apps.get_model("runs", name)._meta.db_table for name in MODELS)
    return runs, events, letters


def _execute(schema_editor, sql: str) -> None:
    # No parameters: the SQL holds % signs (strftime) no driver may read.
    schema_editor.execute(sql, None)


def create_triggers(apps, schema_editor) -> None:
    runs, events, letters = _tables(apps)
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        _execute(
            schema_editor,
            f"CREATE OR REPLACE FUNCTION {RUN_EVENT}() RETURNS trigger AS $$ BEGIN "
            f"INSERT INTO {events} ({_COLUMNS}) VALUES (gen_random_uuid(), NEW.id, "
            f"'run.' || NEW.status, {_NEW}, NEW.webhook_url, statement_timestamp(), "
            f"statement_timestamp()); RETURN NULL; END $$ LANGUAGE plpgsql",
        )
        _execute(
            schema_editor,
            f"CREATE TRIGGER {RUN_EVENT} AFTER UPDATE OF status ON {runs} FOR EACH ROW "
            f"WHEN ({_WHEN}) EXECUTE FUNCTION {RUN_EVENT}()",
        )
        # now(): the transaction's start, before any statement of it.
        _execute(
            schema_editor,
            f"CREATE OR REPLACE FUNCTION {DEAD_LETTER}() RETURNS trigger AS $$ BEGIN "
            f"UPDATE {events} SET dead_lettered = true WHERE id = (SELECT id FROM {events} "
            f"WHERE run_id = NEW.run_id AND event_type = 'run.failed' AND attempts = 0 "
            f"AND occurred_at >= now() ORDER BY occurred_at DESC LIMIT 1); "
            f"RETURN NULL; END $$ LANGUAGE plpgsql",
        )
        _execute(
            schema_editor,
            f"CREATE TRIGGER {DEAD_LETTER} AFTER INSERT ON {letters} FOR EACH ROW "
            f"EXECUTE FUNCTION {DEAD_LETTER}()",
        )
    elif vendor == "sqlite":
        _execute(
            schema_editor,
            f"CREATE TRIGGER IF NOT EXISTS {RUN_EVENT} AFTER UPDATE OF status ON {runs} "
            f"FOR EACH ROW WHEN {_WHEN.replace('IS DISTINCT FROM', 'IS NOT')} BEGIN "
            f"INSERT INTO {events} ({_COLUMNS}) VALUES ({_SQLITE_UUID}, NEW.id, "
            f"'run.' || NEW.status, {_NEW}, NEW.webhook_url, {_SQLITE_NOW}, {_SQLITE_NOW}); END",
        )
        # The run's newest event: the one its status change inserted just before.
        _execute(
            schema_editor,
            f"CREATE TRIGGER IF NOT EXISTS {DEAD_LETTER} AFTER INSERT ON {letters} "
            f"FOR EACH ROW BEGIN UPDATE {events} SET dead_lettered = 1 WHERE rowid = ("
            f"SELECT rowid FROM {events} WHERE run_id = NEW.run_id ORDER BY rowid DESC "
            f"LIMIT 1) AND event_type = 'run.failed' AND attempts = 0; END",
        )


def drop_triggers(apps, schema_editor) -> None:
    runs, _, letters = _tables(apps)
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        _execute(schema_editor, f"DROP TRIGGER IF EXISTS {RUN_EVENT} ON {runs}")
        _execute(schema_editor, f"DROP FUNCTION IF EXISTS {RUN_EVENT}()")
        _execute(schema_editor, f"DROP TRIGGER IF EXISTS {DEAD_LETTER} ON {letters}")
        _execute(schema_editor, f"DROP FUNCTION IF EXISTS {DEAD_LETTER}()")
    elif vendor == "sqlite":
        _execute(schema_editor, f"DROP TRIGGER IF EXISTS {RUN_EVENT}")
        _execute(schema_editor, f"DROP TRIGGER IF EXISTS {DEAD_LETTER}")
