"""Throttling per API token (per user for session logins)."""

from django.conf import settings
from rest_framework.throttling import SimpleRateThrottle


class PerTokenThrottle(SimpleRateThrottle):
    scope = "token"

    def get_rate(self):
        # Read at request time, so NRLLM_API_THROTTLE_RATE (and tests) apply.
        return settings.NRLLM_API_THROTTLE_RATE

    def get_cache_key(self, request, view):
        if request.user is None or not request.user.is_authenticated:
            return None  # refused before throttling matters
        token = getattr(request.auth, "token_key", None)
        ident = f"token:{token}" if token else f"user:{request.user.pk}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
