"""``/api/runs/{id}/webhook-deliveries/``: the run-ended webhook's events of
a run and their deliveries (G19), read-only."""

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from api import permissions
from api.views.base import BaseAPIView, errors
from api.views.runs import get_run
from api.webhook_serializers import WebhookDeliverySerializer
from runs.run_webhooks import deliveries_of


class RunWebhookDeliveries(BaseAPIView):
    """Each time the run ended or began to wait for approval, with its webhook: the event, its
    attempts, the last answer, and whether it was delivered, is due again, or was given up."""

    permission_classes = [permissions.VIEW_RUNS]

    @extend_schema(responses={200: WebhookDeliverySerializer(many=True), **errors(404)})
    def get(self, request, pk):
        run = get_run(pk, request.user)
        return Response(WebhookDeliverySerializer(deliveries_of(run.pk), many=True).data)
