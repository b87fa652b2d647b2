"""Reading a run request from a file or stdin for the management commands."""

import json
import sys

from django.core.management.base import CommandError


def read_request(path: str):
    """The JSON in ``path`` (``-`` for stdin); a clear CommandError otherwise."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
    except OSError as error:
        raise CommandError(f"cannot read {path}: {error.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise CommandError(
            f"{path} is not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})"
        ) from None
