"""The registry of tools: the builtins plus the classes named in ``NRLLM_TOOLS``.

Loading refuses a broken tool, naming it, rather than running with it.
``effect_for`` resolves an effect by name and fails closed (G1).
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
from tools.validation import check_schema


class ToolRegistryError(ImproperlyConfigured):
    """A tool class cannot be registered; the message names it and why."""


class ToolRegistry:
    """Tools by name. Built once per process from code, never from the database."""

    def __init__(self, tool_classes: Iterable[type[Tool]]):
        self._tools: dict[str, Tool] = {}
        for tool_class in tool_classes:
            _check_tool_class(tool_class)
            if tool_class.name in self._tools:
                other = type(self._tools[tool_class.name])
                raise ToolRegistryError(
                    f"duplicate tool name {tool_class.name!r}: "
                    f"{_dotted(tool_class)} and {_dotted(other)}"
                )
            self._tools[tool_class.name] = tool_class()

    def names(self) -> list[str]:
        return sorted(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self):
        return iter(self._tools[name] for name in self.names())

    def effect_for(self, name: str) -> ToolEffect:
        """The declared effect; an unknown name is treated as the riskiest effect."""
        tool = self._tools.get(name)
        return tool.effect if tool is not None else ToolEffect.NON_IDEMPOTENT_WRITE


def _dotted(tool_class: type) -> str:
    return f"{tool_class.__module__}.{tool_class.__qualname__}"


def _check_tool_class(tool_class: object) -> None:
    if not (isinstance(tool_class, type) and issubclass(tool_class, Tool)):
        raise ToolRegistryError(f"{tool_class!r} is not a subclass of tools.contract.Tool")
    where = _dotted(tool_class)
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


def _import_tool(dotted_path: str) -> type[Tool]:
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
    those registered and not ``disabled`` by an operator."""
    registry = get_registry()
    return {name: registry.get(name) for name in names if name in registry and name not in disabled}


def _reset_on_change(*, setting: str, **kwargs) -> None:
    if setting == "NRLLM_TOOLS":
        get_registry.cache_clear()


setting_changed.connect(_reset_on_change)
