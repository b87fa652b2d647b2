"""``manage.py create_api_token``: a REST API token for a user."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from knox.models import AuthToken


class Command(BaseCommand):
    help = (
        "Create an API token for a user and print it once (only its hash is stored; "
        "revoke it by deleting it in the admin)."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user {username!r}")
        _, token = AuthToken.objects.create(user=user)
        self.stdout.write(token)
