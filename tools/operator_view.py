"""What operators see of each tool, the same in the admin and the API:
where it comes from, the effect declared in code (G1), whether it can be
offered now and why not, and, for an MCP tool, the server's hints beside
the declaration — shown, flagged when they contradict it, never acted on.

Nothing here decides anything the runtime does: the effect is
``effect_for``'s (code only), availability is the registry's
(``unavailable``, the reason the enqueue refusal gives), and the hints are
the catalog's as the server stated them. An MCP server is asked only
through the catalog's cache (``tools.mcp.catalog``): once a minute per
process, every few seconds while it cannot be reached.

Settings rows: ``post_migrate`` gives every registered name one (declared
MCP tools included, without asking a server). A tool the server offers and
its toolset does not declare is known only from a listing, so the tools
pages (the admin's list, the API's list) call ``sync_tool_settings`` before
they read the rows, and the one-tool pages ``setting_for``: an operator
who can see such a tool can switch it off or require its approval.
"""

import enum
from dataclasses import dataclass, field

from tools.builtin import BUILTIN_TOOLS
from tools.effects import ToolEffect
from tools.mcp import catalog
from tools.mcp.declaration import Undeclared
from tools.models import ToolSetting
from tools.registry import get_registry

NOT_REGISTERED = "not registered: no tool class or MCP toolset in the running code names it"


class ToolSource(enum.StrEnum):
    """Where a tool comes from."""

    #: Shipped with nrllm-ops (``tools.builtin``).
    BUILTIN = "builtin"
    #: A tool class listed in ``NRLLM_TOOLS``.
    CLASS = "class"
    #: A tool of an MCP toolset listed in ``NRLLM_TOOLS`` (its ``server``).
    MCP = "mcp"
    #: Nothing in the running code names it (a setting outlived its tool).
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class ToolView:
    """One tool as operators see it; see ``describe_tool``."""

    name: str
    source: ToolSource
    #: The MCP toolset's server name; "" for any other tool.
    server: str
    description: str
    #: From code: the class's, the toolset's declaration, or
    #: ``non_idempotent_write`` (undeclared MCP tool, unknown name).
    effect: ToolEffect
    #: Whether code declares the effect: a tool class always does
    #: (declaring nothing is ``read_only``); an MCP tool when its toolset
    #: lists it.
    declared: bool
    #: Whether the running code registers it: a declared MCP tool is
    #: registered whether or not its server answers; an undeclared one
    #: while its server's listing offers it.
    registered: bool
    #: Whether a run can be offered it now ("" reason) or not (why).
    available: bool
    unavailable_reason: str
    #: The MCP annotations the server stated, as it stated them (untrusted).
    hints: dict[str, bool] = field(default_factory=dict)
    #: How ``hints`` contradict ``effect``; the declaration wins.
    hint_contradictions: list[str] = field(default_factory=list)
    #: The input schema: the class's, or the server's as listed.
    parameters: dict | None = None

    @property
    def flagged(self) -> bool:
        return bool(self.hint_contradictions)


def describe_tool(name: str) -> ToolView:
    """``name`` as operators see it. May ask an MCP server for its listing
    (through the catalog's cache); never raises over a server that cannot
    be reached: its tools are unavailable, with the reason."""
    registry = get_registry()
    effect = registry.effect_for(name)
    toolset = registry.toolset_of(name)
    if toolset is None:
        tool = registry.get(name)  # a tool class's: no server is asked
        if tool is None:
            return ToolView(
                name, ToolSource.UNKNOWN, "", "", effect, False, False, False, NOT_REGISTERED
            )
        source = ToolSource.BUILTIN if type(tool) in BUILTIN_TOOLS else ToolSource.CLASS
        return ToolView(
            name,
            source,
            "",
            tool.description,
            effect,
            True,
            True,
            True,
            "",
            {},
            [],
            tool.parameters,
        )
    remote_name = toolset.remote_name(name)
    declared = toolset.declaration(remote_name) is not None
    listed = catalog.listing(toolset).tools.get(name)
    if listed is not None:
        reason = ""
    elif not declared and toolset.undeclared is Undeclared.HIDE:
        reason = f"hidden: the toolset of {toolset.server!r} offers only the tools it declares"
    else:
        # The registry's reason, which the enqueue refusal gives too.
        reason = registry.unavailable([name]).get(name) or (
            f"MCP server {toolset.server!r} does not offer it"
        )
    return ToolView(
        name=name,
        source=ToolSource.MCP,
        server=toolset.server,
        description=listed.description if listed else "",
        effect=effect,
        declared=declared,
        registered=name in registry,
        available=listed is not None,
        unavailable_reason=reason,
        hints=dict(listed.hints) if listed else {},
        hint_contradictions=list(listed.contradictions) if listed else [],
        parameters=listed.parameters if listed else None,
    )


def sync_tool_settings() -> list[str]:
    """Give every tool the registry knows now a settings row; return the
    names that got one. Each MCP toolset is listed first (from the
    catalog's cache when fresh), so an undeclared tool its server offers is
    known. Two pages syncing at once insert each row once
    (``ignore_conflicts``); a server that cannot be reached adds nothing."""
    registry = get_registry()
    catalog.listings(registry.toolsets)
    names = registry.names()
    existing = set(ToolSetting.objects.filter(name__in=names).values_list("name", flat=True))
    missing = [name for name in names if name not in existing]
    if missing:
        ToolSetting.objects.bulk_create(
            [ToolSetting(name=name) for name in missing], ignore_conflicts=True
        )
    return missing


def setting_for(name: str) -> ToolSetting | None:
    """The settings row of ``name``, created if the registry knows the tool
    and it has none yet (an undeclared MCP tool no list page has synced);
    None for a name with neither."""
    setting = ToolSetting.objects.filter(name=name).first()
    if setting is not None or not _named_now(name):
        return setting
    ToolSetting.objects.bulk_create([ToolSetting(name=name)], ignore_conflicts=True)
    return ToolSetting.objects.filter(name=name).first()


def _named_now(name: str) -> bool:
    """Whether code or a listing names the tool now. Not ``name in
    registry``: that holds for every name of a toolset whose server cannot
    be reached (it may offer it), and a look at such a name's page must not
    leave a settings row behind."""
    registry = get_registry()
    toolset = registry.toolset_of(name)
    if toolset is not None:
        catalog.listing(toolset)  # from the cache when fresh
    return name in registry.names()
