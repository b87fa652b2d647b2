"""Saving an agent: every change of its definition is a new version (G18).

``save_agent`` is the one writer of agents and their versions, for the
admin and the API alike: it checks the definition (``definitions``),
inserts version N+1 and moves ``Agent.latest`` to it in one transaction,
and writes the admin log entry. A version is never updated or deleted, so
a run that recorded one keeps what it ran.
"""

import json
from decimal import Decimal

from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.db import IntegrityError, transaction
from django.db.models import Max

from agents.definitions import InvalidDefinition, check_definition
from agents.models import Agent, AgentVersion
from teams import access
from teams.models import DEFAULT_TEAM_ID, Team


class AgentConflict(Exception):
    """Saving would clash with the agents as they are now (a name taken)."""


class AgentChanged(AgentConflict):
    """The agent has a newer version than the one the change was made on."""


class AgentForbidden(Exception):
    """The user may see the agent's team but not author agents in it."""


AUTHOR_PERMISSIONS = {True: "agents.add_agent", False: "agents.change_agent"}


def save_agent(
    name: str,
    definition: dict,
    *,
    description: str | None = None,
    user=None,
    create: bool,
    based_on: int | None = None,
    team=None,
) -> tuple[Agent, AgentVersion, bool]:
    """Create the agent ``name`` (``create``) or change it, from
    ``definition`` (checked; ``InvalidDefinition`` stores nothing). Returns
    the agent, its latest version and whether a new version was made: a
    definition equal to the latest one makes none (only a description
    changed, say). Raises ``Agent.DoesNotExist`` for a change of an agent
    that does not exist, ``AgentConflict`` for a name already taken.

    ``based_on``: the number of the version the change was made on (a
    PATCH's fields left out, an admin form's fields as it showed them).
    If another change made a newer version meanwhile, ``AgentChanged`` and
    nothing is stored: saving this one would silently undo that one.

    ``team``: the team a new agent belongs to (None: the default team); a
    changed agent keeps its own. With a ``user``, they must hold the author
    role there (``AgentForbidden``), and the definition's tools must be
    ones that team may use (``InvalidDefinition`` naming ``tools``), G22."""
    checked = check_definition(definition)
    with transaction.atomic():
        if create:
            team = team or Team.objects.get(pk=DEFAULT_TEAM_ID)
            _authored_in(team, user, create=True)
            _tools_of(team, checked)
            try:
                with transaction.atomic():
                    agent = Agent.objects.create(
                        name=name, description=description or "", team=team
                    )
            except IntegrityError:
                raise AgentConflict(f"name: an agent named {name!r} exists already") from None
        else:
            # The row lock orders two editors: the second numbers after the first.
            agent = Agent.objects.select_for_update().select_related("team").get(name=name)
            _authored_in(agent.team, user, create=False)
            _tools_of(agent.team, checked)
        latest = agent.latest
        if based_on is not None and latest is not None and latest.number != based_on:
            # Checked under the row lock: of two changes made on version N,
            # the second to lock sees N+1 here, never writes N+2 from N.
            raise AgentChanged(
                f"definition: agent {agent.name!r} was changed since version {based_on} "
                f"(its latest is version {latest.number}); make the change on that one"
            )
        described = not create and description is not None and description != agent.description
        if described:
            agent.description = description
            agent.save(update_fields=["description", "updated_at"])
        if latest is not None and _same(latest.definition(), checked):
            if described:
                _log(user, agent, CHANGE, f"description of {agent.name} changed; v{latest.number}")
            return agent, latest, False
        number = (agent.versions.aggregate(last=Max("number"))["last"] or 0) + 1
        version = AgentVersion.objects.create(
            agent=agent, number=number, created_by=user, **checked
        )
        Agent.objects.filter(pk=agent.pk).update(latest=version)
        agent.latest = version
        _log(
            user,
            agent,
            ADDITION if create else CHANGE,
            f"{'created' if create else 'changed'} {agent.name}: version {number}",
        )
    return agent, version, True


def _authored_in(team, user, *, create: bool) -> None:
    if user is not None and not access.may(user, AUTHOR_PERMISSIONS[create], team.pk):
        raise AgentForbidden(
            f"team: {'creating' if create else 'changing'} agents of team {team.slug!r} "
            f"takes the author role in it"
        )


def _tools_of(team, checked: dict) -> None:
    refused = [name for name in checked.get("tools", []) if not team.may_use(name)]
    if refused:
        raise InvalidDefinition(f"tools: not available to team {team.slug!r}: {refused}")


def _same(stored: dict, checked: dict) -> bool:
    """Equal as JSON (a cost limit compared as its amount, not its digits)."""

    def canonical(definition: dict) -> str:
        cost = definition.get("max_cost")
        amount = None if cost is None else str(Decimal(str(cost)).normalize())
        return json.dumps({**definition, "max_cost": amount}, sort_keys=True)

    return canonical(stored) == canonical(checked)


def _log(user, agent: Agent, flag: int, message: str) -> None:
    """The admin log entry of a save (Django's own history page shows it)."""
    if user is None:
        return
    LogEntry.objects.log_actions(
        user_id=user.pk,
        queryset=[agent],
        action_flag=flag,
        change_message=message,
        single_object=True,
    )
