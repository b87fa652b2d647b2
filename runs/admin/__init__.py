"""The operator console: runs, steps, dead letters and writes in doubt in the
Django admin. Thin adapters over ``runs.operator_actions`` and
``runs.requeue_safety``; nothing here writes a run's state itself."""

from runs.admin import dead_letters, runs  # noqa: F401  (registers the ModelAdmins)
