"""Starting a run of an agent by name (G18).

A start is ``{"agent": "<name>", "input": "…"}``, optionally with
``"version": N`` (else the latest), ``"webhook"``, and per-run limits
(``max_iterations``, ``max_total_tokens``, ``max_cost``) that may only
lower the version's. It is expanded into the version's whole request —
its instructions, provider, tools, approvals and limits, with the input
as the prompt — and enqueued or run like any request, recording the
version: the run's stored request is that version, so no later edit of
the agent reaches the run, its retries or its resume.

A body without ``agent`` is a whole request, as before.

Every run is started in a team (G22): a start by agent in the agent's; a
whole request in the ``team`` it names (a slug), else the token's team,
else the one team its submitter may start runs in — otherwise it is
refused, naming ``team``. The submitter must hold the runner role there.
An agent another team owns is not found, as one that does not exist.
"""

import contextlib
from decimal import Decimal

from django.conf import settings

from agents.models import Agent, AgentVersion
from runs.runtime import enqueue as enqueue_request
from runs.runtime import run as run_request
from runs.runtime.json_text import shown
from runs.runtime.run_request import InvalidRunRequest, parse_run_request
from teams import access
from teams.models import Team
from tools.canonical import storable_text

#: The fields a start by agent may give.
START_FIELDS = (
    "agent",
    "version",
    "input",
    "webhook",
    "max_iterations",
    "max_total_tokens",
    "max_cost",
)
_LOWER_ONLY = ("max_iterations", "max_total_tokens", "max_cost")
VIEW_AGENT = "agents.view_agent"
START_RUNS = "runs.add_agentrun"


class StartForbidden(Exception):
    """The submitter may see the agent or the team but not start runs in
    it (the runner role); the message says which team."""


def enqueue(data, **recorded):
    """``runs.runtime.enqueue`` of ``data``: a whole request, or a start by
    agent, in its team (``team_of_start``)."""
    data, request, version, team = _started(data, recorded.get("submitted_by"))
    with _named(data, version):
        return enqueue_request(request, agent_version=version, team=team, **recorded)


def run(data, **recorded):
    """``runs.runtime.run`` (interactive) of ``data``, as ``enqueue`` takes it."""
    data, request, version, team = _started(data, recorded.get("submitted_by"))
    with _named(data, version):
        return run_request(request, agent_version=version, team=team, **recorded)


def _started(data, user):
    """``data`` without its ``team``, the request it starts, the agent
    version and the team it runs in. ``user`` None: the command line, which
    sees every agent and team."""
    named_team = None
    if isinstance(data, dict) and "team" in data and "agent" not in data:
        data = dict(data)
        named_team = data.pop("team")
    agents = Agent.objects if user is None else access.scoped(Agent.objects, user, VIEW_AGENT)
    request, version = expand(data, agents=agents)
    return data, request, version, team_of_start(named_team, version, user)


def team_of_start(named_team, version: AgentVersion | None, user) -> Team:
    """The team a start runs in (see the module's docstring). Raises
    ``InvalidRunRequest`` naming ``team`` when there is no one team to
    choose, and ``StartForbidden`` when ``user`` may not start runs there."""
    if version is not None:
        team = version.agent.team
        if user is not None and not access.may(user, START_RUNS, team.pk):
            raise StartForbidden(
                f"starting runs of agent {shown(version.agent.name)} takes the runner role "
                f"in team {shown(team.slug)}"
            )
        return team
    startable = Team.objects.all()
    if user is not None:
        startable = access.scoped(startable, user, START_RUNS)
    if named_team is not None:
        if not isinstance(named_team, str) or not named_team:
            raise InvalidRunRequest("team: a team's slug (a string) is required")
        if storable_text(named_team) != named_team:
            # No team is named so (a NUL, a lone surrogate), and the database
            # would refuse the question rather than answer it.
            raise InvalidRunRequest(
                "team: no team is named so (a slug holds no NUL and no lone surrogate)"
            )
        team = startable.filter(slug=named_team[:50]).first()
        if team is None:
            raise InvalidRunRequest(
                f"team: no team {shown(named_team[:100])} you may start runs in"
            )
        return team
    teams = list(startable[:2])
    if len(teams) == 1:
        return teams[0]
    if not teams:
        raise StartForbidden("starting runs takes the runner role in a team")
    raise InvalidRunRequest(
        "team: you may start runs in more than one team; name the team (its slug)"
    )


@contextlib.contextmanager
def _named(data, version: AgentVersion | None):
    """A refusal of what the version defined (a tool disabled since it was
    saved, a price gone) names the version; one of what the start gave
    names its field (``input`` for the prompt)."""
    try:
        yield
    except InvalidRunRequest as error:
        if version is None:
            raise
        field, _, rest = str(error).partition(":")
        field = field.split("/")[0]
        if field == "prompt":
            raise InvalidRunRequest(f"input:{rest}") from None
        if field in data:
            raise
        raise InvalidRunRequest(
            f"agent {shown(version.agent.name)} version {version.number}: {error}"
        ) from None


def expand(data, *, agents=None) -> tuple[dict, AgentVersion | None]:
    """The whole request ``data`` starts and the agent version it came
    from (None: ``data`` is a whole request, returned as it is). Raises
    ``InvalidRunRequest`` naming the field for a start that cannot be
    expanded; the request itself is checked when it is enqueued.
    ``agents``: those the start may name (None: every agent)."""
    if not isinstance(data, dict) or "agent" not in data:
        return data, None
    unknown = sorted(set(data) - set(START_FIELDS))
    if unknown:
        raise InvalidRunRequest(
            f"request: unknown field(s) {shown(unknown)} for a start by agent; "
            f"it takes {shown(list(START_FIELDS))}"
        )
    version = _version_of(data, Agent.objects if agents is None else agents)
    prompt = data.get("input")
    if not isinstance(prompt, str) or not prompt:
        raise InvalidRunRequest("input: the run's input is required (a non-empty string)")
    request = {
        "prompt": prompt,
        "tools": list(version.tools),
        "provider": version.provider,
        "max_iterations": version.max_iterations,
    }
    if version.instructions:
        request["instructions"] = version.instructions
    if version.require_approval:
        request["require_approval"] = list(version.require_approval)
    if version.max_total_tokens is not None:
        request["max_total_tokens"] = version.max_total_tokens
    if version.max_cost is not None:
        request["max_cost"] = format(version.max_cost.normalize(), "f")
    webhook = data.get("webhook", version.webhook)
    if webhook:
        request["webhook"] = webhook
    for name in _LOWER_ONLY:
        if name in data:
            limit = request.get(name, _deployment_default(name))
            request[name] = _lowered(name, data[name], limit, version, own=name in request)
    return request, version


def _deployment_default(name: str):
    """The limit a run of a version that leaves ``name`` blank gets when
    the start gives none either (None: no limit)."""
    if name == "max_total_tokens":
        return settings.NRLLM_RUN_MAX_TOTAL_TOKENS
    if name == "max_cost":
        return settings.NRLLM_RUN_MAX_COST
    return None


def _version_of(data: dict, agents) -> AgentVersion:
    name = data["agent"]
    if not isinstance(name, str) or not name:
        raise InvalidRunRequest("agent: an agent's name (a string) is required")
    if storable_text(name) != name:
        # No agent is named so (a NUL or a lone surrogate), and the database
        # would refuse the question rather than answer it; nor is the name
        # said back (a lone surrogate cannot be written in the answer).
        raise InvalidRunRequest(
            "agent: no agent is named so (a name holds no NUL or lone surrogate)"
        )
    agent = agents.select_related("latest", "team").filter(name=name).first()
    if agent is None or agent.latest is None:
        raise InvalidRunRequest(f"agent: no agent named {shown(name[:100])}")
    if "version" not in data:
        return agent.latest
    number = data["version"]
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        raise InvalidRunRequest(f"version: {shown(number)} is not a version number (1, 2, …)")
    version = agent.versions.filter(number=number).first()
    if version is None:
        raise InvalidRunRequest(
            f"version: agent {shown(name)} has no version {number} (latest: {agent.latest.number})"
        )
    return version


def _lowered(name: str, value, limit, version: AgentVersion, *, own: bool):
    """A per-run limit: as the request parser reads it, and never above the
    ``limit`` a run of the version gets without it (None: none) — the
    version's own, or (``own`` false) the deployment's default a version
    that leaves it blank takes."""
    if limit is None:
        return value
    try:
        above = (Decimal(str(value)) if name == "max_cost" else value) > (
            Decimal(limit) if name == "max_cost" else limit
        )
    except (ArithmeticError, TypeError, ValueError):
        return value  # malformed: the request parser names it
    if above:
        whose = f"agent {shown(version.agent.name)} version {version.number}'s {limit}"
        if not own:
            whose = (
                f"the deployment's {limit} (NRLLM_RUN_{name.upper()}), which agent "
                f"{shown(version.agent.name)} version {version.number} leaves in force"
            )
        raise InvalidRunRequest(f"{name}: {shown(value)} is above {whose}; a run may only lower it")
    return value


def rerun_request(run, *, new_input=None, version=None) -> tuple[dict | None, object]:
    """The whole request a rerun of ``run`` gets (G20), and the agent
    version it records — for the console's form and the API alike, so the
    two cannot differ. ``new_input`` replaces the prompt. ``version`` (a
    number) other than the one the run started from takes that version of
    the run's agent: the request is then its definition, as a start giving
    only the input gets it (its limits and webhook; what the original's
    start lowered or gave is not carried over). The run's own input and
    version change nothing: the original's request is kept whole, with the
    limits and webhook it was started with. Neither changed: ``(None,
    ...)``, the original's request and version. Raises
    ``InvalidRunRequest`` naming ``input`` or ``version``."""
    if new_input is not None and (not isinstance(new_input, str) or not new_input):
        raise InvalidRunRequest("input: the rerun's input must be a non-empty string")
    if new_input == run.prompt:
        new_input = None
    if version is not None and run.agent_version_id and version == run.agent_version.number:
        # Its own version again: re-expanding it would drop what the start
        # gave (5,000 tokens became the deployment's 100,000).
        version = None
    if version is None:
        if new_input is None:
            return None, ...
        # A stored request that is no object any more: the verdict refuses it.
        stored = run.request if isinstance(run.request, dict) else {}
        return _input_checked({**stored, "prompt": new_input}), ...
    if run.agent_version_id is None:
        raise InvalidRunRequest("version: this run was not started from an agent")
    agent = run.agent_version.agent
    start = {"agent": agent.name, "version": version, "input": new_input or run.prompt}
    request, chosen = expand(start)
    return _input_checked(request), chosen


def _input_checked(request: dict) -> dict:
    """``request``, unless its prompt (the rerun's input) is refused: then
    ``InvalidRunRequest`` naming ``input``. Anything else wrong is left for
    the verdict to refuse (the original's, or the version's)."""
    try:
        parse_run_request(request)
    except InvalidRunRequest as error:
        field, _, why = str(error).partition(":")
        if field.split("/")[0] == "prompt":
            raise InvalidRunRequest(f"input:{why}") from None
    return request
