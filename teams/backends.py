"""Team roles as Django permissions, for the checks that ask whether a
user may use a page at all (the admin's ``has_view_permission`` and the
like): a role in some team answers yes, and ``teams.access.scoped`` then
narrows what the page shows to that team. Listed after Django's
``ModelBackend`` in ``AUTHENTICATION_BACKENDS``."""

from django.contrib.auth.backends import BaseBackend

from teams.access import roles_by_team
from teams.roles import permissions_of


class TeamRoleBackend(BaseBackend):
    """A user's team roles as permissions, in no particular object
    (object-level questions are ``teams.access.may``'s)."""

    def get_all_permissions(self, user_obj, obj=None):
        if obj is not None or not user_obj.is_active or user_obj.is_anonymous:
            return set()
        return set(permissions_of(set().union(*roles_by_team(user_obj).values())))

    def has_module_perms(self, user_obj, app_label):
        prefix = f"{app_label}."
        return any(
            permission.startswith(prefix) for permission in self.get_all_permissions(user_obj)
        )
