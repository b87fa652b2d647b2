"""``manage.py load_prices FILE --user NAME``: prices from a file (``spend.price_file``)."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from spend.price_file import PriceFileError, load_prices, parse_price_file


class Command(BaseCommand):
    help = "Create or change model prices from a JSON file; each change is an admin log entry."

    def add_arguments(self, parser):
        parser.add_argument("file", help="JSON: a list of {provider, model, *_per_million}")
        parser.add_argument("--user", required=True, help="the user the changes are logged under")

    def handle(self, *args, file, user, **options):
        try:
            loader = get_user_model().objects.get(username=user)
        except get_user_model().DoesNotExist:
            raise CommandError(f"--user: no user named {user!r}") from None
        try:
            with open(file, encoding="utf-8") as handle:
                entries = parse_price_file(handle.read())
        except OSError as error:
            raise CommandError(f"{file}: {error.strerror}") from None
        except (PriceFileError, UnicodeDecodeError) as error:
            raise CommandError(f"{file}: {error}") from None
        created, changed, unchanged = load_prices(entries, loader)
        self.stdout.write(f"prices: {created} created, {changed} changed, {unchanged} unchanged")
