"""The API's lookups, each through ``teams.access`` (G22).

An object of a team the request's user — as its token lets it — may not
see is not found: the same 404, with the same body, as one that does not
exist, so an answer never tells that another team's object is there. One
it sees but may not act on is a 403 naming the role the action takes in
its team. Views never filter by team by hand: they come here.
"""

import uuid

from rest_framework.exceptions import NotFound, PermissionDenied

from agents.models import Agent
from runs.models import AgentRun
from teams import access
from teams.roles import PERMISSIONS_OF_ROLE, Role

VIEW_RUNS = "runs.view_agentrun"
VIEW_AGENTS = "agents.view_agent"
#: Most roles include the permission to see; a permission to act is named
#: by the one role that grants it (team admin last: it is a role to
#: manage the team, not to work in it).
_ROLE_ORDER = [role for role in Role if role != Role.TEAM_ADMIN] + [Role.TEAM_ADMIN]


def role_granting(permission: str) -> str | None:
    """The name of the role that grants ``permission`` (the viewer's for a
    view permission), or None when no role does (it is held globally only)."""
    for role in _ROLE_ORDER:
        if permission in PERMISSIONS_OF_ROLE[role]:
            return role.value
    return None


def refusal(user, permission: str, team=None) -> str:
    """Why ``user`` may not use ``permission`` in ``team`` (a visible one;
    None: in any team): the token is read-only, or the role it takes."""
    scope = access.token_scope_of(user)
    if scope is not None and scope.read_only:
        return f"this API token is read-only: {permission!r} is not among what it may do"
    role = role_granting(permission)
    if role is None:
        return f"you need the permission {permission!r} (held for every team: no role grants it)"
    where = "a team" if team is None else f"team {team.slug!r}"
    return f"you need the {role} role in {where} (the permission {permission!r})"


def check_may(user, permission: str, team) -> None:
    """403, naming the role, unless ``user`` may use ``permission`` in ``team``."""
    if not access.may(user, permission, team.pk):
        raise PermissionDenied(refusal(user, permission, team))


def visible_runs(queryset, user):
    """``queryset`` of runs narrowed to those ``user`` may see."""
    return access.scoped(queryset, user, VIEW_RUNS)


def get_run(pk, user, permission: str = VIEW_RUNS, *, queryset=None) -> AgentRun:
    """The run ``pk`` names if ``user`` may see it, or a 404 that says why
    (malformed or unknown id; another team's is unknown). With an action's
    ``permission``: a 403 naming the role unless the user may use it in the
    run's team. ``queryset``: the runs to look in (relations prefetched)."""
    try:
        run_id = uuid.UUID(str(pk))
    except ValueError:
        raise NotFound(f"{pk!r} is not a run id (a UUID)") from None
    runs = AgentRun.objects.all() if queryset is None else queryset
    run = visible_runs(runs.filter(pk=run_id), user).select_related("team").first()
    if run is None:
        raise NotFound(f"no run {run_id}")
    if permission != VIEW_RUNS:
        check_may(user, permission, run.team)
    return run


def visible_agents(user):
    return access.scoped(Agent.objects.all(), user, VIEW_AGENTS)


def get_agent(name: str, user, permission: str = VIEW_AGENTS) -> Agent:
    """The agent named ``name`` if ``user`` may see it (else 404, as one
    that does not exist); with ``permission``, 403 naming the role unless
    the user may use it in the agent's team."""
    agent = visible_agents(user).select_related("team", "latest__agent", "latest__created_by")
    agent = agent.filter(name=name).first()
    if agent is None:
        raise NotFound(f"no agent named {name[:100]!r}")
    if permission != VIEW_AGENTS:
        check_may(user, permission, agent.team)
    return agent
