"""Runs held back by their team's cap on runs in flight (G22).

A claim past the team's ``max_running`` is refused by the database itself
(``runs/migrations/_team_cap.py``), which records the run here in the same
statement: the run stays ``queued``, its job spent, and waits here rather
than in Redis. It is dispatched again when one of its team's runs stops
running (``runs.transitions.team_caps.wake_held``), by the worker that
stopped it or, at the latest, by the reaper's next pass.
"""

from django.db import models

#: The first key of the advisory lock a capped team's claims and wakes take
#: (the second is ``cap_lock_key`` of the team): a number the project uses
#: for nothing else.
CAP_LOCK_CLASS = 0x6E726370
#: The lock's second key is a 32-bit integer; a team's id may be larger.
LOCK_KEYS = 2_147_483_647


def cap_lock_key(team_id: int) -> int:
    """The team's key of the lock (two teams may share one: they then wait
    for each other's claims, nothing more). The trigger computes the same."""
    return team_id % LOCK_KEYS


class HeldRun(models.Model):
    """One queued run refused by its team's cap, until it is woken."""

    TEAM_FIELD = "team"

    run = models.OneToOneField(
        "runs.AgentRun", primary_key=True, on_delete=models.CASCADE, related_name="+"
    )
    team = models.ForeignKey("teams.Team", on_delete=models.CASCADE, related_name="+")
    held_at = models.DateTimeField()

    class Meta:
        # The team's held runs, oldest first: the order they are woken in.
        indexes = [models.Index(fields=["team", "held_at"], name="held_run_team_idx")]

    def __str__(self) -> str:
        return f"run {self.run_id} held by team {self.team_id}'s cap"
