"""Schema patterns (``tools.patterns``): matched by ``regex`` within a time
bound, never by ``re``, which backtracks for hours holding the GIL; and with
``re``'s meaning, which ``jsonschema`` (the authority) gives them."""

import ast
import importlib
import inspect
import re
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import ROOT
from tools import patterns
from tools.validation import check_schema

SLOW = "^(a|aa)+$"
#: Hours for ``re``: it tries every way to split the a's before the b.
SLOW_STRING = "a" * 48 + "b"


def checked_in_a_process_of_its_own(code: str, timeout: float = 30) -> str:
    """Run ``code`` in a fresh interpreter, the test's own bound on a hang:
    a match in ``re`` holds the GIL, so no thread of this process could
    time it out."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(
    "schema, arguments",
    [
        ({"type": "object", "properties": {"q": {"pattern": SLOW}}}, {"q": SLOW_STRING}),
        (
            {"type": "object", "patternProperties": {SLOW: {}}, "additionalProperties": False},
            {SLOW_STRING: 1},
        ),
        (
            {"type": "object", "patternProperties": {SLOW: {}}, "unevaluatedProperties": False},
            {SLOW_STRING: 1},
        ),
    ],
    ids=["pattern", "patternProperties and additionalProperties", "unevaluatedProperties"],
)
def test_a_backtracking_pattern_ends_as_a_value_that_cannot_be_checked_not_a_hang(
    schema, arguments
):
    assert check_schema(schema) is None  # a valid schema: refused per value
    out = checked_in_a_process_of_its_own(
        f"""
        from tools.validation import argument_errors
        print(argument_errors({schema!r}, {arguments!r}))
        """
    )
    assert "took longer than 1s, so the value cannot be checked" in out, out


def test_a_backtracking_pattern_in_a_tools_own_schema_goes_through_the_same_bound():
    """A tool class's schema is checked where the MCP server's is."""
    out = checked_in_a_process_of_its_own(
        f"""
        import django
        django.setup()
        from runs.runtime.loop import _plan
        from runs.providers.base import ToolCall
        from tools.contract import Tool

        class Lookup(Tool):
            name = "lookup"
            parameters = {{"type": "object", "properties": {{"q": {{"pattern": {SLOW!r}}}}}}}

        call = ToolCall(id="c1", name="lookup", arguments={{"q": {SLOW_STRING!r}}})
        print(_plan(call, "0", {{"lookup": Lookup()}}))
        """
    )
    assert out.startswith("invalid arguments: (arguments): matching the pattern"), out


def test_jsonschema_matches_patterns_through_the_bound_only():
    """``jsonschema``'s keyword modules use ``re.search`` and nothing else
    of ``re``; those are the names bound. An upgrade that matches another
    way fails here, not in production."""
    for name in patterns.JSONSCHEMA_MODULES:
        module = importlib.import_module(name)
        assert module.re is patterns._BoundedRe, name
        used = {
            node.attr
            for node in ast.walk(ast.parse(inspect.getsource(module)))
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "re"
        }
        assert used == {"search"}, (name, used)


def test_a_pattern_with_no_exact_translation_is_refused_naming_it():
    problem = check_schema({"type": "string", "pattern": r"(?i)(a)\1"})
    assert problem == (
        r"parameters has a pattern that cannot be checked ('(?i)(a)\\1'): "
        "it uses a backreference under IGNORECASE"
    )


ALPHABET = "aAbB_ 0\n\x1c\x85\u0130\u0131kK\u212asſß\u1e9e\u0301\u0663\U00010d40\ud800é"
ATOMS = [re.escape(c) for c in ALPHABET] + [
    *(".", r"\d", r"\D", r"\w", r"\W", r"\s", r"\S", "[a-c]", "[^a]", r"[\w\s]", r"[^\d]"),
    *("[ß-ſ]", "[K-k]", "^", "$", r"\A", r"\Z", r"\b", r"\B"),
]
PATTERNS = st.recursive(
    st.sampled_from(ATOMS),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map("".join),
        st.tuples(inner, inner).map("|".join),
        st.tuples(inner, st.sampled_from(["*", "+", "?", "{0,2}", "*?", "+?", "?+", "*+"])).map(
            lambda parts: "(?:{}){}".format(*parts)
        ),
        inner.map("({})".format),
        st.tuples(
            st.sampled_from(["(?=", "(?!", "(?>", "(?i:", "(?-i:", "(?s:", "(?m:", "(?a:"]), inner
        ).map(lambda parts: "{}{})".format(*parts)),
        st.tuples(st.sampled_from(["(?<=", "(?<!"]), st.sampled_from(ALPHABET)).map(
            lambda parts: f"{parts[0]}{re.escape(parts[1])})"
        ),
        inner.map(r"({})\1".format),
        inner.map("(a)?(?(1){}|b)".format),
    ),
    max_leaves=6,
)


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.sampled_from(["", "(?i)", "(?m)", "(?s)", "(?a)", "(?im)"]),
    PATTERNS,
    st.text(alphabet=ALPHABET, max_size=10),
)
def test_the_bounded_match_finds_what_re_finds(flags, pattern, string):
    """Over the characters where ``regex``'s own reading differs from
    ``re``'s (``\\s`` and U+001C, ``\\w`` and a combining mark, dotless i,
    the Kelvin sign, a digit of a newer Unicode, a lone surrogate)."""
    pattern = flags + pattern
    try:
        expected = re.search(pattern, string) is not None
    except re.error:
        with pytest.raises(re.error):
            patterns.translated(pattern)
        return
    try:
        found = patterns.search(pattern, string) is not None
    except patterns.Untranslatable:
        assert "(?i" in pattern and "\\1" in pattern  # the only construct refused
        return
    assert found == expected
