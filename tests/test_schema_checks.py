"""Schema checks (``tools.validation.CompiledSchema``): a fast validator
(``jsonschema-rs``) says whether a value is valid, ``jsonschema`` says what
is wrong and has the last word. Run requests are checked at enqueue and at
every claim, tool arguments at every call: the two must give the same
verdicts, and the fast one must never reach the network."""

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from runs.providers.openai_chat import OpenAIChatProvider
from runs.providers.scripted import ScriptedProvider
from runs.runtime.run_request import (
    _REQUEST_SCHEMA,
    _STORED_SCHEMA,
    InvalidRunRequest,
    parse_run_request,
    parse_stored_request,
)
from tools.builtin.http import HttpGet
from tools.builtin.notes import SearchNotes, UpsertNote
from tools.builtin.notifications import SendNotification
from tools.validation import argument_errors, check_schema, compiled_schema

#: A schema of the kind MCP servers list (pydantic's): $defs and $ref,
#: nullable anyOf, enum, pattern, bounds, nested arrays.
_MCP_STYLE = {
    "$defs": {
        "Label": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z][a-z0-9-]*$", "maxLength": 20},
                "color": {"enum": ["red", "green", None]},
            },
            "required": ["name"],
        }
    },
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 1},
        "priority": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 5}, {"type": "null"}]},
        "labels": {"type": "array", "items": {"$ref": "#/$defs/Label"}, "uniqueItems": True},
        "estimate": {"type": "number", "exclusiveMinimum": 0, "multipleOf": 0.5},
        "meta": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "required": ["title"],
    "additionalProperties": False,
}

_REQUEST = {
    "prompt": "p",
    "tools": ["search_notes"],
    "provider": {"kind": "scripted", "turns": [{"content": "x"}]},
    "max_iterations": 3,
    "require_approval": [],
}

#: The schemas checked on the hot paths, each with a value it accepts:
#: checked as it is and perturbed.
CASES = {
    "run request": (_REQUEST_SCHEMA, _REQUEST),
    "stored run request": (_STORED_SCHEMA, _REQUEST),
    "scripted provider": (
        ScriptedProvider.spec_schema,
        {
            "kind": "scripted",
            "turns": [
                {"tool_calls": [{"name": "a", "arguments": {"q": 1}}], "delay_seconds": 0},
                {"error": "rate_limit", "attempts": 1, "retry_after": 0.5},
                {"content": "done"},
            ],
        },
    ),
    "openai provider": (
        OpenAIChatProvider.spec_schema,
        {"kind": "openai", "model": "m", "temperature": 0.2},
    ),
    "an MCP server's": (
        _MCP_STYLE,
        {"title": "t", "priority": None, "labels": [{"name": "bug"}], "estimate": 1.5},
    ),
    "search_notes": (SearchNotes.parameters, {"query": "q"}),
    "upsert_note": (UpsertNote.parameters, {"slug": "plan", "body": "ship"}),
    "send_notification": (SendNotification.parameters, {"recipient": "ops", "message": "m"}),
    "http_get": (HttpGet.parameters, {"url": "https://example.com/a"}),
}

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=10,
)


@st.composite
def perturbed(draw, value):
    """``value`` with up to three changes somewhere inside it: a part
    replaced by any JSON, a key dropped or added, an item dropped or added."""
    for _ in range(draw(st.integers(0, 3))):
        value = draw(_changed(value))
    return value


@st.composite
def _changed(draw, value):
    if isinstance(value, dict) and value and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(value)))
        action = draw(st.sampled_from(["into", "drop", "replace", "add"]))
        if action == "into":
            return {**value, key: draw(_changed(value[key]))}
        if action == "drop":
            return {k: v for k, v in value.items() if k != key}
        if action == "add":
            return {**value, draw(st.text(max_size=12)): draw(JSON)}
        return {**value, key: draw(JSON)}
    if isinstance(value, list) and value and draw(st.booleans()):
        index = draw(st.integers(0, len(value) - 1))
        action = draw(st.sampled_from(["into", "drop", "copy"]))
        if action == "into":
            return [*value[:index], draw(_changed(value[index])), *value[index + 1 :]]
        if action == "drop":
            return value[:index] + value[index + 1 :]
        return [*value, value[index]]
    return draw(JSON)


@pytest.mark.parametrize("case", CASES)
def test_the_fast_check_gives_the_verdicts_jsonschema_gives(case):
    schema, example = CASES[case]
    checker = Draft202012Validator(schema)
    compiled = compiled_schema(schema)
    assert compiled._fast is not None, "the fast validator compiles this schema"
    assert compiled._fast.is_valid(example) and checker.is_valid(example)

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(perturbed(example))
    def same_verdict(value):
        assert compiled._fast.is_valid(value) == checker.is_valid(value), value

    same_verdict()


def test_a_value_only_the_fast_check_refuses_is_judged_by_jsonschema():
    """NaN is a number to ``jsonschema``, not to ``jsonschema-rs``: the fast
    check's refusal is not the verdict, a refusal comes with a message."""
    assert compiled_schema({"type": "number"}).is_valid(math.nan)
    assert argument_errors({"type": "number"}, math.nan) == []
    assert argument_errors({"type": "number"}, "x") == ["(arguments): 'x' is not of type 'number'"]


def test_a_stored_request_refused_names_what_is_wrong():
    bad = {**_REQUEST, "provider": {"kind": "scripted", "turns": [{"content": 1}]}}
    with pytest.raises(Exception, match="provider/turns/0"):
        parse_stored_request(bad)
    assert parse_stored_request(_REQUEST).prompt == "p"


#: Where jsonschema-rs alone would accept what jsonschema refuses (found in
#: review), or raise: each must get jsonschema's verdict.
_READ_OTHERWISE = {
    "multipleOf, decimal": ({"multipleOf": 0.01}, 0.07),
    "multipleOf, tenths": ({"multipleOf": 0.1}, 0.3),
    "\\S and U+001C": ({"type": "string", "pattern": "^\\S+$"}, "a\x1cb"),
    "\\S and NEL": ({"type": "string", "pattern": "^\\S$"}, "\x85"),
    "\\D and an Arabic digit": ({"type": "string", "pattern": "^\\D$"}, "\u0663"),
    "\\s and BOM": ({"type": "string", "pattern": "^\\s$"}, "\ufeff"),
    "a pattern in a nested schema": (
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "^\\S$"}}},
        {"a": "\x1c"},
    ),
    "patternProperties": ({"patternProperties": {"^\\S$": {"type": "integer"}}}, {"\x1c": "x"}),
    "a float bound and a big integer": ({"minimum": 1e30}, 10**30),
    "a float bound past 2**64": ({"exclusiveMaximum": 1.8446744073709552e19}, 2**64),
    "uniqueItems, too deep for jsonschema-rs": (
        {"type": "array", "uniqueItems": True},
        [json.loads("[" * 300 + "]" * 300), json.loads("[" * 301 + "]" * 301)],
    ),
}


@pytest.mark.parametrize("case", _READ_OTHERWISE)
def test_where_the_fast_validator_reads_a_keyword_otherwise_jsonschema_decides(case):
    schema, value = _READ_OTHERWISE[case]
    expected = Draft202012Validator(schema).is_valid(value)
    assert compiled_schema(schema).is_valid(value) is expected
    assert (argument_errors(schema, value) == []) is expected


def test_a_schema_that_names_a_remote_document_is_refused_and_never_fetched(http_server):
    """A tool's (or an MCP server's) schema may name any URL: it is refused
    where tools are loaded and listed, and checking arguments against it
    never fetches it — that would let a schema make the worker send requests."""
    url = http_server.url("/schema.json")
    schema = {"type": "object", "properties": {"a": {"$ref": url}}}
    assert "refers to another document" in check_schema(schema)
    assert argument_errors(schema, {}) == []
    assert "reference cannot be resolved" in argument_errors(schema, {"a": 1})[0]
    assert http_server.received == []


def test_a_run_request_too_deep_for_the_fast_validator_is_refused_with_a_message():
    deep = [json.loads("[" * 300 + "]" * 300), json.loads("[" * 301 + "]" * 301)]
    with pytest.raises(InvalidRunRequest, match=r'^tools/\d: .* is not of type "string"'):
        parse_run_request({**_REQUEST, "tools": deep})


def _nested(depth: int) -> list:
    return json.loads("[" * depth + "]" * depth)


#: Values jsonschema itself cannot check: refused, naming why, not a crash
#: (a run would fail, a request would get a 500).
_UNCHECKABLE = {
    "nested too deeply": (
        {"type": "array", "uniqueItems": True},
        [_nested(500), _nested(501)],
        "(arguments): nested too deeply to be checked",
    ),
    "an integer too large for a float multipleOf": (
        {"multipleOf": 0.5},
        10**400,
        "(arguments): holds a number too large to be checked",
    ),
}


@pytest.mark.parametrize("case", _UNCHECKABLE)
def test_a_value_that_cannot_be_checked_is_refused_naming_why(case):
    schema, value, message = _UNCHECKABLE[case]
    assert argument_errors(schema, value) == [message]


def test_a_run_request_that_cannot_be_checked_is_refused_naming_why():
    with pytest.raises(InvalidRunRequest, match="^request: nested too deeply to be checked$"):
        parse_run_request({**_REQUEST, "tools": [_nested(500), _nested(501)]})


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "examples": [{"$ref": "other.json"}], "default": {"$ref": "x.json"}},
        {"type": "object", "properties": {"$ref": {"type": "string"}}},
        {
            "$id": "http://example.com/root",
            "$ref": "http://example.com/root#/$defs/a",
            "$defs": {"a": {"type": "string"}},
        },
        {
            "$defs": {"a": {"$id": "http://example.com/a", "type": "string"}},
            "$ref": "http://example.com/a",
        },
        {"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a"},
    ],
)
def test_a_schema_whose_references_stay_inside_it_is_accepted(schema):
    assert check_schema(schema) is None


@pytest.mark.parametrize(
    "schema",
    [
        {"allOf": [{"$ref": "#"}]},
        {"$ref": "#"},
        {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]}, "b": {"not": {"$ref": "#/$defs/a"}}}},
        {"$defs": {"a": {"$id": "http://example.com/a", "if": {"$ref": "#"}}}},
    ],
)
def test_a_schema_that_refers_to_itself_in_place_is_refused(schema):
    """Checking any value against it recurses until the interpreter's
    limit: every call would be refused, so the schema is."""
    assert check_schema(schema) == (
        "parameters refers to itself in place (a $ref cycle), which never ends"
    )


def test_a_schema_that_refers_to_itself_inside_a_part_of_the_value_is_accepted():
    tree = {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#"}}}}
    assert check_schema(tree) is None
    assert argument_errors(tree, {"children": [{"children": []}]}) == []


def _items_nested(depth: int) -> dict:
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def test_a_schema_nested_past_the_limit_is_refused_naming_the_limit_not_raised():
    assert check_schema(_items_nested(60)) is None
    assert check_schema(_items_nested(150)) == (
        "parameters is nested more than 64 levels deep, too deep to check"
    )


def test_a_message_quoting_a_huge_value_is_cut_and_still_says_what_is_wrong():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    (problem,) = argument_errors(schema, {"n": "x" * 1_000_000})
    assert len(problem) < 700, len(problem)
    assert problem.startswith("n: 'xxx")
    assert problem.endswith("... (1000002 characters) is not of type 'integer'")


def test_a_value_with_thousands_of_problems_reports_the_first_few():
    problems = argument_errors({"type": "array", "items": {"type": "integer"}}, ["x"] * 5000)
    assert len(problems) == 21
    assert problems[-1] == "(arguments): 4980 more problems not listed"


@pytest.mark.django_db
def test_an_api_400_quoting_a_huge_value_is_cut(api):
    response = api.post(
        "/api/runs/",
        {"prompt": ["x" * 1_000_000], "provider": {"kind": "scripted", "turns": []}},
        format="json",
    )
    assert response.status_code == 400, response.content[:500]
    assert len(response.content) < 1000, len(response.content)
    assert 'is not of type "string"' in response.json()["detail"]
