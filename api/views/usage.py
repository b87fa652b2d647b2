"""``/api/usage/``: what recorded model turns spent, by day, model or
submitter (G17), in the teams whose runs the user (as its token lets it)
may see: spend rows are kept per team (``DailySpend.team``, the team of
the runs whose turns they count), so another team's spend is absent from
every sum (G22)."""

import re
from datetime import date, timedelta

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from api import permissions
from api.views.base import BaseAPIView, errors
from spend.budgets import database_now
from spend.models import DailySpend
from spend.usage import GROUPS, usage
from teams import access

VIEW_RUNS = "runs.view_agentrun"
#: Without ``since``: the last 30 days (the database's clock, UTC).
DEFAULT_DAYS = 30


class UsageSerializer(serializers.Serializer):
    day = serializers.DateField(required=False, help_text="group_by=day")
    provider = serializers.CharField(required=False, help_text="group_by=model")
    model = serializers.CharField(required=False, help_text="group_by=model")
    user_id = serializers.IntegerField(
        required=False, allow_null=True, help_text="group_by=user; null: the command line"
    )
    user = serializers.CharField(required=False, allow_null=True, help_text="group_by=user")
    turns = serializers.IntegerField()
    input_tokens = serializers.IntegerField()
    cached_input_tokens = serializers.IntegerField(help_text="of input_tokens, cached")
    output_tokens = serializers.IntegerField()
    tokens = serializers.IntegerField(help_text="input + output")
    cost = serializers.CharField(
        help_text="the priced turns' cost, a decimal string; a lower bound unless cost_known"
    )
    unpriced_turns = serializers.IntegerField(
        help_text="turns of unknown cost: their model had no price, or no usage was reported"
    )
    cost_known = serializers.BooleanField()


class UsageList(BaseAPIView):
    """What recorded model turns spent, by day, model or submitter (G17), in the teams
    whose runs you may see."""

    permission_classes = [permissions.VIEW_RUNS]

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "group_by", OpenApiTypes.STR, enum=list(GROUPS), required=True, description="how"
            ),
            OpenApiParameter(
                "since",
                OpenApiTypes.DATE,
                description=f"first day (UTC), default {DEFAULT_DAYS} days before until (or today)",
            ),
            OpenApiParameter("until", OpenApiTypes.DATE, description="last day (UTC), inclusive"),
        ],
        responses={200: UsageSerializer(many=True), **errors(400)},
    )
    def get(self, request):
        group_by = request.query_params.get("group_by", "")
        if group_by not in GROUPS:
            raise ValidationError({"group_by": f"{group_by[:40]!r} is not one of {list(GROUPS)}"})
        until = _day(request, "until")
        since = _day(request, "since") or _default_since(until)
        if until is not None and until < since:
            raise ValidationError({"until": f"{until} is before since ({since})"})
        rows = access.scoped(DailySpend.objects.all(), request.user, VIEW_RUNS)
        return Response(UsageSerializer(usage(group_by, since, until, rows=rows), many=True).data)


def _default_since(until: date | None) -> date:
    """``DEFAULT_DAYS`` before ``until`` (or today). An ``until`` too early
    in the calendar for that is refused, naming it: there is no day before
    0001-01-01 to count from, and a guess would answer another question."""
    last = until or database_now().date()
    if last - date.min < timedelta(days=DEFAULT_DAYS):
        raise ValidationError(
            {
                "until": f"{last} has no {DEFAULT_DAYS} days before it for the default since: "
                "give since too"
            }
        )
    return last - timedelta(days=DEFAULT_DAYS)


def _day(request, name: str) -> date | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        # fromisoformat alone also takes 20260101 and week dates (2026-W01-1).
        if not _DAY.fullmatch(raw):
            raise ValueError(raw)
        return date.fromisoformat(raw)
    except ValueError:
        raise ValidationError({name: f"{raw[:40]!r} is not a date (YYYY-MM-DD)"}) from None


_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
