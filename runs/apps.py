"""The Django app that holds runs, their steps, approvals and dead letters.
Its start sets up the process's traces, when the settings turn them on."""

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Agent runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from nrllm_ops import tracing

        # Here, before the first request loads the middleware: the request
        # spans' middleware is added to it (nrllm_ops.otel_sdk).
        tracing.start_from_settings()
