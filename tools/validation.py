"""Checking a call's arguments against the tool's JSON Schema before it runs."""

from typing import Any

import jsonschema_rs
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError


def check_schema(schema: Any) -> str | None:
    """Return why ``schema`` is not a usable JSON Schema, or None."""
    if not isinstance(schema, dict):
        return "parameters must be a JSON Schema object (a dict)"
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as error:
        return f"parameters is not a valid JSON Schema: {error.message}"
    return None


class CompiledSchema:
    """A schema compiled twice: by ``jsonschema-rs`` to tell fast whether a
    value is valid — the common case, on every call and every claim — and by
    ``jsonschema`` to say what is wrong when it is not, in the messages
    operators and models are shown.

    ``jsonschema`` is the authority: a value the fast check refuses is
    checked again by it, so a value is refused only with a message. A
    schema the fast validator cannot compile (a regex dialect it lacks, a
    reference it would have to fetch — it never fetches) is checked by
    ``jsonschema`` alone. ``tests/test_schema_checks.py`` holds the two to
    the same verdicts."""

    __slots__ = ("schema", "_fast", "_checker")

    def __init__(self, schema: dict[str, Any]):
        self.schema = schema  # held: the cache's key is its id
        self._checker = Draft202012Validator(schema)
        try:
            self._fast = jsonschema_rs.Draft202012Validator(schema, offline=True)
        except Exception:  # any refusal: jsonschema alone checks it
            self._fast = None

    def is_valid(self, value: Any) -> bool:
        if self._fast is not None and self._fast.is_valid(value):
            return True
        return self._checker.is_valid(value)

    def iter_errors(self, value: Any):
        return self._checker.iter_errors(value)


#: Compiled schemas by the id of their schema, each holding the schema
#: itself so the id cannot be reused while it is here. A tool's schema is
#: one object for the life of its class (or of an MCP listing), checked at
#: every call; a run request's schemas are module constants.
_COMPILED: dict[int, CompiledSchema] = {}
_MOST_COMPILED = 1024  # MCP listings bring new schema objects every minute


def compiled_schema(schema: dict[str, Any]) -> CompiledSchema:
    """``schema`` compiled, once while it lives."""
    compiled = _COMPILED.get(id(schema))
    if compiled is not None and compiled.schema is schema:
        return compiled
    if len(_COMPILED) >= _MOST_COMPILED:
        _COMPILED.clear()
    compiled = _COMPILED[id(schema)] = CompiledSchema(schema)
    return compiled


def argument_errors(schema: dict[str, Any], arguments: Any) -> list[str]:
    """Every way ``arguments`` violates ``schema``, each naming its path."""
    compiled = compiled_schema(schema)
    if compiled.is_valid(arguments):
        return []
    errors = []
    for error in sorted(compiled.iter_errors(arguments), key=lambda e: list(e.path)):
        where = "/".join(str(part) for part in error.path) or "(arguments)"
        errors.append(f"{where}: {error.message}")
    return errors
