"""``manage.py create_api_token``: a REST API token for a user, narrowed
to one team and/or read-only if asked (``teams.TokenScope``, G22)."""

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from knox.models import AuthToken

from teams import access
from teams.models import Team, TokenScope


class Command(BaseCommand):
    help = (
        "Create an API token for a user and print it once (only its hash is stored; "
        "revoke it by deleting it in the admin). --team narrows it to one team of the "
        "user's, --read-only to reading; it never exceeds the user's roles as they are "
        "at each request."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument(
            "--team",
            metavar="SLUG",
            help="narrow the token to this team (the user must be a member, or hold "
            "global permissions)",
        )
        parser.add_argument(
            "--read-only",
            action="store_true",
            help="the token may only read (GET); every other request is refused (403)",
        )

    def handle(self, *args, username, team=None, read_only=False, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user {username!r}")
        narrowed_to = None if team is None else _team_of(user, team)
        with transaction.atomic():
            # One transaction: a token is never out without its narrowing.
            auth_token, key = AuthToken.objects.create(user=user)
            if narrowed_to is not None or read_only:
                TokenScope.objects.create(token=auth_token, team=narrowed_to, read_only=read_only)
        self.stdout.write(key)


def _team_of(user, slug: str) -> Team:
    """The team ``slug`` names, if ``user`` is a member of it or holds a
    global permission (a Django permission of its own, not a team role's:
    it reaches every team); else a CommandError."""
    team = Team.objects.filter(slug=slug).first()
    if team is None:
        known = list(Team.objects.order_by("slug").values_list("slug", flat=True)[:20])
        raise CommandError(f"no team {slug!r}; teams: {', '.join(known)}")
    if team.pk in access.roles_by_team(user):
        return team
    if user.is_superuser or ModelBackend().get_all_permissions(user):
        return team
    raise CommandError(
        f"user {user.get_username()!r} is not a member of team {slug!r} and holds no "
        "global permission: a token cannot reach a team its user cannot"
    )
