"""Checking a call's arguments against the tool's JSON Schema before it runs.

A schema may come from an MCP server that is careless or hostile: one that
would make a check hang (a backtracking ``pattern``, a schema that refers to
itself in place) or crash (nested past the interpreter's recursion limit) is
refused where it is loaded or listed, naming why, and a check that still
runs too long ends as a value that cannot be checked (``UNCHECKABLE``).
"""

import re
from typing import Any
from urllib.parse import urldefrag, urlsplit

import jsonschema_rs
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from tools import patterns
from tools.patterns import PatternTooSlow, Untranslatable

# jsonschema's pattern keywords, in every validator of the process, match
# within a time bound: see tools/patterns.py.
patterns.bound_jsonschema()

#: The deepest schema (in JSON levels) checked: jsonschema checks a schema
#: and a value by recursion, and a schema about 150 levels deep runs past
#: the interpreter's limit. Real schemas (pydantic's, with $defs) are far
#: shallower.
MAX_SCHEMA_DEPTH = 64
#: The longest message about one value: jsonschema's quote the whole value.
MESSAGE_CHARS = 500
#: The most messages reported for one value.
MOST_MESSAGES = 20


def check_schema(schema: Any) -> str | None:
    """Return why ``schema`` is not a usable JSON Schema, or None."""
    if not isinstance(schema, dict):
        return "parameters must be a JSON Schema object (a dict)"
    if _depth_past(schema, MAX_SCHEMA_DEPTH):
        return f"parameters is nested more than {MAX_SCHEMA_DEPTH} levels deep, too deep to check"
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as error:
        return f"parameters is not a valid JSON Schema: {shortened(error.message)}"
    except RecursionError:
        return "parameters is nested too deeply to be checked"
    remote = _remote_reference(schema)
    if remote is not None:
        # Never fetched (a schema, an MCP server's too, must not make the
        # worker send requests): refused here rather than failing each call.
        return (
            f"parameters refers to another document ({remote!r}): "
            "only references within the schema work"
        )
    return _unmatchable_pattern(schema) or _reference_cycle(schema)


def _depth_past(value: Any, most: int) -> bool:
    """Whether ``value`` nests more than ``most`` levels (without recursion)."""
    level = [value]
    for _ in range(most + 1):
        level = [
            item
            for container in level
            if isinstance(container, dict | list)
            for item in (container.values() if isinstance(container, dict) else container)
        ]
        if not level:
            return False
    return True


def _unmatchable_pattern(schema: dict) -> str | None:
    for subschema in _subschemas(schema):
        if not isinstance(subschema, dict):
            continue
        found = [subschema.get("pattern"), *subschema.get("patternProperties", {})]
        for pattern in found:
            if not isinstance(pattern, str):
                continue
            try:
                patterns.translated(pattern)
            except (Untranslatable, re.error) as error:
                shown = pattern[:80]
                return f"parameters has a pattern that cannot be checked ({shown!r}): {error}"
    return None


#: Keywords whose subschemas apply to the value itself, not to a part of it:
#: a reference cycle through these alone never ends, whatever the value.
_IN_PLACE = ("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas")


def _reference_cycle(schema: dict) -> str | None:
    """A reference that leads back to itself without descending into the
    value (``{"allOf": [{"$ref": "#"}]}``): checking any value against it
    recurses until the interpreter's limit, so every call would be refused.
    A depth-first walk of what applies in place, from every subschema."""
    root = Registry().resolver_with_root(DRAFT202012.create_resource(schema))
    walking, walked = set(), set()
    for start, resolver in _subschemas_resolved(schema, root):
        if id(start) in walked:
            continue
        walking.add(id(start))
        path = [(start, _applied_in_place(start, resolver))]
        while path:
            node, children = path[-1]
            for child, child_resolver in children:
                if id(child) in walking:
                    return "parameters refers to itself in place (a $ref cycle), which never ends"
                if id(child) not in walked:
                    walking.add(id(child))
                    path.append((child, _applied_in_place(child, child_resolver)))
                    break
            else:
                path.pop()
                walking.discard(id(node))
                walked.add(id(node))
    return None


def _subschemas_resolved(schema: dict, resolver):
    """Each subschema with the resolver its references are read with."""
    resolver = resolver.in_subresource(DRAFT202012.create_resource(schema))
    yield schema, resolver
    for subschema in DRAFT202012.subresources_of(schema):
        if isinstance(subschema, dict):
            yield from _subschemas_resolved(subschema, resolver)


def _applied_in_place(node: dict, resolver):
    """The subschemas that apply to the value ``node`` applies to, each
    with the resolver to read it with."""
    for keyword in _IN_PLACE:
        value = node.get(keyword)
        if keyword == "dependentSchemas" and isinstance(value, dict):
            value = list(value.values())
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, dict):
                yield child, resolver.in_subresource(DRAFT202012.create_resource(child))
    for keyword in ("$ref", "$dynamicRef"):
        reference = node.get(keyword)
        if isinstance(reference, str):
            try:
                resolved = resolver.lookup(reference)
            except Unresolvable:
                continue  # refused when a value is checked, naming it
            if isinstance(resolved.contents, dict):
                contents = resolved.contents
                yield (
                    contents,
                    resolved.resolver.in_subresource(DRAFT202012.create_resource(contents)),
                )


def _subschemas(schema: Any):
    """``schema`` and every schema inside it (not the data of ``enum``,
    ``const``, ``default`` or ``examples``)."""
    yield schema
    if isinstance(schema, dict):
        for subschema in DRAFT202012.subresources_of(schema):
            yield from _subschemas(subschema)


def _remote_reference(schema: dict) -> str | None:
    """A reference to a document by its URL, none of the schema's own."""
    subschemas = [subschema for subschema in _subschemas(schema) if isinstance(subschema, dict)]
    embedded = {
        urldefrag(subschema["$id"]).url
        for subschema in subschemas
        if isinstance(subschema.get("$id"), str)
    }
    references = (
        subschema.get(keyword) for subschema in subschemas for keyword in ("$ref", "$dynamicRef")
    )
    for reference in references:
        if isinstance(reference, str) and urlsplit(reference).scheme:
            if urldefrag(reference).url not in embedded:
                return reference
    return None


def _numbers(value: Any):
    if isinstance(value, dict):
        for item in value.values():
            yield from _numbers(item)
    elif isinstance(value, list):
        for item in value:
            yield from _numbers(item)
    elif isinstance(value, float):
        yield value


class _AsJsonschemaJudges:
    """A keyword jsonschema-rs judges otherwise than jsonschema — ``pattern``
    (ECMA classes: ``\\S`` accepts U+001C, Python's does not) and
    ``multipleOf`` (exact decimals: 0.07 is a multiple of 0.01, not as
    floats divide) — judged in jsonschema-rs by jsonschema's own rule, so
    the fast check never accepts what jsonschema refuses."""

    keyword = ""

    def __init__(self, parent_schema, value, schema_path):
        self._schema = parent_schema
        self._value = value

    def validate(self, instance):
        rule = Draft202012Validator.VALIDATORS[self.keyword]
        for error in rule(_PLAIN, self._value, instance, self._schema) or ():
            raise ValueError(error.message)


class _Pattern(_AsJsonschemaJudges):
    keyword = "pattern"


class _MultipleOf(_AsJsonschemaJudges):
    keyword = "multipleOf"


_PLAIN = Draft202012Validator({})
_JUDGED_AS_JSONSCHEMA_DOES = {"pattern": _Pattern, "multipleOf": _MultipleOf}
#: Keywords whose rule descends into subschemas: a schema using one is
#: checked by jsonschema alone.
_CHECKED_BY_JSONSCHEMA_ALONE = {"patternProperties"}
#: A float bound this large is compared with big integers as a float by
#: jsonschema-rs (10**30 passes ``minimum: 1e30``; jsonschema compares exactly):
#: a schema holding one is checked by jsonschema alone.
_EXACT_FLOATS_BELOW = 2.0**53

#: Why a value could not be checked at all: refused, naming it, not a crash.
UNCHECKABLE = (RecursionError, OverflowError, Unresolvable, PatternTooSlow, Untranslatable)


def uncheckable(error: Exception) -> str:
    if isinstance(error, RecursionError):
        return "nested too deeply to be checked"
    if isinstance(error, OverflowError):
        return "holds a number too large to be checked"
    if isinstance(error, PatternTooSlow):
        return str(error)
    if isinstance(error, Untranslatable):
        return f"cannot be checked: the schema has a pattern that cannot be matched ({error})"
    return f"cannot be checked: the schema's reference cannot be resolved ({error})"


def shortened(message: str) -> str:
    """``message`` cut to ``MESSAGE_CHARS``."""
    if len(message) <= MESSAGE_CHARS:
        return message
    return f"{message[:MESSAGE_CHARS]}... ({len(message)} characters, cut)"


#: How much of a value a message quotes.
QUOTED_CHARS = 120


def _with_short_messages(error):
    """``error`` (and the errors it holds, which ``best_match`` may pick)
    with its message shortened: jsonschema's quote the whole offending
    value, which a model or an API client may send by the megabyte. The
    quote is cut, so the message still says what is wrong with it."""
    message = error.message
    if len(message) > MESSAGE_CHARS:
        quoted = repr(error.instance)
        if len(quoted) > QUOTED_CHARS and quoted in message:
            cut = f"{quoted[:QUOTED_CHARS]}... ({len(quoted)} characters)"
            message = message.replace(quoted, cut)
        error.message = shortened(message)
    for held in error.context:
        _with_short_messages(held)
    return error


class CompiledSchema:
    """A schema compiled twice: by ``jsonschema-rs`` to tell fast whether a
    value is valid — the common case, on every call and every claim — and by
    ``jsonschema`` to say what is wrong when it is not, in the messages
    operators and models are shown.

    ``jsonschema`` is the authority: a value the fast check refuses (or
    cannot judge: it raises past a nesting depth) is checked again by it, so
    a value is refused only with a message; where the two read a keyword
    differently the fast check applies jsonschema's rule. A schema the fast
    validator cannot compile (a regex dialect it lacks, a reference) is
    checked by ``jsonschema`` alone. Neither fetches a ``$ref``.
    ``tests/test_schema_checks.py`` holds the two to the same verdicts."""

    __slots__ = ("schema", "_fast", "_checker")

    def __init__(self, schema: dict[str, Any]):
        self.schema = schema  # held: the cache's key is its id
        # An empty registry: a reference to another document is unresolvable,
        # never fetched.
        self._checker = Draft202012Validator(schema, registry=Registry())
        self._fast = None
        if self._fast_can_judge(schema):
            try:
                self._fast = jsonschema_rs.Draft202012Validator(
                    schema, offline=True, keywords=_JUDGED_AS_JSONSCHEMA_DOES
                )
            except Exception:  # any refusal: jsonschema alone checks it
                pass

    @staticmethod
    def _fast_can_judge(schema: dict) -> bool:
        keywords = {
            keyword
            for subschema in _subschemas(schema)
            if isinstance(subschema, dict)
            for keyword in subschema
        }
        if keywords & _CHECKED_BY_JSONSCHEMA_ALONE:
            return False
        return all(abs(number) < _EXACT_FLOATS_BELOW for number in _numbers(schema))

    def is_valid(self, value: Any) -> bool:
        """Raises one of ``UNCHECKABLE`` when jsonschema cannot tell."""
        if self._fast is not None:
            try:
                if self._fast.is_valid(value):
                    return True
            except Exception:  # too deep for it, say: jsonschema judges
                pass
        return self._checker.is_valid(value)

    def iter_errors(self, value: Any):
        """jsonschema's errors, their messages shortened."""
        return map(_with_short_messages, self._checker.iter_errors(value))


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
    """Every way ``arguments`` violates ``schema`` (the first
    ``MOST_MESSAGES``), each naming its path. Returns within about
    ``patterns.PATTERN_SECONDS`` whatever the schema's patterns."""
    compiled = compiled_schema(schema)
    try:
        with patterns.deadline():
            if compiled.is_valid(arguments):
                return []
            found = sorted(compiled.iter_errors(arguments), key=lambda e: list(e.path))
    except UNCHECKABLE as error:
        return [f"(arguments): {uncheckable(error)}"]
    errors = []
    for error in found[:MOST_MESSAGES]:
        where = shortened("/".join(str(part) for part in error.path)) or "(arguments)"
        errors.append(f"{where}: {error.message}")
    if len(found) > MOST_MESSAGES:
        errors.append(f"(arguments): {len(found) - MOST_MESSAGES} more problems not listed")
    return errors
