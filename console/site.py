"""The admin site: Django's, with one rule for every model admin on it —
ours and those Django (users, groups) and knox register alike: an action
whose selection holds something that is not an id of the model is refused
with a 400 naming it, and does nothing. Its index is the overview, and
every page's header counts the calls waiting for approval
(``console.overview``); its app list (the sidebar's navigation) has the
operator pages too (``console.navigation``), and a 403 is a page in its
frame (``forbidden``)."""

from django.contrib import admin
from django.contrib.admin import helpers
from django.core.exceptions import ValidationError
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views import defaults

from teams import access


def malformed_selection(model_admin, request) -> str | None:
    """The first id selected for an action that cannot be an id of
    ``model_admin``'s model, or None when every one can."""
    pk = model_admin.model._meta.pk
    for selected in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
        try:
            pk.to_python(selected)
        except ValidationError:
            return selected
    return None


class RefusesMalformedSelection:
    """Django hands an action's selected ids to the database as they came
    (``filter(pk__in=...)``): ``abc`` for an integer id was a 500. Here the
    whole action is refused — none of the selection is acted on — with a
    400 page that names the id."""

    def response_action(self, request, queryset, *args, **kwargs):
        selected = malformed_selection(self, request)
        if selected is None:
            return super().response_action(request, queryset, *args, **kwargs)
        opts = self.model._meta
        return TemplateResponse(
            request,
            "admin/malformed_selection.html",
            {
                **self.admin_site.each_context(request),
                "title": "Malformed selection",
                "opts": opts,
                "selected": selected,
                "verbose_name": opts.verbose_name,
            },
            status=400,
        )


class TeamScoped:
    """Every model admin on the site shows only what its user may see, and
    changes or deletes only what it may (G22): its queryset — the list, its
    counts, searches, the change page, an action's selection — is
    ``teams.access.scoped`` by the model's view (or change) permission, and an object
    is changed or deleted only in a team where the user holds that
    permission. Another team's object is then not found, as a missing one."""

    def _permission(self, action: str) -> str:
        # A model admin's ``team_view_permission``: the permission whose
        # teams its list shows, when not the model's own view permission
        # (an agent's versions: ``agents.view_agent``). Not declared here:
        # this class comes first, and would hide the model admin's.
        explicit = getattr(self, "team_view_permission", None)
        if action == "view" and explicit:
            return explicit
        opts = self.model._meta
        return f"{opts.app_label}.{action}_{opts.model_name}"

    def get_queryset(self, request):
        # Change implies view, as Django's admin has it: a user who may
        # change a model's rows (in a team) sees them there.
        return access.scoped(
            super().get_queryset(request),
            request.user,
            self._permission("view"),
            self._permission("change"),
        )

    def _may(self, request, action: str, obj) -> bool:
        if obj is None:
            return True
        team_id = access.team_id_of(obj)
        return team_id is None or access.may(request.user, self._permission(action), team_id)

    def has_view_permission(self, request, obj=None):
        return super().has_view_permission(request, obj) and (
            self._may(request, "view", obj) or self._may(request, "change", obj)
        )

    def has_change_permission(self, request, obj=None):
        return super().has_change_permission(request, obj) and self._may(request, "change", obj)

    def has_delete_permission(self, request, obj=None):
        return super().has_delete_permission(request, obj) and self._may(request, "delete", obj)


class ReadOnly:
    """A model admin for history, which is never edited here: no add,
    change or delete, for anyone (runs, dead letters, the outbox)."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class AdminSite(admin.AdminSite):
    """``admin.site`` (``nrllm_ops.apps.AdminConfig``). Every model admin
    registered on it refuses a malformed selection and is scoped to its
    user's teams: it is given ``RefusesMalformedSelection`` and
    ``TeamScoped``, so one a library registers is too.

    The overview is imported where it is used: this module is imported
    while ``console`` registers its model admins, which import it."""

    site_header = "nrllm-ops"
    site_title = "nrllm-ops console"
    index_title = "Agent runs, their writes and their spend"
    # The app has no public site: Django's "View site" link led to a 404.
    site_url = None

    def get_urls(self):
        """Django's, but ``view_on_site`` finds nothing: no model here has a
        page outside the console (no ``get_absolute_url``), and Django's
        view looked up any content type's object, django-rq's table-less
        one too (a 500)."""
        from django.http import Http404
        from django.urls import path

        def no_site_page(request, content_type_id, object_id):
            raise Http404("no object here has a page outside the console")

        return [
            path(
                "r/<path:content_type_id>/<path:object_id>/",
                self.admin_view(no_site_page),
                name="view_on_site",
            )
            if getattr(pattern, "name", None) == "view_on_site"
            else pattern
            for pattern in super().get_urls()
        ]

    def each_context(self, request):
        from console.overview import header

        return {**super().each_context(request), **header(request)}

    def index(self, request, extra_context=None):
        """Django's index (its app list, in the sidebar) with the overview."""
        from console.overview import index_context

        return super().index(request, {**index_context(request), **(extra_context or {})})

    def get_app_list(self, request, app_label=None):
        """Django's, with the operator pages that are no model's list (the
        approvals inbox, the failed write audits) under the runs' app, first, and
        each entry marked ``current`` when the page shown is its own: the
        one whose address is the longest start of this page's (Django marks
        every entry whose address starts the page's — the runs list too, on
        the inbox under it)."""
        from console.navigation import operator_pages

        # The runs' app first: it is what the console is for.
        app_list = sorted(
            super().get_app_list(request, app_label), key=lambda app: app["app_label"] != "runs"
        )
        for app in app_list:
            if app["app_label"] == "runs":
                app["models"] = sorted(
                    [*app["models"], *operator_pages(request)], key=lambda entry: entry["name"]
                )
        entries = [entry for app in app_list for entry in app["models"]]
        containing = [
            entry
            for entry in entries
            if entry["admin_url"] and request.path.startswith(entry["admin_url"])
        ]
        current = max(containing, key=lambda entry: len(entry["admin_url"]), default=None)
        for entry in entries:
            entry["current"] = entry is current
        return app_list

    def register(self, model_or_iterable, admin_class=None, **options):
        admin_class = admin_class or admin.ModelAdmin
        if not issubclass(admin_class, RefusesMalformedSelection):
            admin_class = type(
                admin_class.__name__,
                (RefusesMalformedSelection, TeamScoped, admin_class),
                {
                    "__module__": admin_class.__module__,
                    "__qualname__": admin_class.__qualname__,
                    "__doc__": admin_class.__doc__,
                },
            )
        super().register(model_or_iterable, admin_class, **options)


def forbidden(request, exception):
    """The project's 403 (``handler403``): for a staff user, a page in the
    admin's frame — its header, breadcrumbs and navigation — saying what
    was refused and leading back (to the page they came from when it is
    this site's, else the index), not Django's bare "403 Forbidden".
    Anyone else gets Django's page. Under ``/api/`` the project's
    ``handler403`` (``nrllm_ops/urls.py``) answers in the API's shape
    instead (``api.errors.in_the_api_shape``) and never calls this."""
    user = getattr(request, "user", None)
    if not (user is not None and user.is_active and user.is_staff):
        return defaults.permission_denied(request, exception)
    came_from = request.headers.get("Referer", "")
    if came_from == request.build_absolute_uri() or not url_has_allowed_host_and_scheme(
        came_from, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        came_from = ""
    reason = exception.args[0] if exception and exception.args else ""
    return TemplateResponse(
        request,
        "admin/forbidden.html",
        {
            **admin.site.each_context(request),
            "title": "Not allowed",
            "reason": reason if isinstance(reason, str) else "",
            "came_from": came_from,
            "index_url": reverse("admin:index"),
        },
        status=403,
    ).render()
