"""The bodies of ``/api/runs/{id}/rerun-from/{sequence}/`` (G20)."""

from rest_framework import serializers

from api.serializers import StrictSerializer, TextField


class RerunBodySerializer(StrictSerializer):
    input = TextField(
        required=False, trim_whitespace=False, help_text="the new run's input; else the original's"
    )
    version = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="another version of the run's agent, whose definition the new run gets; "
        "left out or the run's own: the original's request, its limits and webhook as started",
    )
    note = TextField(required=False, allow_blank=True, default="", max_length=10_000)
    confirm_past_write = serializers.BooleanField(
        required=False,
        default=False,
        help_text="rerun past a non_idempotent_write recorded after the step "
        "(takes the permission runs.rerun_past_write)",
    )


class WriteAfterSerializer(serializers.Serializer):
    sequence = serializers.IntegerField(
        allow_null=True, help_text="its tool step; null: the write in doubt on the run's fence"
    )
    tool = serializers.CharField()
    effect = serializers.CharField()
    state = serializers.CharField(help_text="executed, returned_late, in_doubt or applied")
    run = serializers.CharField(
        allow_null=True,
        help_text="null: this run recorded it; else the run it reruns, which did (its step)",
    )


class RerunVerdictSerializer(serializers.Serializer):
    allowed = serializers.BooleanField()
    code = serializers.CharField(
        help_text="safe, status, not_a_turn, request_invalid, journal_unreplayable, "
        "tool_not_offered, max_iterations_reached, past_write"
    )
    reason = serializers.CharField(help_text="what the rerun will do, or why it is refused")
    sequence = serializers.IntegerField(help_text="the model turn the new run goes live at")
    writes_after = WriteAfterSerializer(
        many=True, help_text="the writes the run recorded from that turn on"
    )
    past_write = serializers.BooleanField(
        help_text="a non_idempotent_write is among them: the rerun takes confirm_past_write"
    )
