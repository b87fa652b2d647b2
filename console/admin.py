"""Every ModelAdmin of the console, registered on the project's admin site
when Django's autodiscovery imports this module: runs, dead letters and
reconciliations; agents; spend; tools."""

from console import agents, dead_letters, reconciliations, runs, spend, tools  # noqa: F401 (registers the ModelAdmins)
