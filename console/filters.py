"""List filters for runs, each backed by an index (see the model's Meta).

The rarer ones are folded (``Folded``): a laptop's screen shows the filters
operators reach for first, and a folded one opens when it is in use.
"""

from django.contrib import admin
from django.utils import timezone

from runs.models.selectors import offering_tool, writes_in_doubt
from runs.models.vocabulary import RunStatus
from tools.registry import get_registry


class Folded:
    """A filter drawn closed unless one of its choices is in use."""

    template = "admin/runs/_folded_filter.html"


class CollapsedChoicesFilter(Folded, admin.ChoicesFieldListFilter):
    """A field's choices, folded (the termination reasons: fourteen of them)."""


class WriteInDoubtFilter(admin.SimpleListFilter):
    title = "write in doubt"
    parameter_name = "write_in_doubt"

    def lookups(self, request, model_admin):
        return [("yes", "Yes: a write not reconciled that may have landed")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return writes_in_doubt(queryset)
        return queryset


class OffersToolFilter(admin.SimpleListFilter):
    title = "offers tool"
    parameter_name = "tool"
    #: Any name narrows the list (to the runs offering that tool; a name no
    #: run offers, to none): an MCP tool is not among the choices, and the
    #: bulk actions' "select all" takes it (``console.bulk_actions``).
    takes_any_value = True

    def lookups(self, request, model_admin):
        # Names and effects from code: no MCP server is asked to list its tools.
        registry = get_registry()
        return [(name, f"{name} ({registry.effect_for(name).value})") for name in registry.names()]

    def queryset(self, request, queryset):
        name = self.value()
        return offering_tool(queryset, name) if name else queryset


class RequeueCountFilter(Folded, admin.SimpleListFilter):
    """Fixed choices: listing the distinct values would scan the table."""

    title = "requeue count"
    parameter_name = "requeues"

    def lookups(self, request, model_admin):
        return [("0", "0"), ("1", "1"), ("2", "2"), ("3+", "3 or more")]

    def queryset(self, request, queryset):
        value = self.value()
        if value == "3+":
            return queryset.filter(requeue_count__gte=3)
        if value in ("0", "1", "2"):
            return queryset.filter(requeue_count=int(value))
        return queryset


class LeaseFilter(Folded, admin.SimpleListFilter):
    title = "lease"
    parameter_name = "lease"

    def lookups(self, request, model_admin):
        return [("held", "held (running, not expired)"), ("expired", "expired (reaper's)")]

    def queryset(self, request, queryset):
        now = timezone.now()
        if self.value() == "held":
            return queryset.filter(status=RunStatus.RUNNING, lease_expires_at__gte=now)
        if self.value() == "expired":
            return queryset.filter(status=RunStatus.RUNNING, lease_expires_at__lt=now)
        return queryset
