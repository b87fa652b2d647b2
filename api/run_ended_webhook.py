"""The run-ended webhook (G19) in the OpenAPI schema, as OpenAPI 3.1's
``webhooks``: the POST a run's ``webhook`` receives, its body field for
field what ``runs.run_webhooks.delivery.body_of`` writes (a test checks a
delivered body against it), and the answers that deliver it."""

from drf_spectacular.utils import OpenApiResponse, OpenApiWebhook, extend_schema
from rest_framework import serializers

from runs.models.run_events import EVENT_TYPES
from runs.models.vocabulary import FailureClass, RunStatus, TerminationReason


class RunEndedTokensSerializer(serializers.Serializer):
    prompt = serializers.IntegerField(min_value=0)
    completion = serializers.IntegerField(min_value=0)
    cached = serializers.IntegerField(min_value=0, help_text="of prompt, read from a cache")
    total = serializers.IntegerField(min_value=0, help_text="prompt + completion")


class RunEndedAgentSerializer(serializers.Serializer):
    name = serializers.CharField()
    version = serializers.IntegerField(min_value=1)


class RunEndedRunSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    team = serializers.CharField(
        help_text="the slug of the run's team (G22): a receiver checks it is its own"
    )
    status = serializers.ChoiceField(choices=RunStatus.choices)
    termination_reason = serializers.ChoiceField(
        choices=TerminationReason.choices, allow_blank=True, help_text="empty while it waits"
    )
    failure_class = serializers.ChoiceField(
        choices=FailureClass.choices, allow_blank=True, help_text="empty unless it failed"
    )
    dead_lettered = serializers.BooleanField(help_text="run.failed only: it was dead-lettered")
    output = serializers.CharField(allow_blank=True, help_text="the final answer, if any")
    tokens = RunEndedTokensSerializer(help_text="over all its attempts")
    cost = serializers.CharField(
        allow_null=True, help_text="a decimal string; null while a turn had no price"
    )
    currency = serializers.CharField(help_text="NRLLM_CURRENCY")
    agent = RunEndedAgentSerializer(
        allow_null=True, help_text="the agent version it started from; null for a whole request"
    )
    admin_path = serializers.CharField(help_text="the run's page in the console, from its root")


class RunEndedEventSerializer(serializers.Serializer):
    event_id = serializers.UUIDField(help_text="as X-Nrllm-Event-Id: drop one already seen")
    event = serializers.ChoiceField(choices=EVENT_TYPES, help_text="as X-Nrllm-Event")
    occurred_at = serializers.DateTimeField(help_text="when the status changed: orders events")
    sent_at = serializers.DateTimeField(help_text="when this attempt was sent")
    attempt = serializers.IntegerField(min_value=1, help_text="the POSTs of this event so far")
    run = RunEndedRunSerializer(help_text="the run as the event found it")


RUN_ENDED = OpenApiWebhook(
    name="run-ended",
    decorator=extend_schema(
        summary="A run ended, or began to wait for approval or for input",
        description=(
            "POSTed to the run's `webhook` each time its status changes to completed, failed, "
            "cancelled, waiting_for_approval or waiting_for_input (a person's answer to the "
            "agent's question, or another system's completion of a deferred call: G24), at "
            "least once (G19). Headers: `X-Nrllm-Event` "
            "(the event), `X-Nrllm-Event-Id` (its id: drop repeats), and with "
            "NRLLM_RUN_WEBHOOK_SECRET set `X-Nrllm-Signature-256`: `sha256=` and the hex "
            "HMAC-SHA256 of the body's exact bytes under the secret (docs/api.md shows how to "
            "check it)."
        ),
        request=RunEndedEventSerializer,
        responses={
            "2XX": OpenApiResponse(description="delivered: never sent again"),
            "default": OpenApiResponse(
                description="anything else (or no answer in time): tried again with backoff"
            ),
        },
    ),
)
