"""The spend app: what model turns cost, and what submitters may spend (G17)."""

from django.apps import AppConfig


class SpendConfig(AppConfig):
    name = "spend"
    verbose_name = "Spend"
    default_auto_field = "django.db.models.BigAutoField"
