"""The console as a Django app: its static files, and its ``admin`` module,
which Django's autodiscovery imports to register every ModelAdmin."""

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Operator console"
