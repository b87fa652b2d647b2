"""``POST /api/hooks/<path>/``: where other systems send signed events to
a trigger (G23). ``triggers.events.receive`` decides everything; this is
its HTTP adapter.

No login, no token, no throttle of the API's: the signature over the
body's exact bytes is the sender's credential, and the trigger has its own
rate limit. So the body is read raw (``request.body``) and never parsed
here — a parser would hand over a re-serialised object, not the bytes the
sender signed. It is a DRF view nonetheless (which parses nothing until
``request.data`` is read, and is exempt from CSRF, having no session
authentication), so that the schema documents it and its errors have the
API's shape.
"""

import re

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from api.serializers import ErrorSerializer
from api.trigger_serializers import HookAnswerSerializer
from triggers import events

#: A trigger's path is ``secrets.token_urlsafe``'s: anything else names none,
#: and is not looked up.
TRIGGER_PATH = re.compile(r"[A-Za-z0-9_-]{1,40}")
#: The API's error code of each refusal ``receive`` answers.
CODE_OF_STATUS = {
    400: "invalid",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    409: "conflict",
    413: "too_large",
    429: "throttled",
}


class JsonWhateverAccepted(BaseContentNegotiation):
    """A sender's ``Accept`` never refuses its event (a 406 would be
    retried as a failure): the answer is JSON."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


def _refused(status: int, detail: str) -> Response:
    return Response({"code": CODE_OF_STATUS[status], "detail": detail}, status=status)


_SIGNATURE_HEADERS = [
    OpenApiParameter(name, location=OpenApiParameter.HEADER, required=False, description=text)
    for name, text in (
        ("webhook-id", "Standard Webhooks: the message id (the default event id)"),
        ("webhook-timestamp", "Standard Webhooks: Unix seconds; more than 5 minutes off: 401"),
        ("webhook-signature", "Standard Webhooks: v1, and the base64 HMAC-SHA256"),
        ("X-Hub-Signature-256", "GitHub: sha256= and the hex HMAC-SHA256 of the body"),
        ("X-GitHub-Delivery", "GitHub: the delivery id (the event id, if the trigger says so)"),
    )
]


# No docstring (drf-spectacular would show it for the views below): a POST
# another system makes, authenticated by a signature — of its body or of
# its URL — never by a user's token or session, so no CSRF, no throttle,
# and whatever it says it accepts, the answer is JSON.
class SignedPost(APIView):
    authentication_classes = []
    permission_classes = []
    throttle_classes = []
    renderer_classes = [JSONRenderer]
    content_negotiation_class = JsonWhateverAccepted
    http_method_names = ["post", "options"]


class Hook(SignedPost):
    """Send an event to a trigger: a JSON object, signed with the trigger's
    secret by its scheme (Standard Webhooks, or GitHub's
    `X-Hub-Signature-256`). `202` with the run it started; `200` with the
    same run when its event id was accepted within the trigger's window (a
    retry, a re-sent alert group: nothing new starts). A bad or stale
    signature is `401`, a body lacking a field the trigger's templates name
    `400` naming it, a disabled trigger `409`, past its events per minute
    `429` with `Retry-After` — and nothing is stored for any of them."""

    @extend_schema(
        request={"application/json": OpenApiTypes.OBJECT},
        parameters=_SIGNATURE_HEADERS,
        responses={
            202: OpenApiResponse(HookAnswerSerializer, description="accepted: its run started"),
            200: OpenApiResponse(
                HookAnswerSerializer, description="the same event again: its run, nothing new"
            ),
            **{
                code: OpenApiResponse(ErrorSerializer, description=text)
                for code, text in (
                    (400, "the body is no JSON object, or lacks a field a template names"),
                    (401, "the signature is missing, wrong or stale"),
                    (403, "the trigger's owner may no longer start its agent's runs"),
                    (404, "no trigger at this address"),
                    (409, "the trigger is disabled, or the same event is being accepted"),
                    (413, f"a body over {events.MAX_BODY_BYTES} bytes"),
                    (
                        429,
                        "over the trigger's events per minute, or its owner's budget is "
                        "spent: Retry-After",
                    ),
                )
            },
        },
        auth=[],
        tags=["hooks"],
    )
    def post(self, request, path):
        length = request.META.get("CONTENT_LENGTH") or "0"
        if length.isdigit() and int(length) > events.MAX_BODY_BYTES:
            # Before the body is read: an oversized one is never held.
            return _refused(413, f"the body is larger than {events.MAX_BODY_BYTES} bytes")
        if not TRIGGER_PATH.fullmatch(path):
            return _refused(404, "no trigger at this address")
        # The raw bytes the signature covers; request.data is never read.
        answer = events.receive(path, request.headers, request.body)
        body = answer.body
        if "detail" in body:
            body = {"code": CODE_OF_STATUS.get(answer.status, "error"), **body}
        return Response(body, status=answer.status, headers=answer.headers)
