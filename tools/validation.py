"""Checking a call's arguments against the tool's JSON Schema before it runs."""

from typing import Any

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


#: Validators by the id of their schema, each kept with the schema itself so
#: the id cannot be reused while it is here. A tool's schema is one object
#: for the life of its class (or of an MCP listing), checked at every call.
_VALIDATORS: dict[int, tuple[dict, Draft202012Validator]] = {}
_MOST_VALIDATORS = 1024  # MCP listings bring new schema objects every minute


def _validator_for(schema: dict[str, Any]) -> Draft202012Validator:
    cached = _VALIDATORS.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    if len(_VALIDATORS) >= _MOST_VALIDATORS:
        _VALIDATORS.clear()
    validator = Draft202012Validator(schema)
    _VALIDATORS[id(schema)] = (schema, validator)
    return validator


def argument_errors(schema: dict[str, Any], arguments: Any) -> list[str]:
    """Every way ``arguments`` violates ``schema``, each naming its path."""
    validator = _validator_for(schema)
    errors = []
    for error in sorted(validator.iter_errors(arguments), key=lambda e: list(e.path)):
        where = "/".join(str(part) for part in error.path) or "(arguments)"
        errors.append(f"{where}: {error.message}")
    return errors
