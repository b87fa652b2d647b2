"""What every API view shares: the body size limit and documented errors."""

from django.conf import settings
from drf_spectacular.utils import OpenApiResponse
from rest_framework.views import APIView

from api.errors import PayloadTooLarge
from api.serializers import ErrorSerializer


def errors(*statuses: int) -> dict:
    """Schema entries for the error responses a view can give."""
    descriptions = {
        400: "bad input: the body names the problem",
        401: "not authenticated",
        403: "missing permission",
        404: "no such object",
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
    # Refuse an oversized body before parsing it (413), storing nothing.

    def initial(self, request, *args, **kwargs):
        length = request.META.get("CONTENT_LENGTH") or "0"
        if length.isdigit() and int(length) > settings.NRLLM_API_MAX_BODY_BYTES:
            raise PayloadTooLarge(
                f"body of {length} bytes is over the limit of "
                f"{settings.NRLLM_API_MAX_BODY_BYTES} (NRLLM_API_MAX_BODY_BYTES)"
            )
        super().initial(request, *args, **kwargs)


class BaseAPIView(LimitedBodyMixin, APIView):
    pass
