"""Regular expressions from schemas, matched within a time bound and with
the meaning Python's ``re`` gives them.

A schema's ``pattern`` (and ``patternProperties``) comes from a tool's
author or an MCP server, its string from a model. Python's ``re``
backtracks without limit: ``^(a|aa)+$`` against ``"a" * 48 + "b"`` takes
hours, holding the GIL (every thread of the process stops), and nothing can
interrupt it off the main thread. So ``re`` never matches one: each pattern
is parsed by ``re``'s own parser and written out for the ``regex`` package,
which stops a match at a timeout (``PatternTooSlow``), from any thread.

``jsonschema`` is the authority on a value (``tools.validation``), and its
rule is ``re.search(pattern, string)``: the translation keeps that meaning,
not ``regex``'s. Every construct is written out as ``re`` reads it — each
class (``\\d``, ``\\w``, ``\\s``, a set under ``IGNORECASE``) becomes the
set of code points ``re`` itself matches, computed once by ``re``; anchors
and word boundaries become the assertions ``re`` evaluates. ``regex``
disagrees with ``re`` on several of those (``\\s`` and U+001C, ``\\w`` and
combining marks, its newer Unicode tables, case folding); what it is given
has no class, flag or anchor left to read its own way.
``tests/test_pattern_bounds.py`` holds the two to the same verdicts. A
construct with no exact translation (a backreference under
``IGNORECASE``) is refused (``Untranslatable``), and a schema holding one
is refused where it is loaded or listed.

``bound_jsonschema()`` makes every ``jsonschema`` validator in the process
match this way: its keyword functions call ``re.search`` from three
modules, whose ``re`` is replaced by this module's ``search``. That covers
the MCP SDK's own check of a result against a server's output schema too,
which runs ``jsonschema`` on the sessions' loop thread.
"""

import array
import contextlib
import contextvars
import functools
import re
import time
from re import _compiler, _constants, _parser

import regex

#: How long the pattern matches of one check may take together (the
#: default for a match outside ``deadline()``): a pattern matched in time
#: linear in its string takes microseconds; one past this is backtracking.
PATTERN_SECONDS = 1.0

_C = _constants
_SINGLE_CHARACTER = (_C.LITERAL, _C.NOT_LITERAL, _C.ANY, _C.IN)
_REPEATS = {_C.MAX_REPEAT: "", _C.MIN_REPEAT: "?", _C.POSSESSIVE_REPEAT: "+"}
_TYPE_FLAGS = _C.SRE_FLAG_ASCII | _C.SRE_FLAG_UNICODE | _C.SRE_FLAG_LOCALE
_LAST_CODE_POINT = 0x10FFFF


class Untranslatable(ValueError):
    """A pattern with no exact, bounded translation."""


class PatternTooSlow(Exception):
    """A match ran out of its time: the value cannot be checked."""

    def __init__(self, pattern: str):
        self.pattern = pattern
        shown = pattern if len(pattern) <= 80 else pattern[:80] + "..."
        super().__init__(
            f"matching the pattern {shown!r} took longer than {PATTERN_SECONDS:g}s, "
            "so the value cannot be checked"
        )


_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "pattern_deadline", default=None
)


@contextlib.contextmanager
def deadline(seconds: float = PATTERN_SECONDS):
    """Every match inside shares ``seconds``: a check of many strings against
    a slow pattern costs the bound once, not once per string."""
    token = _deadline.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _deadline.reset(token)


#: How long a match may hold the GIL before it is matched again with the
#: GIL released, until the bound. Nearly every match ends in microseconds;
#: releasing the GIL for every one cost each the wait to take it back —
#: 0.5 ms in a worker whose runs keep the GIL busy, against 5 µs held. The
#: time is the wall clock's: a slice of a few milliseconds ran out whenever
#: a busy host took the CPU from the thread mid-match, so it is 20 ms, the
#: most a backtracking pattern holds the other runs up.
HOLDING_THE_GIL_SECONDS = 0.02


def search(pattern: str, string: str):
    """``re.search(pattern, string)``, bounded; raises ``PatternTooSlow``."""
    if not isinstance(pattern, str):
        return re.search(pattern, string)  # bytes: no schema holds one
    compiled = translated(pattern)
    until = _deadline.get()
    started = time.monotonic()
    remaining = PATTERN_SECONDS if until is None else until - started
    if remaining <= 0:
        raise PatternTooSlow(pattern)
    try:
        return compiled.search(string, timeout=min(remaining, HOLDING_THE_GIL_SECONDS))
    except TimeoutError:
        remaining -= time.monotonic() - started
        if remaining <= 0:
            raise PatternTooSlow(pattern) from None
    try:
        # A long match (or a backtracking one): the GIL is released while
        # it goes on, so every other run of the process goes on too.
        return compiled.search(string, timeout=remaining, concurrent=True)
    except TimeoutError:
        raise PatternTooSlow(pattern) from None


class _BoundedRe:
    """What ``jsonschema``'s keyword modules see as ``re``: they call only
    ``re.search`` (``tests/test_pattern_bounds.py`` pins it)."""

    search = staticmethod(search)
    error = re.error


#: The ``jsonschema`` modules whose keyword functions match patterns.
JSONSCHEMA_MODULES = ("jsonschema._keywords", "jsonschema._utils", "jsonschema._legacy_keywords")


def bound_jsonschema() -> None:
    import importlib

    for name in JSONSCHEMA_MODULES:
        importlib.import_module(name).re = _BoundedRe


@functools.lru_cache(maxsize=1024)
def translated(pattern: str):
    """``pattern`` compiled for ``regex`` with ``re``'s meaning; raises
    ``re.error`` as ``re`` would, ``Untranslatable`` when there is none."""
    parsed = _parser.parse(pattern, 0)
    try:
        written = _written(parsed.data, parsed.state.flags)
    except RecursionError:
        raise Untranslatable("it is nested too deeply") from None
    finally:
        _every_code_point.cache_clear()  # 4 MB, needed again only for a new class
    try:
        return regex.compile(written, regex.V0)
    except (regex.error, OverflowError, RecursionError) as error:
        raise Untranslatable(f"it cannot be matched within a time bound ({error})") from None


def _written(items, flags: int) -> str:
    return "".join(_item(op, av, flags) for op, av in items)


def _item(op, av, flags: int) -> str:
    if op in _SINGLE_CHARACTER:
        return _character(op, av, flags)
    if op is _C.BRANCH:
        return "(?:" + "|".join(_written(branch, flags) for branch in av[1]) + ")"
    if op is _C.SUBPATTERN:
        group, add_flags, del_flags, pattern = av
        inner = _written(pattern, _compiler._combine_flags(flags, add_flags, del_flags))
        return f"({inner})" if group is not None else f"(?:{inner})"
    if op in _REPEATS:
        low, high, pattern = av
        bounds = f"{low}," if high == _C.MAXREPEAT else f"{low},{high}"
        return f"(?:{_written(pattern, flags)}){{{bounds}}}{_REPEATS[op]}"
    if op is _C.AT:
        return _anchor(av, flags)
    if op is _C.GROUPREF:
        if flags & _C.SRE_FLAG_IGNORECASE:
            # re compares the lowercase of each character; regex folds case.
            raise Untranslatable("it uses a backreference under IGNORECASE")
        return f"(?:\\g<{av}>)"
    if op is _C.GROUPREF_EXISTS:
        group, yes, no = av
        otherwise = "" if no is None else "|" + _written(no, flags)
        return f"(?({group}){_written(yes, flags)}{otherwise})"
    if op in (_C.ASSERT, _C.ASSERT_NOT):
        direction, pattern = av
        kind = ("" if direction == 1 else "<") + ("=" if op is _C.ASSERT else "!")
        return f"(?{kind}{_written(pattern, flags)})"
    if op is _C.ATOMIC_GROUP:
        return f"(?>{_written(av, flags)})"
    raise Untranslatable(f"it uses {op}, which has no bounded translation")


def _anchor(at, flags: int) -> str:
    multiline = flags & _C.SRE_FLAG_MULTILINE
    if at is _C.AT_BEGINNING_STRING or (at is _C.AT_BEGINNING and not multiline):
        return r"\A"
    if at is _C.AT_BEGINNING:
        return r"(?<![^\n])"  # at the start, or after a newline
    if at is _C.AT_END_STRING:
        return r"\Z"
    if at is _C.AT_END:
        # re's $: at the end, or before a newline that ends the string.
        return r"(?![^\n])" if multiline else r"(?=\n?\Z)"
    word = _character(_C.IN, [(_C.CATEGORY, _C.CATEGORY_WORD)], flags & _TYPE_FLAGS)
    if at is _C.AT_BOUNDARY:
        return f"(?:(?<={word})(?!{word})|(?<!{word})(?={word}))"
    if at is _C.AT_NON_BOUNDARY:
        # re: never in an empty string.
        return f"(?!\\A\\Z)(?:(?<={word})(?={word})|(?<!{word})(?!{word}))"
    raise Untranslatable(f"it uses {at}, which has no bounded translation")


def _character(op, av, flags: int) -> str:
    """A set of the code points ``re`` matches with this one-character item."""
    caseless = flags & _C.SRE_FLAG_IGNORECASE
    if op is _C.LITERAL and not caseless:
        return _code_points([(av, av)])
    if op is _C.IN and not caseless and all(kind in (_C.LITERAL, _C.RANGE) for kind, _ in av):
        return _code_points([(v, v) if kind is _C.LITERAL else v for kind, v in av])
    key = (op, _frozen(av), flags)
    ranges = _MATCHED_BY_RE.get(key)
    if ranges is None:
        if len(_MATCHED_BY_RE) >= 512:
            _MATCHED_BY_RE.clear()
        ranges = _MATCHED_BY_RE[key] = _matched_by_re(op, av, flags)
    return _code_points(ranges)


#: The code points of each one-character item met, by (op, item, flags).
_MATCHED_BY_RE: dict[tuple, tuple[tuple[int, int], ...]] = {}


def _frozen(value):
    return tuple(map(_frozen, value)) if isinstance(value, list | tuple) else value


def _matched_by_re(op, av, flags: int) -> tuple[tuple[int, int], ...]:
    """Ranges of the code points ``re`` matches with one item: ``re`` itself
    runs it, as a repeat, over every code point in order."""
    state = _parser.State()
    state.flags = flags
    item = _parser.SubPattern(state, [(op, av)])
    runs = _parser.SubPattern(state, [(_C.MAX_REPEAT, (1, _C.MAXREPEAT, item))])
    every = _every_code_point()
    return tuple((m.start(), m.end() - 1) for m in _compiler.compile(runs).finditer(every))


@functools.lru_cache(maxsize=1)
def _every_code_point() -> str:
    """Every code point in order, lone surrogates included (JSON can carry one)."""
    code_points = array.array("I", range(_LAST_CODE_POINT + 1)).tobytes()
    return code_points.decode("utf-32-le", "surrogatepass")


def _code_points(ranges) -> str:
    if not ranges:
        return "(?!)"
    members = "".join(
        f"\\U{low:08x}" if low == high else f"\\U{low:08x}-\\U{high:08x}" for low, high in ranges
    )
    return f"[{members}]"
