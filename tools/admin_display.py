"""How the tools page shows where a tool comes from, its availability and
an MCP server's hints beside the declared effect, and its filters.

Everything a server wrote (a description, a reason that quotes its error,
a schema) goes through ``format_html``'s escaping; the only markup is ours.
A tool is described once per request (``view_of`` keeps it on the row):
the list shows several columns of it.
"""

import json

from django.contrib import admin
from django.utils.html import format_html, format_html_join

from tools.operator_view import ToolSource, ToolView, describe_tool

#: The flag beside a hint that contradicts the declaration.
FLAG = "⚠"
_FLAG_STYLE = "color:#ba2121;font-weight:bold"
_MUTED_STYLE = "color:var(--body-quiet-color,#666)"


def view_of(setting) -> ToolView:
    """The setting's tool as operators see it, described once per row object."""
    view = getattr(setting, "_tool_view", None)
    if view is None:
        view = setting._tool_view = describe_tool(setting.name)
    return view


def source_html(view: ToolView):
    if view.source is ToolSource.MCP:
        return format_html("MCP server <strong>{}</strong>", view.server)
    return {
        ToolSource.BUILTIN: "builtin",
        ToolSource.CLASS: "tool class",
        ToolSource.UNKNOWN: "(no longer registered)",
    }[view.source]


def effect_html(view: ToolView):
    if view.declared:
        return view.effect.value
    if view.source is ToolSource.MCP:
        return format_html(
            '{} <span style="{}">(undeclared: the riskiest effect)</span>',
            view.effect.value,
            _MUTED_STYLE,
        )
    return format_html('{} <span style="{}">(unknown name)</span>', view.effect.value, _MUTED_STYLE)


def availability_html(view: ToolView):
    if view.available:
        return "available"
    return format_html(
        '<span class="tool-unavailable" style="{}">unavailable:</span> {}',
        _FLAG_STYLE,
        view.unavailable_reason,
    )


def hints_html(view: ToolView):
    """The stated hints, then each contradiction flagged; "—" for none."""
    if view.source is not ToolSource.MCP:
        return "—"
    stated = (
        format_html_join(
            ", ", "{}: {}", ((name, json.dumps(value)) for name, value in view.hints.items())
        )
        if view.hints
        else format_html('<span style="{}">{}</span>', _MUTED_STYLE, _no_hints(view))
    )
    if not view.hint_contradictions:
        return stated
    flags = format_html_join(
        "",
        '<div class="hint-flag" style="{}">{} {}</div>',
        ((_FLAG_STYLE, FLAG, text) for text in view.hint_contradictions),
    )
    return format_html(
        '{}{}<div style="{}">the declaration wins</div>', stated, flags, _MUTED_STYLE
    )


def _no_hints(view: ToolView) -> str:
    return "none stated" if view.available else "not known (not listed now)"


def parameters_html(view: ToolView):
    if view.parameters is None:
        return "—"
    return format_html(
        '<pre style="white-space:pre-wrap">{}</pre>',
        json.dumps(view.parameters, indent=2, sort_keys=True, ensure_ascii=False),
    )


# --- filters -----------------------------------------------------------------------


class _ViewFilter(admin.SimpleListFilter):
    """A filter on what ``describe_tool`` says: the rows whose view matches."""

    def matches(self, view: ToolView) -> bool:
        raise NotImplementedError

    def queryset(self, request, queryset):
        if self.value() is None:
            return queryset
        names = [setting.name for setting in queryset if self.matches(view_of(setting))]
        return queryset.filter(name__in=names)


class SourceFilter(_ViewFilter):
    title = "source"
    parameter_name = "source"

    def lookups(self, request, model_admin):
        from tools.registry import get_registry

        servers = [(f"mcp:{t.server}", f"MCP server {t.server}") for t in get_registry().toolsets]
        return [("builtin", "builtin"), ("class", "tool class"), *servers, ("unknown", "unknown")]

    def matches(self, view):
        if view.source is ToolSource.MCP:
            return self.value() == f"mcp:{view.server}"
        return self.value() == view.source.value


class FlaggedFilter(_ViewFilter):
    title = "hints contradict the declaration"
    parameter_name = "flagged"

    def lookups(self, request, model_admin):
        return [("yes", "flagged"), ("no", "not flagged")]

    def matches(self, view):
        return view.flagged == (self.value() == "yes")


class AvailableFilter(_ViewFilter):
    title = "availability"
    parameter_name = "available"

    def lookups(self, request, model_admin):
        return [("yes", "available"), ("no", "unavailable")]

    def matches(self, view):
        return view.available == (self.value() == "yes")
