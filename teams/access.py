"""The one scoping layer (G22): which teams a user, or a token, may act
in for a permission, and every queryset narrowed to them.

- A global Django permission (a superuser holds them all) is that role in
  EVERY team.
- A membership grants its role's permissions in its team only
  (``teams.roles``).
- A token narrowed by a ``TokenScope`` keeps its user's reach within its
  team, and only the view permissions if it is read-only; it never exceeds
  what the user holds at the moment of use.

A model scoped here names the path to its team in ``TEAM_FIELD`` (``team``
on a run, ``run__team`` on an approval), so this layer never imports the
layers above it. A model with none belongs to no team (the deployment's
tools, prices): anyone holding the permission in some team sees all of it.

Adapters never filter by team by hand: they ask ``scoped`` for what a user
may see, and ``may`` before acting on one object. Another team's object is
then simply not found (a 404), never a 403 telling it exists.
"""

from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import ObjectDoesNotExist

from teams.models import Membership, TokenScope
from teams.roles import TEAM_PERMISSIONS, is_view, permissions_of


class _Every:
    """Every team, present and future: what a global permission reaches."""

    def __repr__(self) -> str:
        return "EVERY"


EVERY = _Every()
_NONE: frozenset[int] = frozenset()
_ROLES_CACHE = "_team_roles_cache"
_GLOBAL = ModelBackend()
#: Set on the request's user by the API's token authentication.
TOKEN_SCOPE = "_token_scope"


def narrow(user, scope: TokenScope | None) -> None:
    """Mark ``user`` as acting through a token with ``scope`` (for this
    request only: the user object is the request's own)."""
    setattr(user, TOKEN_SCOPE, scope)


def token_scope_of(user) -> TokenScope | None:
    return getattr(user, TOKEN_SCOPE, None)


def roles_by_team(user) -> dict[int, frozenset[str]]:
    """The roles ``user``'s memberships grant, by team id (read once per
    user object, that is once per request)."""
    cached = getattr(user, _ROLES_CACHE, None)
    if cached is None:
        rows: dict[int, set[str]] = {}
        if getattr(user, "pk", None) is not None and user.is_active:
            for team_id, role in Membership.objects.filter(user_id=user.pk).values_list(
                "team_id", "role"
            ):
                rows.setdefault(team_id, set()).add(role)
        cached = {team_id: frozenset(roles) for team_id, roles in rows.items()}
        setattr(user, _ROLES_CACHE, cached)
    return cached


def forget(user) -> None:
    """Read ``user``'s roles and permissions anew at the next question
    (inside a transaction that has locked them, say)."""
    for cached in (_ROLES_CACHE, "_perm_cache", "_user_perm_cache", "_group_perm_cache"):
        if hasattr(user, cached):
            delattr(user, cached)


def held_still(user, team_id):
    """The team ``team_id`` as it is now, its row and ``user``'s memberships
    in it locked until the caller's transaction ends, and ``user``'s roles
    to be read anew: a decision judged after this cannot be overtaken by a
    team admin's change of the team's tools or a member's removal (those
    wait for its commit; one committed before is seen)."""
    from teams.models import Team

    team = Team.objects.select_for_update(no_key=True).get(pk=team_id)
    list(
        Membership.objects.select_for_update(no_key=True)
        .filter(user_id=user.pk, team_id=team_id)
        .values_list("pk", flat=True)
    )
    forget(user)
    return team


def holds_globally(user, permission: str) -> bool:
    """Whether ``user`` holds ``permission`` itself (every team), not
    through a membership."""
    if not user.is_active:
        return False
    return user.is_superuser or permission in _GLOBAL.get_all_permissions(user)


def teams_with(user, permission: str):
    """``EVERY``, or the frozenset of team ids where ``user`` (as its token
    lets it) may use ``permission``."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return _NONE
    scope = token_scope_of(user)
    if scope is not None and scope.read_only and not is_view(permission):
        return _NONE
    if holds_globally(user, permission):
        teams = EVERY
    else:
        teams = frozenset(
            team_id
            for team_id, roles in roles_by_team(user).items()
            if permission in permissions_of(roles)
        )
    if scope is not None and scope.team_id is not None:
        if permission not in TEAM_PERMISSIONS and not is_view(permission):
            # A token narrowed to a team acts on that team's objects only,
            # never on what is the deployment's (a tool's settings), even
            # when its user holds that globally.
            return _NONE
        if teams is EVERY or scope.team_id in teams:
            return frozenset({scope.team_id})
        return _NONE
    return teams


def may(user, permission: str, team_id) -> bool:
    """Whether ``user`` may use ``permission`` on an object of ``team_id``."""
    teams = teams_with(user, permission)
    return teams is EVERY or team_id in teams


def may_somewhere(user, permission: str) -> bool:
    """Whether ``user`` may use ``permission`` in at least one team: a
    page or an endpoint is open to it, and scopes what it shows."""
    teams = teams_with(user, permission)
    return teams is EVERY or bool(teams)


def scoped(queryset, user, permission: str, *or_permissions: str):
    """``queryset`` narrowed to the objects ``user`` may use ``permission``
    on (or any of ``or_permissions``): those of its teams, nothing for a
    user with none."""
    teams = teams_with(user, permission)
    for other in or_permissions:
        if teams is EVERY:
            break
        more = teams_with(user, other)
        teams = EVERY if more is EVERY else teams | more
    field = getattr(queryset.model, "TEAM_FIELD", None)
    if teams is EVERY:
        return queryset
    if field is None:
        return queryset if teams else queryset.none()
    if not teams:
        return queryset.none()
    return queryset.filter(**{f"{field}__in": sorted(teams)})


def team_id_of(obj):
    """The id of the team ``obj`` belongs to, by its model's ``TEAM_FIELD``
    (None for an object of no team)."""
    path = getattr(type(obj), "TEAM_FIELD", None)
    if path is None:
        return None
    *through, last = path.split("__")
    try:
        for name in through:
            obj = getattr(obj, name)
    except ObjectDoesNotExist:
        # A reconciliation outlives its run (retention): it has no team
        # left, and only what is scoped to every team reaches it.
        return None
    return obj.pk if last == "id" else getattr(obj, f"{last}_id")
