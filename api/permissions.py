"""The admin's permissions, for the API: one per action, checked per view."""

from rest_framework.permissions import BasePermission


def requires(permission: str) -> type[BasePermission]:
    """A permission class requiring the Django permission ``permission``."""

    class HasPermission(BasePermission):
        message = f"you need the permission {permission!r}"

        def has_permission(self, request, view):
            user = request.user
            return bool(user and user.is_authenticated and user.has_perm(permission))

    HasPermission.__name__ = f"Requires_{permission.replace('.', '_')}"
    return HasPermission


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
