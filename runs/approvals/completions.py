"""Where another system completes a deferred call (G24): a URL signed for
the call's idempotency key, the same for every attempt at the call.

The signature is Django's ``Signer`` (HMAC of ``SECRET_KEY``) over the
key with a salt of its own, so a URL is good for its call only and cannot
be made without the deployment's secret. A URL signed before a rotation of
``SECRET_KEY`` stays good while the old key is in ``SECRET_KEY_FALLBACKS``:
a call handed on for a day outlives a rotation.
"""

from django.conf import settings
from django.core.signing import BadSignature, Signer
from django.urls import reverse

_SALT = "nrllm.deferred-completion"


def signature_for(idempotency_key: str) -> str:
    return Signer(salt=_SALT).signature(idempotency_key)


def is_signed(idempotency_key: str, signature: str) -> bool:
    """Whether ``signature`` is this deployment's for the key, by its secret
    or a fallback one (``Signer.unsign`` compares in constant time)."""
    signer = Signer(salt=_SALT)  # reads SECRET_KEY and its fallbacks now
    try:
        signer.unsign(f"{idempotency_key}{signer.sep}{signature}")
    except BadSignature:
        return False
    return True


def completion_url(idempotency_key: str) -> str:
    """The URL the other system POSTs the call's result to."""
    path = reverse(
        "api-completion",
        kwargs={"key": idempotency_key, "signature": signature_for(idempotency_key)},
    )
    return f"{settings.NRLLM_PUBLIC_URL}{path}"
