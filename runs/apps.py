"""The Django app that holds runs, their steps, approvals and dead letters."""

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Agent runs"
    default_auto_field = "django.db.models.BigAutoField"
