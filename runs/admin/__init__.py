"""The operator console: runs, steps, dead letters and writes in doubt in the
Django admin. Thin adapters over ``runs.operators.actions`` and
``runs.operators.requeue_safety``; nothing here writes a run's state itself."""

from runs.admin import runs, dead_letters, reconciliations  # noqa: F401, I001  (registers the ModelAdmins)
