"""``manage.py ensure_admin``: the superuser 'admin', created once."""

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Create the superuser 'admin' if it does not exist. The password comes from "
        "NRLLM_ADMIN_PASSWORD, or is generated and printed once."
    )

    def handle(self, *args, **options):
        users = get_user_model().objects
        if users.filter(username="admin").exists():
            self.stdout.write("admin account exists; password unchanged")
            return
        password = os.environ.get("NRLLM_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
        users.create_superuser("admin", "admin@localhost", password)
        if os.environ.get("NRLLM_ADMIN_PASSWORD"):
            self.stdout.write("admin account created with NRLLM_ADMIN_PASSWORD")
        else:
            self.stdout.write(
                self.style.WARNING(f"admin account created; password (shown once): {password}")
            )
