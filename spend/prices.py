"""What a model turn costs: the price a run's model has, and a turn's cost
at that price.

A run's model is fixed by its request: the provider kind and its
``model`` (a scripted run's model is ``scripted``). The attempt reads the
price with its claim; each turn's cost is computed from its usage when it
is recorded and stored with it (G17).
"""

from dataclasses import dataclass
from decimal import Decimal

from spend.models import MONEY, ModelPrice

_PER_MILLION = Decimal(1_000_000)
_MONEY_STEP = Decimal(1).scaleb(-MONEY["decimal_places"])


@dataclass(frozen=True)
class Price:
    """Per million tokens."""

    input: Decimal
    cached_input: Decimal
    output: Decimal

    @classmethod
    def from_row(cls, row: ModelPrice) -> "Price":
        return cls.of(row.input_per_million, row.cached_input_per_million, row.output_per_million)

    @classmethod
    def of(cls, input_price, cached_price, output_price) -> "Price":
        input_price = Decimal(input_price)
        cached = input_price if cached_price is None else Decimal(cached_price)
        return cls(input_price, cached, Decimal(output_price))

    def as_json(self) -> dict:
        return {
            "input": str(self.input),
            "cached_input": str(self.cached_input),
            "output": str(self.output),
        }


@dataclass(frozen=True)
class Usage:
    """One turn's tokens as its provider reported them."""

    prompt: int = 0
    #: Of ``prompt``, served from the provider's cache.
    cached: int = 0
    completion: int = 0
    #: False: the provider did not say what the turn cost — no usage, or a
    #: prompt or completion count missing, null or not a sane whole number
    #: (some proxies send ``"usage": {}``). Its tokens count 0 and its cost
    #: is unknown: never taken for a turn that cost nothing (G17).
    reported: bool = True

    @classmethod
    def of_result(cls, result) -> "Usage | None":
        """The usage an llm step's result reports, or None when the step is
        no model turn that reports usage (a scripted turn without it)."""
        if not isinstance(result, dict) or "usage" not in result:
            return None
        usage = result.get("usage")
        if not isinstance(usage, dict):
            return cls(reported=False)
        prompt = reported_count(usage.get("prompt_tokens"))
        completion = reported_count(usage.get("completion_tokens"))
        if prompt is None or completion is None:
            return cls(reported=False)
        cached = min(reported_count(usage.get("cached_tokens")) or 0, prompt)
        return cls(prompt, cached, completion)

    @property
    def total(self) -> int:
        return self.prompt + self.completion

    def cost(self, price: Price) -> Decimal:
        uncached = self.prompt - self.cached
        amount = (
            uncached * price.input
            + self.cached * price.cached_input
            + self.completion * price.output
        ) / _PER_MILLION
        return amount.quantize(_MONEY_STEP)


def reported_count(value) -> int | None:
    """A provider's token count if it is a sane whole number (0 to 10**8, as
    the run's totals are database integers), else None: not reported."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 10**8:
        return value
    return None


def priced_model(provider_spec: dict) -> tuple[str, str]:
    """(provider kind, model) that a run's request is priced as."""
    kind = str(provider_spec.get("kind", ""))
    return kind, str(provider_spec.get("model") or kind)


def price_of(provider: str, model: str) -> Price | None:
    """The price in force for the model now, or None if it has none."""
    row = ModelPrice.objects.filter(provider=provider, model=model).first()
    return None if row is None else Price.from_row(row)


def money(value) -> Decimal:
    """``value`` as money (10 decimal places)."""
    return Decimal(value).quantize(_MONEY_STEP)
