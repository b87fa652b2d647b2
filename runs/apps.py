"""The Django app that holds runs, their steps, approvals and dead letters.
Its start sets up the process's traces, when the settings turn them on;
on SQLite, ``migrate`` puts the run-ended webhook's triggers back after
any table rebuild (``runs/migrations/_run_events.py``)."""

from django.apps import AppConfig
from django.db.models.signals import post_migrate, pre_migrate


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from ground import tracing
        from runs import checks  # noqa: F401  (registers them)

        # Here, before the first request loads the middleware: the request
        # spans' middleware is added to it (ground.otel_sdk).
        tracing.start_from_settings()
        pre_migrate.connect(_sqlite_triggers_dropped, sender=self)
        post_migrate.connect(_sqlite_triggers_created, sender=self)


def _sqlite_triggers_dropped(sender, using, **kwargs) -> None:
    """Before a SQLite migrate: no rebuild then trips over the triggers."""
    from django.apps import apps
    from django.db import connections

    from runs.migrations import _run_events, _team_cap, _team_fixed

    connection = connections[using]
    if connection.vendor == "sqlite":
        with connection.schema_editor() as schema_editor:
            _run_events.drop_triggers(apps, schema_editor)
            _team_fixed.drop_guard(apps, schema_editor)
            _team_cap.drop_guard(apps, schema_editor)


def _sqlite_triggers_created(sender, using, **kwargs) -> None:
    """After a SQLite migrate that leaves the events' table (0026) in place."""
    from django.apps import apps
    from django.db import connections

    from runs.migrations import _run_events, _team_cap, _team_fixed

    connection = connections[using]
    if connection.vendor != "sqlite":
        return
    tables = set(connection.introspection.table_names())
    needed = {apps.get_model("runs", name)._meta.db_table for name in _run_events.MODELS}
    if needed <= tables:
        with connection.schema_editor() as schema_editor:
            _run_events.create_triggers(apps, schema_editor)
    columns = {
        column.name
        for column in connection.introspection.get_table_description(
            connection.cursor(), apps.get_model("runs", "AgentRun")._meta.db_table
        )
    }
    if "team_id" in columns:
        with connection.schema_editor() as schema_editor:
            _team_fixed.create_guard(apps, schema_editor)
    held = apps.get_model("runs", "HeldRun")._meta.db_table
    if held in tables:
        with connection.schema_editor() as schema_editor:
            _team_cap.create_guard(apps, schema_editor)
