"""``manage.py ensure_admin``: the superuser 'admin', created once.

``make run`` calls it last before serving, with ``--url`` and
``--password-file``: its output is then the block an operator reads to log
in — the admin's address, the user, and the password or where it is —
and a generated password is kept in that file (``var/``, beside the SQLite
database and the secret key), so a later ``make run`` can say where it is."""

import os
import secrets
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

#: Sets the password of an 'admin' created here (read in ``handle``).
PASSWORD_VARIABLE = "NRLLM_ADMIN_PASSWORD"
#: The demo's team members (``seed_demo``): made without a password, they
#: get the admin's when it is created here, so ``make run`` tells one.
DEMO_MEMBERS_GROUP = "demo team members"


class Command(BaseCommand):
    help = (
        "Create the superuser 'admin' if it does not exist. The password comes from "
        f"{PASSWORD_VARIABLE}, or is generated, printed and (with --password-file) kept "
        "in a file. Ends with how to log in: the address (--url), the user, the password."
    )

    def add_arguments(self, parser):
        parser.add_argument("--url", default="", help="the admin's address, to print")
        parser.add_argument(
            "--password-file",
            default="",
            help="where a generated password is kept (readable by its owner only)",
        )

    def handle(self, *args, url, password_file, **options):
        kept = Path(password_file) if password_file else None
        given = os.environ.get("NRLLM_ADMIN_PASSWORD", "")
        users = get_user_model().objects
        admin = users.filter(username="admin").first()
        if admin is None:
            password = given or secrets.token_urlsafe(12)
            users.create_superuser("admin", "admin@localhost", password)
            _demo_members_given(password)
            if given:
                told = f"the one {PASSWORD_VARIABLE} gives"
            else:
                told = f"{password}  (generated now"
                if kept is not None:
                    _keep(kept, password)
                    told += f"; kept in {kept}"
                told += ")"
        else:
            told = _whereabouts(admin, given, kept)
        self._tell(url, told, _demo_members())

    def _tell(self, url: str, password: str | list[str], members: list[str]) -> None:
        """The block that ends the output: what an operator needs to log in
        (a password's words on lines of their own, to keep it narrow), and
        the demo's team members, who log in with the same password."""
        said = [password] if isinstance(password, str) else password
        lines = ([f"The admin:  {url}"] if url else []) + [
            "user:       admin",
            f"password:   {said[0]}",
            *(f"            {line}" for line in said[1:]),
        ]
        if members:
            lines.append(f"teams:      {', '.join(members)} (same password)")
        rule = "-" * max(len(line) for line in lines)
        self.stdout.write("\n".join(["", rule, *lines, rule]))


def _demo_members() -> list[str]:
    return list(
        get_user_model()
        .objects.filter(groups__name=DEMO_MEMBERS_GROUP)
        .order_by("pk")
        .values_list("username", flat=True)
    )


def _demo_members_given(password: str) -> None:
    """The demo's members who have no password yet get ``password``."""
    for member in get_user_model().objects.filter(groups__name=DEMO_MEMBERS_GROUP):
        if not member.has_usable_password():
            member.set_password(password)
            member.save(update_fields=["password"])


def _keep(path: Path, password: str) -> None:
    """Write ``password`` to ``path``, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    # The mode above is a new file's: one already there (an earlier
    # database's) keeps its own until it is set, before the password is in it.
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(password + "\n")


def _whereabouts(admin, given: str, kept: Path | None) -> str | list[str]:
    """Where the password of an 'admin' made before is: never printed again.
    One it does not know it cannot tell apart: given by an earlier
    NRLLM_ADMIN_PASSWORD, or set since (``changepassword``)."""
    if given and admin.check_password(given):
        return f"the one {PASSWORD_VARIABLE} gives"
    if kept is not None and kept.is_file() and admin.check_password(kept.read_text().strip()):
        return f"in {kept} (generated when the account was made)"
    neither = f"{PASSWORD_VARIABLE}'s" + (f", nor the one kept in {kept}" if kept else "")
    return [
        "the one set when the account was made or since",
        f"(not {neither});",
        "`manage.py changepassword admin` sets another",
    ]
