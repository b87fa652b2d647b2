"""What ``POST /api/runs/bulk/`` takes and answers: an action on many runs,
named by id or by the runs list's filters (``api.filters.RunFilter``), at
most ``runs.operators.bulk.MAX_RUNS`` of them."""

import uuid

from rest_framework import serializers

from api.filters import RunFilter
from api.serializers import StrictSerializer, TextField
from runs.models import AgentRun
from runs.operators.bulk import BULK_ACTIONS, MAX_RUNS, Seen
from runs.runtime.json_text import shown as as_json

#: Why an empty filter value is refused rather than taken as no filter.
EMPTY_FILTER = "empty: give a value, or leave the filter out (empty, it would match every run)"


def _is_empty(value) -> bool:
    """Null, a blank or whitespace-only string, an empty list or object."""
    if isinstance(value, str):
        return not value.strip()
    return value is None or (isinstance(value, list | dict) and not value)


def _as_query_value(name: str, value) -> str:
    """A filter's value as the runs list's query string would carry it.
    An empty one is refused: the list's filters take an empty value for
    no filter at all, and a bulk action would then act on every run."""
    if _is_empty(value):
        raise serializers.ValidationError({name: EMPTY_FILTER})
    if isinstance(value, bool):
        return "true" if value else "false"
    if not isinstance(value, str | int):
        raise serializers.ValidationError({name: "must be a string (as in the runs list's query)"})
    # A NUL is refused by the filter's form field, naming the filter.
    return str(value)


class BulkActionSerializer(StrictSerializer):
    action = serializers.ChoiceField(choices=sorted(BULK_ACTIONS))
    ids = serializers.ListField(
        child=serializers.UUIDField(),
        required=False,
        allow_empty=False,
        max_length=MAX_RUNS,
        error_messages={"max_length": f"at most {MAX_RUNS} runs per bulk action"},
        help_text=f"the runs, by id (at most {MAX_RUNS}); or give `filter`",
    )
    filter = serializers.DictField(
        required=False,
        help_text="the runs the runs list's filters match (as GET /api/runs/ takes them: "
        f"status, termination_reason, failure_class, mode, tool, created_after, "
        f"created_before, write_in_doubt); more than {MAX_RUNS} is refused; or give `ids`",
    )
    note = TextField(max_length=10_000, required=False, allow_blank=True)
    preview = serializers.BooleanField(
        required=False, default=False, help_text="true: each run's verdict, nothing changed"
    )
    seen = serializers.DictField(
        child=TextField(),
        required=False,
        help_text="run id → the `seen` a preview gave it: a requeue or restart of a run no "
        "longer so is refused `changed`",
    )

    def validate_seen(self, value):
        seen = {}
        for run_id, shown in value.items():
            try:
                key = str(uuid.UUID(run_id))
            except ValueError:
                raise serializers.ValidationError({run_id: "not a run id (a UUID)"}) from None
            seen[key] = Seen.parse(shown)
            if seen[key] is None:
                raise serializers.ValidationError({run_id: "not a preview's seen (status:steps)"})
        return seen

    def validate_filter(self, value):
        known = sorted(RunFilter.base_filters)
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise serializers.ValidationError(f"unknown filter(s) {unknown}; known: {known}")
        data = {name: _as_query_value(name, given) for name, given in value.items()}
        filterset = RunFilter(data=data, queryset=AgentRun.objects.all())
        if not filterset.is_valid():
            raise serializers.ValidationError(filterset.errors)
        # A value its filter reads as no value (write_in_doubt "maybe") is
        # no filter either: refused as an empty one is.
        cleaned = filterset.form.cleaned_data
        unread = [name for name in data if cleaned.get(name) in (None, "")]
        if unread:
            name = unread[0]
            raise serializers.ValidationError(
                {name: f"{as_json(value[name])} is not a value it takes (it would match every run)"}
            )
        # A filter may refuse its value only as it filters (a date out of range).
        return filterset.qs

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if ("ids" in attrs) == ("filter" in attrs):
            raise serializers.ValidationError(
                {"ids": "give the runs' ids or a filter: one of them"}
            )
        return attrs


class BulkRunResultSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    ok = serializers.BooleanField(help_text="done (in a preview: would be done)")
    code = serializers.CharField(help_text="the verdict's or the action's code")
    detail = serializers.CharField(help_text="what it did (or will do), or why not")
    seen = serializers.CharField(
        allow_null=True,
        help_text="in a preview: the run as its verdict saw it (null: no such run); give it "
        "back in `seen` to refuse a run changed since",
    )


class BulkOutcomeSerializer(serializers.Serializer):
    action = serializers.CharField()
    preview = serializers.BooleanField()
    runs = serializers.IntegerField(help_text="how many runs it was asked of")
    done = serializers.IntegerField(help_text="done (in a preview: would be done)")
    refused = serializers.IntegerField()
    refused_by_code = serializers.DictField(child=serializers.IntegerField())
    summary = serializers.CharField(help_text='e.g. "requeued 7; refused 3: write_in_doubt 3"')
    results = BulkRunResultSerializer(many=True, help_text="one per run, in order")
