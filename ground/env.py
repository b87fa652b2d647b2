"""Strict readers for environment variables.

Configuration comes only from the environment. A malformed value stops
start-up with ``ImproperlyConfigured`` naming the variable, instead of being
silently replaced by a default.
"""

import os
import re
from decimal import Decimal, InvalidOperation

import httpx
from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(
        f"{name}={raw!r} is not a boolean; use one of {sorted(_TRUE | _FALSE)}"
    )


def env_int(
    name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be at most {maximum}")
    return value


def env_decimal(name: str, *, maximum: int) -> Decimal | None:
    """A decimal amount from 0 to ``maximum`` with at most 10 decimal places
    (what a cost holds: "2.50"), or None when unset, empty or 0."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    text = raw.strip()
    try:
        value = Decimal(text) if _DECIMAL.fullmatch(text) else None
    except InvalidOperation:
        value = None
    if value is None or value > maximum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be a decimal amount from 0 to {maximum}")
    if value.as_tuple().exponent < -10:
        raise ImproperlyConfigured(f"{name}={raw!r} has more than 10 decimal places")
    return value or None


_DECIMAL = re.compile(r"[0-9]+(\.[0-9]+)?")


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``; anything else stops start-up naming them."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip()
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={raw!r} must be one of {list(choices)}")
    return value


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    """A comma-separated list; blank items are dropped."""
    raw = os.environ.get(name)
    if raw is None:
        return list(default or [])
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_http_url(name: str) -> str:
    """An http(s) URL with a host, or "" when unset. Parsed as the HTTP
    client will parse it, so a URL accepted here is one it can send to;
    credentials in it are refused (they would be logged with it)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return ""
    if any(character.isspace() for character in raw):
        raise ImproperlyConfigured(f"{name}={raw!r} must not contain spaces")
    try:
        url = httpx.URL(raw)
    except httpx.InvalidURL as error:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a valid URL ({error})") from None
    if url.scheme not in ("http", "https"):
        raise ImproperlyConfigured(f"{name}={raw!r} must be an http or https URL")
    if not url.host:
        raise ImproperlyConfigured(f"{name}={raw!r} has no host")
    if url.port is not None and not 0 < url.port < 65536:
        raise ImproperlyConfigured(f"{name}={raw!r}: port {url.port} is not a TCP port")
    if url.userinfo:
        # Named without the URL: it holds the secret.
        raise ImproperlyConfigured(f"{name} must not hold a user name or password (user@host)")
    return raw


#: What an entry of ``NRLLM_PROVIDER_RATE_LIMITS`` may say, per minute.
RATE_LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute")


def env_rate_limits(name: str) -> dict[str, dict[str, int]]:
    """A JSON object: ``"<kind>:<model>"`` (or ``"<kind>:*"``, any model of the
    kind) → ``{"requests_per_minute": n, "tokens_per_minute": n}``, either
    or both, each a positive whole number. {} when unset."""
    import json

    raw = os.environ.get(name, "").strip()
    if not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError as error:
        raise ImproperlyConfigured(f"{name} is not JSON ({error})") from None
    if not isinstance(parsed, dict):
        raise ImproperlyConfigured(f'{name} must be a JSON object of "kind:model" → limits')
    limits = {}
    for target, entry in parsed.items():
        kind, colon, model = target.partition(":")
        if not (kind and colon and model):
            raise ImproperlyConfigured(f'{name}: {target!r} must be "kind:model" or "kind:*"')
        if not isinstance(entry, dict) or not entry or set(entry) - set(RATE_LIMIT_FIELDS):
            raise ImproperlyConfigured(
                f"{name}: {target!r} must be an object of {' and/or '.join(RATE_LIMIT_FIELDS)}"
            )
        for field, value in entry.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ImproperlyConfigured(
                    f"{name}: {target!r} {field}={value!r} must be a whole number of at least 1"
                )
        limits[target] = dict(entry)
    return limits
