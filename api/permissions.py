"""The admin's permissions, for the API: one per action, checked per view.

A view is open to a user who holds its permission in at least one team (or
globally), as its token lets it; what the view shows or acts on is then
scoped to those teams (``teams.access``, G22)."""

from rest_framework.permissions import BasePermission

from api.scoping import role_granting
from teams import access


def requires(permission: str) -> type[BasePermission]:
    """A permission class requiring the Django permission ``permission``."""

    class HasPermission(BasePermission):
        message = f"you need the permission {permission!r}{_as_role(permission)}"

        def has_permission(self, request, view):
            user = request.user
            return bool(user and user.is_authenticated and access.may_somewhere(user, permission))

    HasPermission.__name__ = f"Requires_{permission.replace('.', '_')}"
    return HasPermission


def _as_role(permission: str) -> str:
    """The role that grants ``permission`` in a team, as the refusal says it."""
    role = role_granting(permission)
    return f" (the {role} role in a team)" if role else " (held for every team)"


VIEW_RUNS = requires("runs.view_agentrun")
ADD_RUNS = requires("runs.add_agentrun")
REQUEUE = requires("runs.requeue_agentrun")
CANCEL = requires("runs.cancel_agentrun")
RECONCILE = requires("runs.reconcile_agentrun")
VIEW_DEAD_LETTERS = requires("runs.view_deadletter")
VIEW_TOOLS = requires("tools.view_toolsetting")
CHANGE_TOOLS = requires("tools.change_toolsetting")
#: Also checked by ``runs.approvals.actions`` itself, whatever the caller checked.
APPROVE = requires("runs.approve_write")
