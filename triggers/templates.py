"""The input a schedule's or a trigger's run gets: a template with
``${path}`` placeholders, filled from a context (a schedule's time, an
event's JSON body).

Deliberately small, so that a template is data, never code: a placeholder
is a path of keys and list indexes (``${alerts.0.labels.alertname}``),
nothing else — no calls, no attributes, no filters, no loops. ``$${`` is
a literal ``${``; any other ``$`` is text. A string is put in as it is,
any other JSON value as compact JSON. A path that is not in the context
is refused, naming it, and so is an input
longer than ``MAX_INPUT_CHARS``: the sender hears what is wrong and nothing
is stored.
"""

import json
import re

#: The longest input a template may make, in characters.
MAX_INPUT_CHARS = 32_000
#: The longest template, in characters.
MAX_TEMPLATE_CHARS = 10_000


class TemplateError(ValueError):
    """What is wrong, in words for the sender: the path that is missing."""


_PLACEHOLDER = re.compile(r"\$\$\{|\$\{([^{}]*)\}")
_PATH = re.compile(r"[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+)*")


def check_template(template: str) -> list[str]:
    """The paths ``template`` names, in order; refuses one that is no template."""
    if not isinstance(template, str):
        raise TemplateError("a template is text")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateError(f"the template is longer than {MAX_TEMPLATE_CHARS} characters")
    paths = []
    for match in _PLACEHOLDER.finditer(template):
        if match[0] == "$${":
            continue
        path = match[1].strip()
        if not _PATH.fullmatch(path):
            raise TemplateError(
                f"${{{match[1]}}}: a placeholder is ${{path}}, keys and list indexes "
                "joined by dots (write $${ for a literal ${)"
            )
        paths.append(path)
    return paths


def render(template: str, context, *, what: str = "body") -> str:
    """``template`` filled from ``context``. Raises ``TemplateError``
    naming the first missing path (``body.alerts.0.startsAt``, with
    ``what`` as its root), or the length over ``MAX_INPUT_CHARS``."""
    check_template(template)

    def fill(match):
        if match[0] == "$${":
            return "${"
        return _text(_lookup(context, match[1].strip(), what))

    filled = _PLACEHOLDER.sub(fill, template)
    if len(filled) > MAX_INPUT_CHARS:
        raise TemplateError(
            f"the input the template makes is {len(filled)} characters, "
            f"above the {MAX_INPUT_CHARS} an input may have"
        )
    return filled


def _lookup(context, path: str, what: str):
    value = context
    walked = what
    for key in path.split("."):
        walked = f"{walked}.{key}"
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            raise TemplateError(f"{walked}: the template names it and the {what} has no such field")
    return value


def _text(value) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
