"""The guard that keeps a team's runs in flight within its cap (G22).

A run becomes ``running`` only by an UPDATE of its status, whichever code
path makes it (the one-statement claim, the ORM's, a future one): a
trigger on that UPDATE is the one place every path passes. For a run
whose team has a ``max_running``, it counts the team's runs ``running``
and, at the cap, skips the row (the claim matches nothing, as a claim of
a run another worker took) and records the run as held
(``runs.models.HeldRun``) in the same statement.

On PostgreSQL the count is exact under concurrent claims: the trigger
first takes a transaction-level advisory lock on the team, so the claims
of one capped team pass one at a time, and each counts with a snapshot
taken after the lock, which sees every claim committed before it (a lock
is released after its transaction's commit is visible). A run still
``running`` in a transaction not yet committed is counted: a claim can be
refused one run early, never let past the cap. Claims of uncapped teams
read the team's row and take no lock. On SQLite writes are serial.

Shared by the migration that creates it and, on SQLite, by ``runs.apps``,
which puts it back after a table rebuild drops it.
"""

from runs.models.team_caps import CAP_LOCK_CLASS, LOCK_KEYS

FUNCTION = "nrllm_team_cap"


def _tables(apps):
    return (
        apps.get_model("runs", "AgentRun")._meta.db_table,
        apps.get_model("runs", "HeldRun")._meta.db_table,
        apps.get_model("teams", "Team")._meta.db_table,
    )


def create_guard(apps, schema_editor):
    runs, held, teams = _tables(apps)
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(
            f"""
            CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger AS $$
            DECLARE cap integer; busy integer;
            BEGIN
                SELECT max_running INTO cap FROM {teams} WHERE id = NEW.team_id;
                IF cap IS NULL THEN RETURN NEW; END IF;
                PERFORM pg_advisory_xact_lock({CAP_LOCK_CLASS}, mod(NEW.team_id, {LOCK_KEYS})::integer);
                SELECT count(*) INTO busy FROM {runs}
                    WHERE team_id = NEW.team_id AND status = 'running';
                IF busy < cap THEN RETURN NEW; END IF;
                INSERT INTO {held} (run_id, team_id, held_at)
                    VALUES (NEW.id, NEW.team_id, statement_timestamp())
                    ON CONFLICT (run_id) DO NOTHING;
                RETURN NULL;
            END $$ LANGUAGE plpgsql
            """
        )
        schema_editor.execute(
            f"CREATE TRIGGER {FUNCTION} BEFORE UPDATE OF status ON {runs} FOR EACH ROW "
            f"WHEN (NEW.status = 'running' AND OLD.status <> 'running') "
            f"EXECUTE FUNCTION {FUNCTION}()"
        )
    elif vendor == "sqlite":
        cap = f"(SELECT max_running FROM {teams} WHERE id = NEW.team_id)"
        schema_editor.execute(
            f"""
            CREATE TRIGGER IF NOT EXISTS {FUNCTION} BEFORE UPDATE OF status ON {runs}
            FOR EACH ROW WHEN NEW.status = 'running' AND OLD.status <> 'running'
                AND {cap} IS NOT NULL
                AND (SELECT count(*) FROM {runs}
                     WHERE team_id = NEW.team_id AND status = 'running') >= {cap}
            BEGIN
                INSERT OR IGNORE INTO {held} (run_id, team_id, held_at)
                    VALUES (NEW.id, NEW.team_id, strftime('%Y-%m-%d %H:%M:%f', 'now'));
                SELECT RAISE(IGNORE);
            END
            """
        )


def drop_guard(apps, schema_editor):
    runs = _tables(apps)[0]
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {FUNCTION} ON {runs}")
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")
    elif vendor == "sqlite":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {FUNCTION}")
