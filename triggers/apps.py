"""The triggers app: agents that run without a click (G23) — schedules,
and signed events from other systems."""

from django.apps import AppConfig


class TriggersConfig(AppConfig):
    name = "triggers"
    verbose_name = "Schedules and event triggers"
    default_auto_field = "django.db.models.BigAutoField"
