"""The Django app of the REST API and what it must remember (run creation keys)."""

from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "api"
    verbose_name = "REST API"
    default_auto_field = "django.db.models.BigAutoField"
