"""The registry of tools: the builtins plus the classes named in ``NRLLM_TOOLS``.

``NRLLM_TOOLS`` names tool classes and MCP toolsets (``tools.mcp``). Loading
refuses a broken tool or toolset, naming it, rather than running with it.
``effect_for`` resolves an effect by name and fails closed (G1), from code
alone: a toolset's declared effects, ``non_idempotent_write`` for any other
name (an MCP tool the toolset does not declare included).

An MCP toolset's tools are known from its server's listing
(``tools.mcp.catalog``), asked for when first needed: ``get``, ``in`` and
``unavailable`` may ask; ``names`` and ``effect_for`` never do.
"""

import functools
from collections.abc import Collection, Iterable

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from tools.builtin import BUILTIN_TOOLS
from tools.contract import Tool
from tools.effects import ToolEffect
from tools.mcp import catalog
from tools.mcp.declaration import McpToolset, Undeclared, dotted, toolset_problem
from tools.validation import check_schema


class ToolRegistryError(ImproperlyConfigured):
    """A tool class cannot be registered; the message names it and why."""


class ToolsUnavailable(Exception):
    """An attempt's MCP tools cannot be offered now. Its ``failure_class``
    makes the attempt retryable (``connection``) when a server cannot be
    reached, and not (``configuration``) when a server that answers no
    longer offers a tool as declared."""

    def __init__(self, reasons: dict[str, str], *, unreachable: bool):
        self.reasons = reasons
        self.failure_class = "connection" if unreachable else "configuration"
        described = "; ".join(f"{name}: {why}" for name, why in reasons.items())
        super().__init__(f"tools unavailable: {described}")


class ToolRegistry:
    """Tools by name. Built once per process from code, never from the database."""

    def __init__(self, entries: Iterable[type[Tool] | type[McpToolset]]):
        self._tools: dict[str, Tool] = {}
        self.toolsets: list[type[McpToolset]] = []
        #: Declared MCP tools: registered name → (toolset, effect).
        self._declared: dict[str, tuple[type[McpToolset], ToolEffect]] = {}
        owners: dict[str, str] = {}
        for entry in entries:
            if isinstance(entry, type) and issubclass(entry, McpToolset):
                self._add_toolset(entry, owners)
                continue
            _check_tool_class(entry)
            _claim(owners, entry.name, dotted(entry))
            self._tools[entry.name] = entry()
        for toolset in self.toolsets:
            prefix = toolset.registered_name("")
            clash = [name for name in self._tools if name.startswith(prefix)]
            if clash:
                raise ToolRegistryError(
                    f"tool {clash[0]!r} ({dotted(type(self._tools[clash[0]]))}) is named like "
                    f"a tool of the MCP toolset {dotted(toolset)} ({prefix}*)"
                )

    def _add_toolset(self, toolset: type[McpToolset], owners: dict[str, str]) -> None:
        problem = toolset_problem(toolset)
        if problem:
            raise ToolRegistryError(problem)
        for other in self.toolsets:
            if other.server == toolset.server:
                raise ToolRegistryError(
                    f"duplicate MCP server name {toolset.server!r}: "
                    f"{dotted(toolset)} and {dotted(other)}"
                )
        self.toolsets.append(toolset)
        for remote_name in toolset.tools:
            name = toolset.registered_name(remote_name)
            _claim(owners, name, dotted(toolset))
            self._declared[name] = (toolset, toolset.declaration(remote_name).effect)

    def names(self) -> list[str]:
        """Every name registered: builtin and listed tools, declared MCP
        tools, and the undeclared MCP tools of the listings already made."""
        names = set(self._tools) | set(self._declared)
        for toolset in self.toolsets:
            listed = catalog.cached_listing(toolset)
            if listed is not None:
                names.update(listed.tools)
        return sorted(names)

    def toolset_of(self, name: str) -> type[McpToolset] | None:
        """The MCP toolset whose tool ``name`` would be; None for other names."""
        if name in self._tools:
            return None
        for toolset in self.toolsets:
            if toolset.remote_name(name) is not None:
                return toolset
        return None

    def get(self, name: str) -> Tool | None:
        """The tool, or None when no such tool is registered or an MCP tool
        cannot be offered now (``unavailable`` says why)."""
        tool = self._tools.get(name)
        if tool is not None:
            return tool
        toolset = self.toolset_of(name)
        return catalog.listing(toolset).tools.get(name) if toolset else None

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if name in self._tools or name in self._declared:
            return True
        toolset = self.toolset_of(name)
        if toolset is None or toolset.undeclared is Undeclared.HIDE:
            return False
        listed = catalog.listing(toolset)
        # A server that cannot be reached may well offer it: such a name is
        # not unknown but unavailable, which says why.
        return name in listed.tools or name in listed.unavailable or bool(listed.unreachable)

    def unavailable(self, names: Iterable[str]) -> dict[str, str]:
        """Why each of the MCP tools ``names`` cannot be offered now; a
        tool that can, or that is not an MCP tool, is not in it."""
        names = list(names)
        listed_by = catalog.listings(
            toolset for toolset in map(self.toolset_of, names) if toolset is not None
        )
        reasons = {}
        for name in names:
            toolset = self.toolset_of(name)
            if toolset is None:
                continue
            listed = listed_by[toolset]
            if name not in listed.tools:
                reasons[name] = listed.unavailable.get(
                    name, listed.unreachable or f"MCP server {toolset.server!r} does not offer it"
                )
        return reasons

    def __iter__(self):
        """The builtin and listed tool classes' tools (no MCP server is asked)."""
        return iter(self._tools[name] for name in sorted(self._tools))

    def effect_for(self, name: str) -> ToolEffect:
        """The declared effect; an unknown name is treated as the riskiest
        effect, and so is an MCP tool its toolset does not declare."""
        tool = self._tools.get(name)
        if tool is not None:
            return tool.effect
        declared = self._declared.get(name)
        return declared[1] if declared else ToolEffect.NON_IDEMPOTENT_WRITE


def _claim(owners: dict[str, str], name: str, owner: str) -> None:
    if name in owners:
        raise ToolRegistryError(f"duplicate tool name {name!r}: {owner} and {owners[name]}")
    owners[name] = owner


def _check_tool_class(tool_class: object) -> None:
    if not (isinstance(tool_class, type) and issubclass(tool_class, Tool)):
        raise ToolRegistryError(f"{tool_class!r} is not a subclass of tools.contract.Tool")
    where = dotted(tool_class)
    if not isinstance(tool_class.name, str) or not tool_class.name.strip():
        raise ToolRegistryError(f"tool {where} has no name")
    if not isinstance(tool_class.description, str):
        raise ToolRegistryError(f"tool {tool_class.name!r} ({where}): description must be a string")
    # type() rather than isinstance(): ToolEffect is a StrEnum, and a plain
    # string such as "read_only" must not pass for a declared effect.
    if type(tool_class.effect) is not ToolEffect:
        raise ToolRegistryError(
            f"tool {tool_class.name!r} ({where}): effect {tool_class.effect!r} is not a "
            f"ToolEffect member; use ToolEffect.READ_ONLY, IDEMPOTENT_WRITE or NON_IDEMPOTENT_WRITE"
        )
    if tool_class.parameters is None:
        raise ToolRegistryError(f"tool {tool_class.name!r} ({where}) has no parameters schema")
    problem = check_schema(tool_class.parameters)
    if problem:
        raise ToolRegistryError(f"tool {tool_class.name!r} ({where}): {problem}")


def _import_tool(dotted_path: str) -> type[Tool] | type[McpToolset]:
    try:
        return import_string(dotted_path)
    except ImportError as error:
        raise ToolRegistryError(f"NRLLM_TOOLS: cannot import {dotted_path!r}: {error}") from None


def build_registry(extra_paths: Iterable[str] = ()) -> ToolRegistry:
    """A registry of the builtins plus the tool classes at ``extra_paths``."""
    extra = [_import_tool(path) for path in extra_paths]
    return ToolRegistry([*BUILTIN_TOOLS, *extra])


@functools.cache
def get_registry() -> ToolRegistry:
    return build_registry(settings.NRLLM_TOOLS)


def effect_for(name: str) -> ToolEffect:
    """The effect of the tool called ``name``; ``NON_IDEMPOTENT_WRITE`` if unknown (G1)."""
    return get_registry().effect_for(name)


def offered_tools(names: Iterable[str], disabled: Collection[str]) -> dict[str, Tool]:
    """The tools of ``names`` a run is offered, by name and in that order:
    those registered, not ``disabled`` by an operator, and (MCP tools)
    available now — ``require_available`` refuses an attempt whose MCP
    tools are not."""
    registry = get_registry()
    offered = {}
    for name in names:
        tool = registry.get(name) if name not in disabled else None
        if tool is not None:
            offered[name] = tool
    return offered


def require_available(names: Iterable[str], disabled: Collection[str]) -> None:
    """Raise ``ToolsUnavailable`` unless every MCP tool of ``names`` not
    ``disabled`` can be offered now: an attempt offers a run all its tools,
    so it waits (is retried) for a server rather than start without one.

    Every server of those tools is asked again, whatever this process last
    listed: a process that keeps its listings (a ``SimpleWorker``, the
    embedded worker) would otherwise start the attempt on a listing up to
    a minute old. A server gone since would then not be waited for: the
    attempt would go live and spend its calls — an approved write among
    them — as tool errors the model is told. And one this process last
    found unreachable, the attempt most likely the retry that waited out
    its backoff for it, is asked rather than taken as still down."""
    registry = get_registry()
    wanted = [name for name in names if name not in disabled]
    toolsets = {registry.toolset_of(name) for name in wanted} - {None}
    listed_by = catalog.listings(toolsets, refresh=True)
    reasons = registry.unavailable(wanted)
    if reasons:
        unreachable = any(listed_by[registry.toolset_of(name)].unreachable for name in reasons)
        raise ToolsUnavailable(reasons, unreachable=unreachable)


def _reset_on_change(*, setting: str, **kwargs) -> None:
    if setting == "NRLLM_TOOLS":
        get_registry.cache_clear()
        catalog.forget()


setting_changed.connect(_reset_on_change)
