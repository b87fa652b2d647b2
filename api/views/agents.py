"""``/api/agents/``: define agents, change them (each change a new
version), read their versions (G18). Runs start by name at
``POST /api/runs/`` with ``{"agent": ..., "input": ...}``."""

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.response import Response

from agents.definitions import FIELDS, InvalidDefinition
from agents.models import Agent
from agents.versions import AgentChanged, AgentConflict, AgentForbidden, save_agent
from api import permissions, scoping
from api.agent_serializers import (
    AgentDefinitionSerializer,
    AgentSavedSerializer,
    AgentSerializer,
    AgentVersionSerializer,
)
from api.errors import Conflict
from api.views.base import BaseAPIView, errors
from teams import access
from teams.models import Team
from tools.canonical import storable_text

ADD_PERMISSION = "agents.add_agent"
CHANGE_PERMISSION = "agents.change_agent"
VIEW = permissions.requires(scoping.VIEW_AGENTS)
ADD = permissions.requires(ADD_PERMISSION)
CHANGE = permissions.requires(CHANGE_PERMISSION)


def get_agent(name: str, user, permission: str = scoping.VIEW_AGENTS) -> Agent:
    """The agent ``name`` if ``user`` may see it, else a 404 as for none
    (``api.scoping``); 403 naming the role without ``permission`` in its team."""
    return scoping.get_agent(name, user, permission)


def _team_to_author_in(body: dict, user) -> Team:
    """The team a new agent belongs to: the one ``team`` names, among those
    where ``user`` (as its token lets it) may define agents; left out, the
    only such team. 400 naming ``team`` otherwise (another team's slug is
    as unknown as one that does not exist)."""
    authorable = access.scoped(Team.objects.all(), user, ADD_PERMISSION)
    if "team" in body:
        slug = body["team"]
        if not isinstance(slug, str) or not slug:
            raise ValidationError({"team": ["a team's slug (a string) is required"]})
        team = authorable.filter(slug=storable_text(slug)[:50]).first()
        if team is None:
            raise ValidationError({"team": [f"no team {slug[:100]!r} you may define agents in"]})
        return team
    teams = list(authorable[:2])
    if len(teams) == 1:
        return teams[0]
    if not teams:
        raise PermissionDenied(scoping.refusal(user, ADD_PERMISSION, None))
    raise ValidationError(
        {"team": ["you may define agents in more than one team; name the team (its slug)"]}
    )


def _body(request) -> dict:
    if not isinstance(request.data, dict):
        raise ValidationError({"request": ["the body must be a JSON object"]})
    return request.data


#: A PATCH made on a version another change replaced meanwhile is made
#: again on the new one, this many times at most (then 409).
PATCH_TRIES = 3


def _saved(
    name: str, definition: dict, request, *, description, create: bool, based_on=None, team=None
) -> Response:
    try:
        agent, _, new = save_agent(
            name,
            definition,
            description=description,
            user=request.user,
            create=create,
            based_on=based_on,
            team=team,
        )
    except AgentChanged:
        raise
    except AgentForbidden as error:
        # Checked before too; the roles may have changed since (G22).
        raise PermissionDenied(str(error).partition(": ")[2] or str(error)) from None
    except InvalidDefinition as error:
        field, _, rest = str(error).partition(": ")
        raise ValidationError({field.split("/")[0]: [rest or str(error)]}) from None
    except AgentConflict as error:
        raise Conflict("agent_exists", str(error)) from None
    agent = get_agent(agent.name, request.user)
    return Response(
        {"agent": AgentSerializer(agent).data, "new_version": new},
        status=status.HTTP_201_CREATED if create else status.HTTP_200_OK,
    )


def _description(body: dict):
    value = body.get("description")
    if value is not None and not isinstance(value, str):
        raise ValidationError({"description": ["must be a string"]})
    if value is not None and storable_text(value) != value:
        unstorable = "contains a character that cannot be stored (NUL or a lone surrogate)"
        raise ValidationError({"description": [unstorable]})
    return value


class AgentListCreate(BaseAPIView):
    """Agents: GET lists them with their latest version; POST defines one (version 1)."""

    def get_permissions(self):
        return [ADD()] if self.request.method == "POST" else [VIEW()]

    @extend_schema(responses={200: AgentSerializer(many=True), **errors()})
    def get(self, request):
        # The agents of the teams the user (as its token lets it) may see (G22).
        agents = scoping.visible_agents(request.user)
        agents = agents.select_related("team", "latest__agent", "latest__created_by")
        return Response(AgentSerializer(agents, many=True).data)

    @extend_schema(
        request=AgentDefinitionSerializer,
        responses={201: AgentSavedSerializer, **errors(400, 409, 413)},
    )
    def post(self, request):
        body = _body(request)
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise ValidationError({"name": ["required: the agent's name (a string)"]})
        try:
            Agent._meta.get_field("name").clean(name, None)
        except DjangoValidationError as error:
            raise ValidationError({"name": error.messages}) from None
        definition = {key: value for key, value in body.items() if key in FIELDS}
        unknown = sorted(set(body) - set(FIELDS) - {"name", "description", "team"})
        if unknown:
            raise ValidationError({"definition": [f"unknown field(s) {unknown}"]})
        team = _team_to_author_in(body, request.user)
        return _saved(
            name, definition, request, description=_description(body), create=True, team=team
        )


class AgentDetail(BaseAPIView):
    """One agent: GET it with its latest version; PATCH changes it (a new
    version when the definition changes; fields left out keep the latest's)."""

    http_method_names = ["get", "patch", "options", "head"]

    def get_permissions(self):
        return [CHANGE()] if self.request.method == "PATCH" else [VIEW()]

    @extend_schema(responses={200: AgentSerializer, **errors(404)})
    def get(self, request, name):
        return Response(AgentSerializer(get_agent(name, request.user)).data)

    @extend_schema(
        request=AgentDefinitionSerializer,
        responses={200: AgentSavedSerializer, **errors(400, 404, 409, 413)},
    )
    def patch(self, request, name):
        agent = get_agent(name, request.user, CHANGE_PERMISSION)
        body = _body(request)
        if "team" in body:
            raise ValidationError({"team": ["an agent's team never changes"]})
        unknown = sorted(set(body) - set(FIELDS) - {"description"})
        if unknown:
            raise ValidationError(
                {"definition": [f"unknown field(s) {unknown} (a name cannot change)"]}
            )
        description = _description(body)
        changes = {key: value for key, value in body.items() if key in FIELDS}
        for _ in range(PATCH_TRIES):
            # The fields left out are the latest version's when it saves
            # (G18): one another PATCH made meanwhile is kept, never undone.
            latest = agent.latest
            definition = latest.definition() if latest else {}
            try:
                return _saved(
                    name,
                    {**definition, **changes},
                    request,
                    description=description,
                    create=False,
                    based_on=latest.number if latest else None,
                )
            except AgentChanged as error:
                changed, agent = error, get_agent(name, request.user, CHANGE_PERMISSION)
        raise Conflict("agent_changed", str(changed).partition(": ")[2])


class AgentVersionList(BaseAPIView):
    """Every version of an agent, newest first."""

    permission_classes = [VIEW]

    @extend_schema(responses={200: AgentVersionSerializer(many=True), **errors(404)})
    def get(self, request, name):
        agent = get_agent(name, request.user)
        versions = agent.versions.select_related("agent", "created_by").order_by("-number")
        return Response(AgentVersionSerializer(versions, many=True).data)


class AgentVersionDetail(BaseAPIView):
    """One version of an agent, as it was saved (never changed since)."""

    permission_classes = [VIEW]

    @extend_schema(responses={200: AgentVersionSerializer, **errors(404)})
    def get(self, request, name, number):
        version = get_agent(name, request.user).versions.select_related("agent", "created_by")
        version = version.filter(number=number).first()
        if version is None:
            raise NotFound(f"agent {name!r} has no version {number}")
        return Response(AgentVersionSerializer(version).data)
