"""The admin site: Django's, with one rule for every model admin on it —
ours and those Django (users, groups) and knox register alike: an action
whose selection holds something that is not an id of the model is refused
with a 400 naming it, and does nothing. Its index is the overview, and
every page's header counts the calls waiting for approval
(``runs.admin.overview``)."""

from django.contrib import admin
from django.contrib.admin import helpers
from django.core.exceptions import ValidationError
from django.template.response import TemplateResponse


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
    registered on it refuses a malformed selection: it is given
    ``RefusesMalformedSelection``, so one a library registers does too.

    The overview is imported where it is used: this module is imported
    while ``runs.admin`` registers its model admins, which import it."""

    site_header = "nrllm-ops"
    site_title = "nrllm-ops console"
    index_title = "Agent runs, their writes and their spend"
    # The app has no public site: Django's "View site" link led to a 404.
    site_url = None

    def each_context(self, request):
        from runs.admin.overview import header

        return {**super().each_context(request), **header(request)}

    def index(self, request, extra_context=None):
        """Django's index (its app list, in the sidebar) with the overview."""
        from runs.admin.overview import index_context

        return super().index(request, {**index_context(request), **(extra_context or {})})

    def register(self, model_or_iterable, admin_class=None, **options):
        admin_class = admin_class or admin.ModelAdmin
        if not issubclass(admin_class, RefusesMalformedSelection):
            admin_class = type(
                admin_class.__name__,
                (RefusesMalformedSelection, admin_class),
                {
                    "__module__": admin_class.__module__,
                    "__qualname__": admin_class.__qualname__,
                    "__doc__": admin_class.__doc__,
                },
            )
        super().register(model_or_iterable, admin_class, **options)
