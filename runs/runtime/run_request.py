"""The request that starts a run: parsed and checked before anything is stored.

A request names ``prompt``, ``tools`` (offered tool names), ``provider`` and
optionally ``instructions`` (the system message the model is sent first),
``webhook`` (a URL told when the run ends, G19; its host must be allowed
as for the HTTP tools), ``max_iterations``, ``require_approval`` (tools among
``tools`` whose calls wait for an operator's approval although their policy
does not ask for it: a request may ask for more approvals, never fewer),
``max_total_tokens`` and ``max_cost`` (the run's limits over all its
attempts, G17; ``NRLLM_RUN_MAX_*`` fill them in, and they are stored with it).
Anything else, or anything malformed, is refused with ``InvalidRunRequest``
naming the problem.
"""

import copy
import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from jsonschema.exceptions import best_match

from runs.providers import PROVIDER_KINDS
from runs.runtime.json_text import json_notation, shown
from tools.builtin.http_guard import check_url_allowed
from tools.canonical import storable_text
from tools.contract import ToolError
from tools.enabled import disabled_tool_names
from tools.registry import get_registry
from tools.validation import UNCHECKABLE, compiled_schema, uncheckable


class InvalidRunRequest(ValueError):
    """The request cannot start a run; the message says why."""


@dataclass(frozen=True)
class RunRequest:
    prompt: str
    tools: tuple[str, ...]
    provider: dict
    max_iterations: int
    require_approval: tuple[str, ...] = ()
    #: The run's limits over all its attempts (G17); None: none.
    max_total_tokens: int | None = None
    max_cost: Decimal | None = None
    #: The system message (an agent's instructions, G18); "": none.
    instructions: str = ""
    #: Told when the run ends (G19); "": nobody.
    webhook: str = ""

    def as_json(self) -> dict:
        stored = {
            "prompt": self.prompt,
            "tools": list(self.tools),
            "provider": self.provider,
            "max_iterations": self.max_iterations,
        }
        if self.require_approval:
            stored["require_approval"] = list(self.require_approval)
        if self.max_total_tokens is not None:
            stored["max_total_tokens"] = self.max_total_tokens
        if self.max_cost is not None:
            # A decimal string: a JSON number would not keep it exact. Fixed
            # point ("0.0000005", never "5E-7"), as the stored form is read.
            stored["max_cost"] = format(self.max_cost, "f")
        # Stored only when given: a request stored before they existed reads
        # the same, and so does its journal (G12).
        if self.instructions:
            stored["instructions"] = self.instructions
        if self.webhook:
            stored["webhook"] = self.webhook
        return stored


_REQUEST_SCHEMA = {
    "type": "object",
    "properties": {
        "prompt": {"type": "string", "minLength": 1, "maxLength": 100_000},
        "instructions": {"type": "string", "maxLength": 100_000},
        "webhook": {"type": "string", "maxLength": 2000},
        "tools": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "provider": {
            "type": "object",
            "properties": {"kind": {"type": "string"}},
            "required": ["kind"],
        },
        "max_iterations": {"type": "integer", "minimum": 1},
        "require_approval": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        # At most what a JSON number holds exactly (and a version's column).
        "max_total_tokens": {"type": "integer", "minimum": 1, "maximum": 2**53},
        "max_cost": {"type": ["number", "string"]},
    },
    "required": ["prompt", "provider"],
    "additionalProperties": False,
}


def _schema_problem(schema: dict, value, prefix: str = "") -> str | None:
    compiled = compiled_schema(schema)
    try:
        if compiled.is_valid(value):
            return None
        error = best_match(compiled.iter_errors(value))
    except UNCHECKABLE as error:
        return f"{prefix or 'request'}: {uncheckable(error)}"
    path = "/".join(str(part) for part in error.absolute_path)
    where = "/".join(part for part in (prefix, path) if part) or "request"
    return f"{where}: {json_notation(error.message)}"


def parse_run_request(data) -> RunRequest:
    """Check ``data`` and return the request it describes, or raise."""
    problem = _unstorable(data)
    if problem:
        raise InvalidRunRequest(problem)
    provider_class = _check_shape(data, _REQUEST_SCHEMA)
    problem = provider_class.configuration_problem()
    if problem:
        raise InvalidRunRequest(f"provider: {problem}")

    registry = get_registry()
    tools = tuple(data.get("tools", []))
    unknown = [name for name in tools if name not in registry]
    if unknown:
        raise InvalidRunRequest(
            f"tools: unknown tool(s) {shown(unknown)}; known: {shown(registry.names())}"
        )
    disabled = sorted(disabled_tool_names() & set(tools))
    if disabled:
        raise InvalidRunRequest(f"tools: disabled by an operator: {shown(disabled)}")
    unavailable = registry.unavailable(tools)
    if unavailable:
        reasons = "; ".join(f"{name}: {why}" for name, why in unavailable.items())
        raise InvalidRunRequest(f"tools: unavailable now: {reasons}")

    require_approval = tuple(data.get("require_approval", []))
    not_offered = [name for name in require_approval if name not in tools]
    if not_offered:
        raise InvalidRunRequest(
            f"require_approval: {shown(not_offered)} not among the run's tools {shown(list(tools))}"
        )
    never = [name for name in require_approval if _never_needs_approval(registry, name)]
    if never:
        raise InvalidRunRequest(
            f"require_approval: {shown(never)} never waits for an approval: a question is "
            "answered by a person already (G24)"
        )

    cap = settings.NRLLM_MAX_ITERATIONS
    max_iterations = data.get("max_iterations", cap)
    if not isinstance(max_iterations, int):
        # JSON Schema calls 2.0 an integer; a range of iterations does not.
        raise InvalidRunRequest(f"max_iterations: {shown(max_iterations)} is not a whole number")
    if max_iterations > cap:
        raise InvalidRunRequest(
            f"max_iterations: {max_iterations} is above the limit of {cap} (NRLLM_MAX_ITERATIONS)"
        )
    return RunRequest(
        prompt=data["prompt"],
        tools=tools,
        provider=data["provider"],
        max_iterations=max_iterations,
        require_approval=require_approval,
        max_total_tokens=_max_total_tokens(data, settings.NRLLM_RUN_MAX_TOTAL_TOKENS),
        max_cost=_max_cost(data, settings.NRLLM_RUN_MAX_COST),
        instructions=data.get("instructions", ""),
        webhook=_webhook(data.get("webhook", "")),
    )


def _webhook(url: str) -> str:
    """``url`` if the run-ended webhook may be sent there: http(s), to a
    host and port ``NRLLM_HTTP_ALLOWED_HOSTS`` allows, as for the HTTP tools
    (each delivery resolves and checks its addresses again, G19)."""
    if not url:
        return ""
    try:
        check_url_allowed(url)
    except ToolError as error:
        raise InvalidRunRequest(f"webhook: {error}") from None
    return url


def _max_total_tokens(data: dict, default: int | None) -> int | None:
    value = data.get("max_total_tokens", default)
    if value is not None and not isinstance(value, int):
        raise InvalidRunRequest(f"max_total_tokens: {shown(value)} is not a whole number")
    return value


def _max_cost(data: dict, default: Decimal | None, *, stored: bool = False) -> Decimal | None:
    """A cost limit above 0 and at most ``_MAX_COST``: a number, or a decimal
    string of ASCII digits ("2.50"). A stored one is taken as it was stored."""
    if "max_cost" not in data:
        return default
    raw = data["max_cost"]
    value = None
    if isinstance(raw, str) and _DECIMAL.fullmatch(raw):
        value = Decimal(raw)
    elif stored and isinstance(raw, str) and _STORED_EXPONENT.fullmatch(raw):
        value = Decimal(raw)  # stored as str(Decimal) before fixed point, e.g. "5E-7"
    elif isinstance(raw, int | float) and not isinstance(raw, bool) and math.isfinite(raw):
        value = Decimal(str(raw))
    if stored and value is not None:
        return value
    if value is not None and value.as_tuple().exponent < -10:
        value = value.quantize(_COST_STEP)  # what a cost can hold
    if value is None or not 0 < value <= _MAX_COST:
        raise InvalidRunRequest(
            f"max_cost: {shown(raw[:40] if isinstance(raw, str) else raw)} is not an amount "
            f"above 0 and at most {_MAX_COST} "
            '(a number, or a decimal string such as "2.50")'
        )
    return value


_DECIMAL = re.compile(r"[0-9]{1,12}(\.[0-9]{1,12})?")
_STORED_EXPONENT = re.compile(r"[0-9](\.[0-9]{1,12})?E-[0-9]{1,2}")
_MAX_COST = Decimal(10**9)
_COST_STEP = Decimal(1).scaleb(-10)


def _unstorable(value) -> str | None:
    """Where ``value`` holds what the database cannot store (a NUL, a lone
    surrogate, NaN or an infinity), or None."""
    try:
        # One pass in C: what would need looking into shows in the escapes.
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return _unstorable_at(value)
    if "\\u0000" in text or "\\ud" in text:  # a NUL, or a surrogate (maybe a whole pair)
        return _unstorable_at(value)
    return None


def _unstorable_at(value, path: str = "") -> str | None:
    where = path or "request"
    if isinstance(value, str):
        if storable_text(value) != value:
            return f"{where}: contains a character that cannot be stored (NUL or a lone surrogate)"
    elif isinstance(value, float) and not math.isfinite(value):
        return f"{where}: {value} is not a JSON number"
    elif isinstance(value, dict):
        for key, item in value.items():
            problem = _unstorable_at(str(key), where) or _unstorable_at(
                item, f"{path}/{key}".lstrip("/")
            )
            if problem:
                return problem
    elif isinstance(value, list):
        for index, item in enumerate(value):
            problem = _unstorable_at(item, f"{path}/{index}".lstrip("/"))
            if problem:
                return problem
    return None


#: A stored request is one ``RunRequest.as_json`` wrote: every field present.
_STORED_SCHEMA = {**_REQUEST_SCHEMA, "required": ["prompt", "tools", "provider", "max_iterations"]}


def _never_needs_approval(registry, name: str) -> bool:
    tool = registry.get(name)
    return bool(getattr(tool, "never_needs_approval", False))


def parse_stored_request(data) -> RunRequest:
    """The request a stored run was enqueued with, or ``InvalidRunRequest``
    if it no longer parses (a provider kind since removed, say). What was
    policy at enqueue (known and enabled tools, the iteration cap) is not
    checked again: a worker does not offer tools that are gone or disabled."""
    _check_shape(data, _STORED_SCHEMA)
    return RunRequest(
        prompt=data["prompt"],
        tools=tuple(data["tools"]),
        provider=data["provider"],
        max_iterations=data["max_iterations"],
        require_approval=tuple(data.get("require_approval", [])),
        max_total_tokens=_max_total_tokens(data, None),
        max_cost=_max_cost(data, None, stored=True),
        instructions=data.get("instructions", ""),
        webhook=data.get("webhook", ""),
    )


def request_json_schema(*, stored: bool = False) -> dict:
    """The JSON Schema a run's request is checked against — ``stored``: as
    ``RunRequest.as_json`` keeps it, each field it always writes required —
    with ``provider`` one of the provider kinds' own schemas, which
    ``parse_run_request`` checks as its second step. What the API's schema
    shows of a request: built from these, it cannot drift from them. (What
    is policy, not shape — known and enabled tools, allowed webhook hosts,
    the limits' bounds — is checked by ``parse_run_request`` alone.) A
    copy, the caller's to annotate."""
    schema = copy.deepcopy(_STORED_SCHEMA if stored else _REQUEST_SCHEMA)
    schema["properties"]["provider"] = {
        "oneOf": [copy.deepcopy(kind.spec_schema) for _, kind in sorted(PROVIDER_KINDS.items())]
    }
    return schema


def _check_shape(data, schema: dict):
    """Check ``data`` against ``schema`` and its provider against its kind's
    schema; return the provider class, or raise."""
    problem = _schema_problem(schema, data)
    if problem:
        raise InvalidRunRequest(problem)
    provider = data["provider"]
    provider_class = PROVIDER_KINDS.get(provider["kind"])
    if provider_class is None:
        raise InvalidRunRequest(
            f"provider/kind: unknown provider {shown(provider['kind'])}; "
            f"known: {shown(sorted(PROVIDER_KINDS))}"
        )
    problem = _schema_problem(provider_class.spec_schema, provider, prefix="provider")
    if problem:
        raise InvalidRunRequest(problem)
    return provider_class
