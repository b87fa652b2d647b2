"""Prices from a file: ``manage.py load_prices FILE --user NAME`` (G17).

The file is JSON, a list of entries ``{"provider", "model",
"input_per_million", "output_per_million"}`` and optionally
``"cached_input_per_million"``; amounts as numbers or decimal strings.
Everything is checked before anything is written: one bad entry loads
nothing, and the error names it. Each price created or changed is an admin
log entry under the user who loaded it, as an edit in the admin is.
"""

import json
from decimal import Decimal, InvalidOperation

from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.db import transaction

from spend.models import PRICE, ModelPrice
from tools.canonical import storable_text

_AMOUNTS = ("input_per_million", "cached_input_per_million", "output_per_million")
_REQUIRED = ("provider", "model", "input_per_million", "output_per_million")
_LARGEST = Decimal(10) ** (PRICE["max_digits"] - PRICE["decimal_places"])


class PriceFileError(ValueError):
    """The file cannot be loaded; the message names the entry and field."""


def parse_price_file(text: str) -> list[dict]:
    try:
        entries = json.loads(text)
    except ValueError as error:  # JSONDecodeError, or a number past Python's digit limit
        raise PriceFileError(f"not JSON: {error}") from None
    if not isinstance(entries, list):
        raise PriceFileError("the file must hold a JSON list of prices")
    parsed, seen = [], set()
    for index, entry in enumerate(entries):
        parsed.append(_entry(index, entry))
        key = (parsed[-1]["provider"], parsed[-1]["model"])
        if key in seen:
            raise PriceFileError(f"entry {index}: {key[0]}/{key[1]} is listed twice")
        seen.add(key)
    return parsed


def _entry(index: int, entry) -> dict:
    where = f"entry {index}"
    if not isinstance(entry, dict):
        raise PriceFileError(f"{where}: must be an object")
    unknown = sorted(set(entry) - {*_REQUIRED, *_AMOUNTS})
    if unknown:
        raise PriceFileError(f"{where}: unknown field(s) {unknown}")
    missing = [name for name in _REQUIRED if name not in entry]
    if missing:
        raise PriceFileError(f"{where}: missing {missing}")
    parsed = {}
    for name, limit in (("provider", 32), ("model", 200)):
        value = entry[name]
        if not isinstance(value, str) or not value.strip() or len(value) > limit:
            raise PriceFileError(f"{where}: {name} must be text of 1 to {limit} characters")
        if storable_text(value) != value:
            raise PriceFileError(f"{where}: {name} holds a NUL or a lone surrogate")
        parsed[name] = value
    for name in _AMOUNTS:
        if name in entry and not (name == "cached_input_per_million" and entry[name] is None):
            parsed[name] = _amount(f"{where}: {name}", entry[name])
    parsed.setdefault("cached_input_per_million", None)
    return parsed


def _amount(where: str, raw) -> Decimal:
    try:
        value = None if isinstance(raw, bool) else Decimal(str(raw))
    except InvalidOperation:
        value = None
    if value is not None and value.is_finite() and abs(value) < _LARGEST:
        # What the column holds: compared once rounded to it.
        value = value.quantize(Decimal(1).scaleb(-PRICE["decimal_places"]))
    if value is None or not value.is_finite() or value < 0 or value >= _LARGEST:
        raise PriceFileError(
            f"{where}: {str(raw)[:40]!r} is not an amount from 0 to below {_LARGEST}"
        )
    return value


def load_prices(entries: list[dict], user) -> tuple[int, int, int]:
    """Create or change a price per entry, each change an admin log entry
    under ``user``; returns (created, changed, unchanged)."""
    created = changed = unchanged = 0
    with transaction.atomic():
        for entry in entries:
            key = {"provider": entry["provider"], "model": entry["model"]}
            amounts = {name: entry[name] for name in _AMOUNTS}
            price = ModelPrice.objects.select_for_update().filter(**key).first()
            if price is None:
                price = ModelPrice.objects.create(**key, **amounts)
                flag, message, created = ADDITION, [{"added": {}}], created + 1
            else:
                fields = [name for name in _AMOUNTS if getattr(price, name) != amounts[name]]
                if not fields:
                    unchanged += 1
                    continue
                for name, value in amounts.items():
                    setattr(price, name, value)
                price.save()
                names = [str(ModelPrice._meta.get_field(name).verbose_name) for name in fields]
                flag, message, changed = CHANGE, [{"changed": {"fields": names}}], changed + 1
            LogEntry.objects.log_actions(
                user.pk,
                [price],
                action_flag=flag,
                change_message=[*message, {"loaded_from_file": True}],
                single_object=True,
            )
    return created, changed, unchanged
