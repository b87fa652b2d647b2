"""``POST /api/completions/<key>/<signature>/``: where another system
completes a call a deferred tool handed to it (G24).
``runs.approvals.answers.complete`` decides everything; this is its HTTP
adapter.

No login, no token, no throttle of the API's, as a trigger's hook
(``api.views.hooks``): the URL's signature, made with the deployment's
secret for the call's key (``runs.approvals.completions``), is the
sender's credential. A URL not signed here is a 404 said as for a call
that does not exist. The body is read raw and parsed here, whatever its
content type claims, so that every malformed one is a 400 that says why.
"""

import json
import re

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from api.serializers import ErrorSerializer
from api.views.hooks import SignedPost
from runs.approvals import answers
from runs.approvals.completions import is_signed
from tools.canonical import MAX_JSON_DEPTH, nested_deeper_than

#: A call's key is ``tools.contract.idempotency_key_for``'s (sha256, hex),
#: and a signature Django's ``Signer``'s (URL-safe base64): anything else
#: names no call, and is not looked up.
CALL_KEY = re.compile(r"[0-9a-f]{64}")
SIGNATURE = re.compile(r"[A-Za-z0-9_-]{1,100}")
#: A completion holds at most ``answers.MAX_ANSWER_CHARS`` of JSON; a body
#: eight times that leaves room for any formatting, and a larger one is
#: refused before it is read.
MAX_BODY_BYTES = 8 * answers.MAX_ANSWER_CHARS
#: The API's status of each refusal ``complete`` answers (any other: 409).
STATUS_OF_CODE = {"not_found": 404, "invalid_completion": 400}
#: A completion that came before its call's wait was recorded: the tool
#: handed the call on just now, and the run parks in a moment.
RETRY_AFTER_SECONDS = 1


class CompletionAnswerSerializer(serializers.Serializer):
    status = serializers.ChoiceField(
        choices=["completed", "unchanged"],
        help_text="completed: recorded, the run goes on; unchanged: this completion was "
        "recorded already (a retry), nothing changed",
    )
    detail = serializers.CharField()


def _refused(status: int, code: str, detail: str, headers=None) -> Response:
    return Response({"code": code, "detail": detail}, status=status, headers=headers)


_NOT_FOUND = (404, "not_found", "no such deferred call")


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


class Completion(SignedPost):
    """Complete a call that a deferred tool handed to your system: POST its
    result, `{"result": <any JSON>}`, or a failure, `{"error": "<text>"}`,
    to the URL the tool passed on (signed for that call). `200` with status
    completed: recorded as the call's result, and the run goes on; `200`
    with status unchanged: the same completion again (a retry), nothing
    changed. A different completion of a call already completed is a `409`
    (conflict), and the first is kept. `404` for a URL this deployment did
    not sign; `409` not_waiting with `Retry-After` when the call was handed
    on a moment ago and its wait is not recorded yet, and expired or
    withdrawn when its wait has ended; `400` naming what is wrong with the
    body. Nothing is stored for any refusal."""

    @extend_schema(
        request={"application/json": OpenApiTypes.OBJECT},
        responses={
            200: CompletionAnswerSerializer,
            **{
                code: OpenApiResponse(ErrorSerializer, description=text)
                for code, text in (
                    (400, 'the body is not {"result": <JSON>} or {"error": "<text>"}: it says why'),
                    (404, "no such deferred call: the URL was not signed by this deployment"),
                    (
                        409,
                        "not_waiting (Retry-After: the call's wait is not recorded yet), "
                        "conflict (completed already with another body), expired or withdrawn "
                        "(its wait ended)",
                    ),
                    (413, f"a body over {MAX_BODY_BYTES} bytes"),
                )
            },
        },
        examples=[
            OpenApiExample("a result", request_only=True, value={"result": {"ticket": "done"}}),
            OpenApiExample("a failure", request_only=True, value={"error": "ticket rejected"}),
        ],
        auth=[],
        tags=["completions"],
    )
    def post(self, request, key, signature):
        length = request.META.get("CONTENT_LENGTH") or "0"
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            # Before the body is read: an oversized one is never held.
            return _refused(413, "too_large", f"the body is larger than {MAX_BODY_BYTES} bytes")
        if not (CALL_KEY.fullmatch(key) and SIGNATURE.fullmatch(signature)):
            return _refused(*_NOT_FOUND)
        # Signed here or not before the body is looked at: an unsigned URL
        # learns nothing, whatever it sends.
        if not is_signed(key, signature):
            return _refused(*_NOT_FOUND)
        raw = request.body
        if len(raw) > MAX_BODY_BYTES:
            # Sent without a Content-Length (chunked).
            return _refused(413, "too_large", f"the body is larger than {MAX_BODY_BYTES} bytes")
        try:
            body = json.loads(raw, parse_constant=_refuse_constant)
        except (UnicodeDecodeError, ValueError) as error:
            return _refused(400, "invalid_completion", f"body: no JSON ({error})")
        except RecursionError:
            # ``[[[[…]]]]`` thousands deep: not a ValueError (api.parsers).
            return _refused(400, "invalid_completion", "body: JSON nested too deeply")
        if nested_deeper_than(body):
            # Parsed, but too deep for the checks and the journal to walk.
            return _refused(
                400, "invalid_completion", f"body: JSON nested deeper than {MAX_JSON_DEPTH} levels"
            )
        result = answers.complete(key, signature, body)
        if result.ok:
            return Response({"status": result.code, "detail": result.detail})
        if result.code == "not_found":
            return _refused(*_NOT_FOUND)
        status = STATUS_OF_CODE.get(result.code, 409)
        headers = (
            {"Retry-After": str(RETRY_AFTER_SECONDS)} if result.code == "not_waiting" else None
        )
        return _refused(status, result.code, result.detail, headers)
