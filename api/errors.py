"""One error shape for every 4xx (and a 503 when the database refuses):
``{"code": ..., "detail": ...}`` (plus ``"errors"`` by field for validation
failures), never a stack trace."""

import logging

from django.db import DatabaseError
from django.http import JsonResponse
from django.views import defaults
from knox.settings import knox_settings
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

logger = logging.getLogger(__name__)


class Conflict(exceptions.APIException):
    """The request is valid but the run's state refuses it (409)."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"

    def __init__(self, code: str, detail: str):
        super().__init__(detail=detail, code=code)


class BadRequest(exceptions.APIException):
    """The request is well formed but what it asks is refused as wrong
    (an edit's arguments, an answer, for the call they name): 400 with
    the action's code."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "invalid"

    def __init__(self, code: str, detail: str):
        super().__init__(detail=detail, code=code)


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"


class BudgetSpent(exceptions.Throttled):
    """The submitter's budget is spent (G17): 429, ``Retry-After`` the
    period's end. Nothing was stored."""

    default_code = "budget_exhausted"


class Unprocessable(exceptions.APIException):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_code = "unprocessable"

    def __init__(self, code: str, detail: str):
        super().__init__(detail=detail, code=code)


def _first_message(errors) -> str:
    if isinstance(errors, dict):
        field, value = next(iter(errors.items()))
        return f"{field}: {_first_message(value)}"
    if isinstance(errors, list) and errors:
        return _first_message(errors[0])
    return str(errors)


def exception_handler(exc, context):
    if isinstance(exc, DatabaseError):
        # The change was refused or the database is away: the action's
        # transaction rolled back, so nothing of it happened. Say so, not 500.
        logger.error("database error in %s: %s", context["request"].path, exc)
        return Response(
            {
                "code": "database_unavailable",
                "detail": "the database could not complete the request; nothing was changed",
            },
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
        )
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        response.data = {
            "code": "invalid",
            "detail": _first_message(exc.detail),
            "errors": response.data,
        }
        return response
    codes = exc.get_codes() if isinstance(exc, exceptions.APIException) else "error"
    response.data = {
        "code": codes if isinstance(codes, str) else "error",
        "detail": str(response.data.get("detail", response.data))
        if isinstance(response.data, dict)
        else str(response.data),
    }
    if isinstance(exc, exceptions.NotAuthenticated):
        response.data["detail"] = _scheme_hint(context["request"]) or response.data["detail"]
    return response


def _scheme_hint(request) -> str:
    """What to send instead, when the request's ``Authorization`` header
    names a scheme the API does not take (``Bearer``, as most APIs ask):
    the token authentication skips such a header, and "credentials were
    not provided" would be all the client heard. "" when there is none."""
    given = request.META.get("HTTP_AUTHORIZATION", "")
    if not given.strip():
        return ""
    scheme = knox_settings.AUTH_HEADER_PREFIX
    named = given.split()[0] if " " in given.strip() else ""
    said = f"the scheme {named[:20]!r}" if named else "no scheme"
    return (
        f"the Authorization header gives {said}; this API's scheme is {scheme!r}: "
        f"use 'Authorization: {scheme} <key>' (python manage.py create_api_token USERNAME)"
    )


def in_the_api_shape(django_handler, status_code: int, code: str):
    """A project-wide error handler that answers under ``/api/`` in the API's
    shape (no route matched, or a middleware refused the request) and
    leaves every other page to Django's own."""

    def handler(request, exception):
        if request.path.startswith("/api/"):
            detail = exception.args[0] if exception.args else None
            if not isinstance(detail, str):
                # A URL no route matches: Django's detail is the resolver's
                # report (every pattern tried), not a message for the client.
                detail = f"no such endpoint: {request.path}"
            return JsonResponse({"code": code, "detail": detail}, status=status_code)
        return django_handler(request, exception)

    return handler


not_found = in_the_api_shape(defaults.page_not_found, 404, "not_found")
bad_request = in_the_api_shape(defaults.bad_request, 400, "invalid")
