"""What every API view shares: the body size limit and documented errors."""

from django.conf import settings
from drf_spectacular.utils import OpenApiResponse
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import SAFE_METHODS
from rest_framework.views import APIView

from api.errors import PayloadTooLarge
from api.serializers import ErrorSerializer
from teams import access


def errors(*statuses: int) -> dict:
    """Schema entries for the error responses a view can give."""
    descriptions = {
        400: "bad input: the body names the problem",
        401: "not authenticated",
        403: "missing permission: the role it takes in the object's team, or a read-only token",
        404: "no such object (another team's is not found either)",
        409: "refused by the run's state: code and detail say why",
        413: "body larger than NRLLM_API_MAX_BODY_BYTES",
        422: "Idempotency-Key reused with another body",
        429: "throttled, or (creating a run) its submitter's budget is spent: "
        "Retry-After says until when",
    }
    return {
        code: OpenApiResponse(ErrorSerializer, description=descriptions[code])
        for code in (401, 403, 429, *statuses)
    }


# No docstring: drf-spectacular takes the first docstring in a view's
# classes as its operations' description, and this one describes no
# operation (it was shown for eight of them).
class LimitedBodyMixin:
    # Refuse an oversized body before parsing it (413), storing nothing;
    # and any request but a read from a read-only token (403), before the
    # view's own permission, so the answer says why (G22).

    def initial(self, request, *args, **kwargs):
        length = request.META.get("CONTENT_LENGTH") or "0"
        if length.isdigit() and int(length) > settings.NRLLM_API_MAX_BODY_BYTES:
            raise PayloadTooLarge(
                f"body of {length} bytes is over the limit of "
                f"{settings.NRLLM_API_MAX_BODY_BYTES} (NRLLM_API_MAX_BODY_BYTES)"
            )
        super().initial(request, *args, **kwargs)

    def check_permissions(self, request):
        scope = access.token_scope_of(request.user)
        if scope is not None and scope.read_only and request.method not in SAFE_METHODS:
            raise PermissionDenied("this API token is read-only: it may only read (GET)")
        super().check_permissions(request)


class BaseAPIView(LimitedBodyMixin, APIView):
    pass
