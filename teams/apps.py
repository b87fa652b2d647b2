"""The teams app: who belongs to which team in which role, and the one
layer that scopes every query a person or a token reaches (G22)."""

from django.apps import AppConfig
from django.db.models.signals import post_migrate, pre_delete


class TeamsConfig(AppConfig):
    name = "teams"
    verbose_name = "Teams"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from teams.models import Team

        post_migrate.connect(_default_team_kept, sender=self)
        pre_delete.connect(_narrowed_tokens_deleted, sender=Team)


def _narrowed_tokens_deleted(sender, instance, using, **kwargs) -> None:
    """A team's deletion deletes the tokens narrowed to it, in the same
    transaction: without their narrowing they would reach every team of
    their user (the narrowing row alone would go, by its cascade)."""
    from knox.models import AuthToken

    AuthToken.objects.using(using).filter(scope__team=instance).delete()


def _default_team_kept(sender, using, apps=None, **kwargs) -> None:
    """The default team after every migrate and flush, as Django keeps its
    content types: rows without a team are its (their columns' default)."""
    from django.db import connections

    from teams.migrations import _default_team

    if apps is None or not apps.is_installed("teams"):
        return
    with connections[using].schema_editor() as schema_editor:
        _default_team.create_default_team(apps, schema_editor)
