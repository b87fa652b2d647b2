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


def argument_errors(schema: dict[str, Any], arguments: Any) -> list[str]:
    """Every way ``arguments`` violates ``schema``, each naming its path."""
    validator = Draft202012Validator(schema)
    errors = []
    for error in sorted(validator.iter_errors(arguments), key=lambda e: list(e.path)):
        where = "/".join(str(part) for part in error.path) or "(arguments)"
        errors.append(f"{where}: {error.message}")
    return errors
