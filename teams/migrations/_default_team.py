"""The default team: the team of every row from before teams (G22), and
of a row inserted without one (the team columns' database default,
``teams.models.DEFAULT_TEAM_ID``)."""

from django.core.management.color import no_style

DEFAULT_TEAM_ID = 1


def create_default_team(apps, schema_editor):
    """Make it if it is missing. Its id is given, so the id sequence is
    moved past it."""
    Team = apps.get_model("teams", "Team")
    alias = schema_editor.connection.alias
    if Team.objects.using(alias).filter(pk=DEFAULT_TEAM_ID).exists():
        return
    Team.objects.using(alias).create(id=DEFAULT_TEAM_ID, name="Default", slug="default")
    for statement in schema_editor.connection.ops.sequence_reset_sql(no_style(), [Team]):
        schema_editor.execute(statement)
