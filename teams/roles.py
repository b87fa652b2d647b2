"""The roles a membership grants in one team, and the Django permissions
each role stands for (G22).

A global Django permission keeps its meaning: the role it belongs to, in
EVERY team (platform staff). A membership grants the same permissions in
its team only. Every role sees its team: each includes the viewer's.
"""

from django.db import models


class Role(models.TextChoices):
    VIEWER = "viewer", "viewer: sees the team's agents, runs and approvals"
    RUNNER = "runner", "runner: starts runs of the team's agents"
    OPERATOR = "operator", "operator: requeues, cancels, restarts, reconciles and reruns"
    APPROVER = "approver", "approver: decides calls that wait for approval"
    AUTHOR = "author", "author: defines and changes the team's agents"
    TEAM_ADMIN = "team_admin", "team admin: members, the team's tools, approvals and budget"


_SEES = frozenset(
    {
        "runs.view_agentrun",
        "runs.view_runstep",
        "runs.view_deadletter",
        "runs.view_approvalrequest",
        "runs.view_writereconciliation",
        "agents.view_agent",
        "agents.view_agentversion",
        # The deployment's tools are no team's: anyone who sees a team sees them.
        "tools.view_toolsetting",
        "teams.view_team",
        "teams.view_membership",
        "spend.view_teambudget",
        "triggers.view_schedule",
        "triggers.view_firing",
        "triggers.view_eventtrigger",
        "triggers.view_triggerevent",
    }
)

#: What each role may do, as the Django permissions the code already checks.
PERMISSIONS_OF_ROLE: dict[str, frozenset[str]] = {
    Role.VIEWER: _SEES,
    Role.RUNNER: _SEES | {"runs.add_agentrun"},
    Role.OPERATOR: _SEES
    | {
        "runs.requeue_agentrun",
        "runs.cancel_agentrun",
        "runs.reconcile_agentrun",
        "runs.rerun_past_write",
        "runs.dismiss_deadletter",
        "runs.change_deadletter",
        "triggers.pause_schedule",
    },
    Role.APPROVER: _SEES | {"runs.approve_write"},
    Role.AUTHOR: _SEES
    | {"agents.add_agent", "agents.change_agent", "agents.add_agentversion"}
    # Schedules and triggers start runs as their owner, who must be a runner too.
    | {"triggers.add_schedule", "triggers.change_schedule", "triggers.delete_schedule"}
    | {"triggers.add_eventtrigger", "triggers.change_eventtrigger"}
    | {"triggers.delete_eventtrigger"},
    Role.TEAM_ADMIN: _SEES
    | {"teams.change_team", "teams.add_membership", "teams.change_membership"}
    | {"teams.delete_membership"}
    | {"spend.add_teambudget", "spend.change_teambudget", "spend.delete_teambudget"},
}


#: Every permission some role grants: what a team's membership, or a token
#: narrowed to a team, can reach. Any other (tool settings, prices, users)
#: is the deployment's, held only globally.
TEAM_PERMISSIONS: frozenset[str] = frozenset().union(*PERMISSIONS_OF_ROLE.values())


def permissions_of(roles) -> frozenset[str]:
    """Every permission ``roles`` grant together."""
    return frozenset().union(*(PERMISSIONS_OF_ROLE[role] for role in roles))


def is_view(permission: str) -> bool:
    """Whether ``permission`` only shows (what a read-only token keeps)."""
    return permission.partition(".")[2].startswith("view_")
