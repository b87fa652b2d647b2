"""Checking an event's signature (G23), by the trigger's scheme:

- Standard Webhooks (the ``standardwebhooks`` package): ``webhook-id``,
  ``webhook-timestamp`` and ``webhook-signature`` (``v1,`` and the base64
  HMAC-SHA256 of ``id.timestamp.body`` under the ``whsec_`` secret); a
  timestamp more than ``TOLERANCE_SECONDS`` from now either way is stale.
- GitHub: ``X-Hub-Signature-256`` (``sha256=`` and the hex HMAC-SHA256 of
  the body). GitHub's scheme carries no timestamp: a replayed delivery is
  only dropped by its event id (``X-GitHub-Delivery``) within the window.

Both compare in constant time, over the body's exact bytes.
"""

import base64
import hashlib
import hmac

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from triggers.models import SignatureScheme

#: How far a Standard Webhooks timestamp may be from now (the package's own).
TOLERANCE_SECONDS = 5 * 60


class Unauthenticated(Exception):
    """Why the signature was not accepted, for the log (the sender hears
    only that it was not)."""


def standard_webhook(secret: str) -> Webhook:
    """The package's verifier for ``secret``; ``ValueError`` naming what
    is wrong with a secret it cannot take."""
    try:
        return Webhook(secret)
    except Exception as error:  # binascii.Error, an empty secret
        raise ValueError(
            f"a Standard Webhooks secret is whsec_ and base64 ({type(error).__name__})"
        ) from None


def key_bytes(scheme: str, secret: str) -> bytes:
    """The HMAC key ``secret`` stands for under ``scheme``; ``ValueError``
    naming what is wrong with one that stands for none."""
    if scheme == "github":
        return secret.encode()
    standard_webhook(secret)  # refuses what the package cannot take
    # As the package reads it: base64 after the prefix, padding added.
    return base64.b64decode(secret.removeprefix("whsec_") + "==")


def verify(trigger, headers, body: bytes) -> None:
    """Raise ``Unauthenticated`` unless ``body`` carries ``trigger``'s
    signature (and, for Standard Webhooks, a fresh timestamp)."""
    if trigger.scheme == SignatureScheme.STANDARD_WEBHOOKS:
        try:
            standard_webhook(trigger.secret).verify(body, dict(headers), json_parse=False)
        except (WebhookVerificationError, ValueError) as error:
            raise Unauthenticated(str(error)) from None
        return
    given = headers.get("X-Hub-Signature-256", "")
    expected = "sha256=" + hmac.new(trigger.secret.encode(), body, hashlib.sha256).hexdigest()
    if not given:
        raise Unauthenticated("no X-Hub-Signature-256 header")
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise Unauthenticated("the X-Hub-Signature-256 does not match")
