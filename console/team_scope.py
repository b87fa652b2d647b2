"""What the console asks of ``teams.access`` besides a queryset (G22): the
words of a refusal, which name the role the act takes and the team it
was refused in; whether a list shows runs of more than one team (then it
has a team column and filter); and list filters whose choices are only
what their user may see.

The console never filters by team by hand: every queryset here is
``access.scoped``, every question about one object ``access.may``.
"""

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.utils.functional import SimpleLazyObject

from teams import access
from teams.models import Team
from teams.roles import PERMISSIONS_OF_ROLE, Role

VIEW_RUNS = "runs.view_agentrun"


def role_needed(permission: str) -> str:
    """The role that grants ``permission``, in words ("the operator
    role"); a permission no role grants is platform staff's."""
    for role in Role:
        if permission in PERMISSIONS_OF_ROLE[role]:
            return f"the {role.value} role"
    return f"the permission {permission!r} in every team (platform staff)"


def refusal(permission: str, team_id, doing: str) -> str:
    """Why ``doing`` was refused in ``team_id``: the role it takes, there."""
    slug = Team.objects.filter(pk=team_id).values_list("slug", flat=True).first()
    where = f" in team {slug!r}" if slug else ""
    return f"{doing} takes {role_needed(permission)}{where}"


def require(user, permission: str, obj, doing: str) -> None:
    """Refuse (403, naming the role and the team) unless ``user`` may use
    ``permission`` on ``obj`` — which the caller found among what the user
    may see: another team's object is a 404 before it gets here."""
    team_id = access.team_id_of(obj)
    if not access.may(user, permission, team_id):
        raise PermissionDenied(refusal(permission, team_id, doing))


def view_permission_of(model_admin) -> str:
    """The permission whose teams ``model_admin``'s list shows."""
    explicit = getattr(model_admin, "team_view_permission", None)
    if explicit:
        return explicit
    opts = model_admin.model._meta
    return f"{opts.app_label}.view_{opts.model_name}"


def shows_teams(request, permission: str) -> bool:
    """Whether a list of ``permission``'s objects may hold more than one
    team's for ``request``'s user, so that it has a team column and filter:
    for a member of several teams; for platform staff (the permission held
    in every team) once the deployment has two teams. A member of one team,
    or a deployment of one, gets none (the same word on every row). An
    action's POST, which draws no list, asks the database nothing."""
    teams = access.teams_with(request.user, permission)
    if teams is not access.EVERY:
        return len(teams) > 1
    if request.method != "GET":
        return False
    if not hasattr(request, "_nrllm_teams_exist"):
        request._nrllm_teams_exist = Team.objects.all()[:2].count() > 1
    return request._nrllm_teams_exist


class ScopedRelatedFilter(admin.RelatedFieldListFilter):
    """A foreign key's choices (a run's team, a version's agent), only
    those in the teams where the list's user may see its rows: Django's
    own lists every row of the related table."""

    def field_choices(self, field, request, model_admin):
        related = field.related_model
        ordering = self.field_admin_ordering(field, request, model_admin) or ()
        queryset = access.scoped(
            related._default_manager.all(), request.user, view_permission_of(model_admin)
        )
        # Read when the filter is drawn: a list's action builds its filters
        # too, and draws none.
        return SimpleLazyObject(
            lambda: [(obj.pk, str(obj)) for obj in queryset.order_by(*ordering)]
        )

    def has_output(self):
        return True  # without reading the choices (see field_choices)


class TeamColumn:
    """Mixed into a model admin of rows with a ``team``: a team column
    (after the first) and a team filter for a user whose list may hold
    more than one team's rows (``shows_teams``); none for a member of one
    team, to whom it would say the same word on every row."""

    def get_list_display(self, request):
        shown = list(super().get_list_display(request))
        if shows_teams(request, view_permission_of(self)) and "team_shown" not in shown:
            shown.insert(1, "team_shown")
        return shown

    def get_list_filter(self, request):
        filters = list(super().get_list_filter(request))
        if shows_teams(request, view_permission_of(self)):
            filters.insert(0, ("team", ScopedRelatedFilter))
        return filters

    def get_queryset(self, request):
        # Prefetched, not joined: a join with the teams table changes the
        # plans the list's filters and search were made for (at 1M runs the
        # prompt search went from 56 ms to 1.5 s, its trigram index scanned
        # once a team); a page's teams are one small query.
        return super().get_queryset(request).prefetch_related("team")

    @admin.display(description="team", ordering="team__slug")
    def team_shown(self, obj) -> str:
        return obj.team.slug
