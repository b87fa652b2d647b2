"""Values named in a refusal, written as JSON (issue #41): a request comes
as JSON, through the API or the console's form, so its errors say
``tools: unknown tool(s) ["nope"]`` and ``"content" is a required
property``, not Python's ``['nope']`` and ``'content'``."""

import ast
import json
import re

#: A Python string literal as ``repr`` writes one, standing apart (not the
#: quotes around a value the validator cut: "'xxx... (N characters) is not
#: of type 'string'"), or a constant's name.
_PYTHON_LITERAL = re.compile(
    r"""(?<![\w'"])(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")(?!\w)|\b(?:True|False|None)\b"""
)
_CONSTANTS = {"True": "true", "False": "false", "None": "null"}


def shown(value) -> str:
    """``value`` as JSON, on one line (what is not JSON, as its text)."""
    return json.dumps(value, ensure_ascii=False, default=str)


def json_notation(message: str) -> str:
    """``message`` (a JSON Schema validator's, which names values by their
    Python ``repr``) with each Python string literal and True, False, None
    written as JSON. Only for messages that name values so: a message of
    ours may hold an apostrophe ("the run's tools")."""

    def as_json(match: re.Match) -> str:
        literal = match.group(0)
        if literal in _CONSTANTS:
            return _CONSTANTS[literal]
        try:
            return shown(ast.literal_eval(literal))
        except (ValueError, SyntaxError):
            return literal

    return _PYTHON_LITERAL.sub(as_json, message)
