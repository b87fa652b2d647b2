"""An agent's definition, checked as a run's request is (G18).

A definition is what a version holds: ``instructions``, ``provider``,
``tools``, ``require_approval``, ``max_iterations``, the limits
``max_total_tokens`` and ``max_cost``, and ``webhook``. It is checked by
the same code, and refused in the same words, as a run request that gave
them whole (``runs.runtime.run_request``): an unknown or disabled tool, a
provider kind that does not exist, a negative limit, a webhook to a host
not allowed, a cost limit on a model with no price. A field left out, or
null, takes the deployment's default when a run starts, as it would in a
request.
"""

from runs.runtime.enqueue_spend import check_spend_at_enqueue
from runs.runtime.run_request import InvalidRunRequest, parse_run_request

#: The fields of a definition, in the order they are shown.
FIELDS = (
    "instructions",
    "provider",
    "tools",
    "require_approval",
    "max_iterations",
    "max_total_tokens",
    "max_cost",
    "webhook",
)
#: What a check puts in the prompt's place: a definition has none.
_NO_PROMPT = "(an agent's definition, checked)"


class InvalidDefinition(ValueError):
    """The definition cannot be saved; the message names the field."""


def check_definition(data) -> dict:
    """``data`` as a version stores it (every field of ``FIELDS``, the
    limits None when not given), or ``InvalidDefinition`` naming the first
    problem. Checks the tools and prices as they are now: a version that
    was valid when saved may be refused later, when a run starts from it."""
    if not isinstance(data, dict):
        raise InvalidDefinition("definition: must be a JSON object")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise InvalidDefinition(
            f"definition: unknown field(s) {unknown}; an agent has {list(FIELDS)} "
            "(each run gives its own input)"
        )
    given = {name: value for name, value in data.items() if value is not None}
    if "provider" not in given:
        raise InvalidDefinition('provider: required, e.g. {"kind": "openai", "model": "..."}')
    try:
        request = parse_run_request({**given, "prompt": _NO_PROMPT})
        check_spend_at_enqueue(request, None)
    except InvalidRunRequest as error:
        raise InvalidDefinition(str(error)) from None
    return {
        "instructions": request.instructions,
        "provider": request.provider,
        "tools": list(request.tools),
        "require_approval": list(request.require_approval),
        "max_iterations": request.max_iterations,
        "max_total_tokens": request.max_total_tokens if "max_total_tokens" in given else None,
        "max_cost": request.max_cost if "max_cost" in given else None,
        "webhook": request.webhook,
    }
