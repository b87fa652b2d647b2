"""``/api/providers/``: the circuit breakers of provider endpoints and models."""

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from api import permissions
from api.views.base import BaseAPIView, errors
from runs.models import ProviderCircuit
from runs.providers.circuit import cooldown_left

RECENT_TRANSITIONS = 10


class TransitionSerializer(serializers.Serializer):
    from_state = serializers.CharField()
    to_state = serializers.CharField()
    reason = serializers.CharField()
    at = serializers.DateTimeField()


class CircuitSerializer(serializers.Serializer):
    key = serializers.CharField(help_text="endpoint and model")
    state = serializers.ChoiceField(choices=["closed", "open", "half_open"])
    failures = serializers.IntegerField(help_text="server-side failures in the current window")
    opened_at = serializers.DateTimeField(allow_null=True)
    cooldown_left_seconds = serializers.FloatField()
    transitions = TransitionSerializer(many=True, help_text="newest first")


def describe_circuits() -> list[dict]:
    now = timezone.now()
    return [
        {
            "key": circuit.key,
            "state": circuit.state,
            "failures": circuit.failures,
            "opened_at": circuit.opened_at,
            "cooldown_left_seconds": cooldown_left(circuit, now),
            "transitions": list(
                circuit.transitions.values("from_state", "to_state", "reason", "at")[
                    :RECENT_TRANSITIONS
                ]
            ),
        }
        for circuit in ProviderCircuit.objects.all()
    ]


class ProviderList(BaseAPIView):
    """Each provider endpoint's circuit: its state, failures, and last transitions."""

    permission_classes = [permissions.VIEW_RUNS]

    @extend_schema(responses={200: CircuitSerializer(many=True), **errors()})
    def get(self, request):
        return Response(CircuitSerializer(describe_circuits(), many=True).data)
