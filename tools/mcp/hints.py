"""The server's annotations of a tool, beside the effect declared in code.

MCP's ``readOnlyHint``, ``destructiveHint``, ``idempotentHint`` and
``openWorldHint`` are, by the specification, untrusted hints a client must
not base decisions on. They are shown to operators, and a hint that
contradicts the declaration is flagged; the declaration is what the runtime
acts on, always.
"""

from tools.effects import ToolEffect

#: The hints as the specification names them, and the SDK's attributes.
HINTS = {
    "readOnlyHint": "read_only_hint",
    "destructiveHint": "destructive_hint",
    "idempotentHint": "idempotent_hint",
    "openWorldHint": "open_world_hint",
}


def hints_of(annotations) -> dict[str, bool]:
    """The hints the server stated (a hint left unset is not shown)."""
    if annotations is None:
        return {}
    stated = {}
    for name, attribute in HINTS.items():
        value = getattr(annotations, attribute, None)
        if isinstance(value, bool):
            stated[name] = value
    return stated


def contradictions(
    effect: ToolEffect, hints: dict[str, bool], *, declared: bool = True
) -> list[str]:
    """How the stated hints contradict ``effect`` — the toolset's
    declaration, or for a tool it does not declare the ``non_idempotent_write``
    it is treated as — each said for an operator; empty when they agree or
    say nothing."""
    taken = f"declared {effect}" if declared else f"undeclared, so treated as {effect}"
    found = []
    if effect.is_write and hints.get("readOnlyHint") is True:
        found.append(f"the server says readOnlyHint: true; {taken}")
    if effect is ToolEffect.READ_ONLY:
        if hints.get("readOnlyHint") is False:
            found.append(f"the server says readOnlyHint: false; {taken}")
        if hints.get("destructiveHint") is True:
            found.append(f"the server says destructiveHint: true; {taken}")
    if effect is ToolEffect.IDEMPOTENT_WRITE and hints.get("idempotentHint") is False:
        found.append(f"the server says idempotentHint: false; {taken}")
    if effect is ToolEffect.NON_IDEMPOTENT_WRITE and hints.get("idempotentHint") is True:
        found.append(f"the server says idempotentHint: true; {taken}")
    return found
