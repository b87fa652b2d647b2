"""An agent and its versions (G18).

An ``Agent`` is a name teams start runs by; what it does is its versions.
Every change of the definition inserts a new ``AgentVersion``, numbered
1, 2, 3 … per agent, and never updates one: a run records the version it
started from, and its stored request is that version's definition, so
editing the agent never changes a run in flight or a resumed one.
"""

from django.conf import settings
from django.db import models

from spend.models import MONEY
from teams.models import DEFAULT_TEAM_ID


class Agent(models.Model):
    """The name and the latest version. ``latest`` moves only forward, in
    the transaction that inserts the version (``agents.versions.save``)."""

    TEAM_FIELD = "team"

    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    #: Its runs are this team's (G22); it never changes (a database trigger).
    team = models.ForeignKey(
        "teams.Team", on_delete=models.PROTECT, related_name="agents", db_default=DEFAULT_TEAM_ID
    )
    latest = models.ForeignKey(
        "AgentVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class AgentVersion(models.Model):
    """One definition of an agent, inserted once and never changed.

    Its fields are what a run's request holds (``runs.runtime.run_request``):
    ``instructions`` become the system message, the rest are offered tools,
    the provider, the approvals asked for and the limits. ``webhook`` hears
    when each run of it ends (G19)."""

    TEAM_FIELD = "agent__team"

    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    instructions = models.TextField(blank=True)
    provider = models.JSONField()
    tools = models.JSONField(default=list)
    require_approval = models.JSONField(default=list)
    max_iterations = models.PositiveIntegerField()
    max_total_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    max_cost = models.DecimalField(**MONEY, null=True, blank=True)
    webhook = models.URLField(max_length=2000, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["agent", "-number"]
        constraints = [
            # Two editors saving at once: one of them gets the next number.
            models.UniqueConstraint(fields=["agent", "number"], name="agent_version_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.agent.name} v{self.number}"

    def definition(self) -> dict:
        """The version as a definition (``agents.definitions``' format)."""
        return {
            "instructions": self.instructions,
            "provider": self.provider,
            "tools": list(self.tools),
            "require_approval": list(self.require_approval),
            "max_iterations": self.max_iterations,
            "max_total_tokens": self.max_total_tokens,
            "max_cost": None if self.max_cost is None else format(self.max_cost.normalize(), "f"),
            "webhook": self.webhook,
        }
