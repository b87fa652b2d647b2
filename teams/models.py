"""Teams, their members' roles, and API tokens narrowed to a team (G22).

A team owns agents and, through them, runs; a membership is one role of
one user in one team (a user with two roles has two rows, each granted,
and logged, on its own). ``DEFAULT_TEAM_ID`` is the team every row of a
deployment from before teams went to (migration 0001); a row inserted
without a team goes there too (the columns' database default).
"""

from django.conf import settings
from django.db import models

from teams.roles import Role

#: The ``default`` team: created first by this app's first migration.
DEFAULT_TEAM_ID = 1


class Team(models.Model):
    """A group of people who share agents, runs, approvals and budgets.

    ``tools``: the deployment's tools this team may use (None: all of
    them); a run naming another is refused at enqueue. ``require_approval``:
    tools whose calls wait for approval in this team although the
    deployment's policy does not ask it; a team can only add approvals.
    ``webhook_secret``: what its runs' run-ended webhooks are signed with
    (G19), so one team cannot forge another's events; blank: the
    deployment's ``NRLLM_RUN_WEBHOOK_SECRET``. Write-only: never shown
    once set. ``max_running``: the most of its runs ``running`` at once
    (None: no cap); a claim past it is refused by the database and the run
    waits, held, for one of the team's runs to stop running (G22)."""

    TEAM_FIELD = "id"

    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=50, unique=True)
    tools = models.JSONField(
        null=True, blank=True, help_text="tool names this team may use; empty: every tool"
    )
    require_approval = models.JSONField(default=list, blank=True)
    webhook_secret = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="signs this team's run webhooks; blank: the deployment's secret",
    )
    max_running = models.PositiveIntegerField(
        "runs in flight at most",
        null=True,
        blank=True,
        help_text="the most of this team's runs running at once, whatever the workers' free "
        "slots; the others wait queued. Empty: no cap; 0: the team's runs wait (a pause)",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.slug

    def may_use(self, tool_name: str) -> bool:
        return self.tools is None or tool_name in self.tools


class Membership(models.Model):
    """One role of one user in one team."""

    TEAM_FIELD = "team"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_memberships"
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team", "user", "role"]
        constraints = [
            models.UniqueConstraint(fields=["user", "team", "role"], name="membership_unique")
        ]
        indexes = [models.Index(fields=["team", "role"], name="membership_team_role_idx")]

    def __str__(self) -> str:
        return f"{self.user} {self.role} in {self.team}"


class TokenScope(models.Model):
    """How far one API token reaches, below its user's roles: one team
    (None: every team of the user) and, if ``read_only``, views only.
    A token never exceeds its user's roles as they are at each request."""

    token = models.OneToOneField(
        "knox.AuthToken", primary_key=True, on_delete=models.CASCADE, related_name="scope"
    )
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE)
    read_only = models.BooleanField(default=False)

    def __str__(self) -> str:
        team = self.team.slug if self.team_id else "every team"
        return f"{team}{', read-only' if self.read_only else ''}"
