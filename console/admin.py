"""Every ModelAdmin of the console, registered on the project's admin site
when Django's autodiscovery imports this module: runs, dead letters and
reconciliations; agents; schedules and event triggers; spend; tools;
teams and their members."""

from console import (  # noqa: F401 (registers the ModelAdmins)
    agents,
    dead_letters,
    event_triggers,
    reconciliations,
    runs,
    schedules,
    spend,
    teams,
    tokens,
    tools,
)
