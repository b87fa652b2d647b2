"""The most a model call can cost, known before it is made.

A run's limits (G17) and its submitter's budget (G21) must have room for
it: the prompt's tokens are bounded by the UTF-8 bytes of what is sent, the
completion's by its ``max_tokens``, each priced at the model's dearer rate.
A call whose size fits beside what is spent cannot pass the limit, as long
as the provider reports no more than the bound.
"""

import json
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings

from spend.prices import Price, money

_PER_MILLION = Decimal(1_000_000)


@dataclass(frozen=True)
class CallSize:
    """The most a model call can cost: what its run's limits (G17) and its
    submitter's budget (G21) must have room for before it is made."""

    tokens: int
    completion: int
    cost: Decimal

    @classmethod
    def of(cls, messages, tool_specs, max_tokens: int | None, price: Price | None) -> "CallSize":
        """The call of ``messages`` and ``tool_specs`` answered in at most
        ``max_tokens`` (None: ``NRLLM_RESERVE_MAX_TOKENS``) at ``price``.
        Whole: JSON Schema's integer takes 40.0, which a stored request
        keeps, and a float cannot be priced in decimals."""
        completion = int(max_tokens or settings.NRLLM_RESERVE_MAX_TOKENS)
        tokens = largest_tokens(messages, tool_specs, completion)
        return cls(tokens, completion, largest_cost(tokens - completion, completion, price))


def largest_tokens(messages, tool_specs, max_tokens: int) -> int:
    """The most tokens a call of ``messages`` and ``tool_specs`` answered in
    at most ``max_tokens`` can cost: a byte-level BPE token (OpenAI's and
    most others') covers at least one byte, so the prompt's tokens are at
    most the UTF-8 bytes of what is sent (its JSON, with the quoting and
    keys, a generous margin for a message's few framing tokens)."""
    sent = json.dumps([messages, tool_specs], ensure_ascii=False, separators=(",", ":"))
    return len(sent.encode()) + max_tokens


def largest_cost(prompt_tokens: int, max_tokens: int, price: Price | None) -> Decimal:
    """What ``prompt_tokens`` in and ``max_tokens`` out cost at most at
    ``price`` (none: 0, for a budget in tokens; a cost limit needs a price)."""
    if price is None:
        return Decimal(0)
    per_input = max(price.input, price.cached_input)
    return money((prompt_tokens * per_input + max_tokens * price.output) / _PER_MILLION)
