"""The agents app: named, versioned agent definitions (G18)."""

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "agents"
    verbose_name = "Agent definitions"
    default_auto_field = "django.db.models.BigAutoField"
