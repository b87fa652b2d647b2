"""``/api/``: where an integrator starts — each resource's URL, the OpenAPI
schema and its Swagger UI, and how to authenticate. Open to anyone, as the
schema is: it tells nothing the schema does not, and a client without a
token yet is the one that needs it most."""

from drf_spectacular.utils import extend_schema
from knox.settings import knox_settings
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.reverse import reverse

from api.views.base import BaseAPIView

#: The collections, by the name the root lists them under → their route
#: (and the query a link needs to answer: usage is always grouped).
QUERIES = {"usage": "?group_by=day"}
RESOURCES = {
    "runs": "api-runs",
    "runs_bulk": "api-runs-bulk",
    "agents": "api-agents",
    "schedules": "api-schedules",
    "triggers": "api-triggers",
    "approvals": "api-approvals",
    "dead_letters": "api-dead-letters",
    "write_audits": "api-write-audits",
    "tools": "api-tools",
    "providers": "api-providers",
    "usage": "api-usage",
}


class ApiRootSerializer(serializers.Serializer):
    resources = serializers.DictField(
        child=serializers.URLField(), help_text="each collection's URL, by name"
    )
    schema = serializers.URLField(help_text="the OpenAPI 3.1 schema (?format=json for JSON)")
    docs = serializers.URLField(help_text="the schema as Swagger UI")
    authentication = serializers.CharField(help_text="the header every other endpoint takes")


class ApiRoot(BaseAPIView):
    """The API's entry: each collection's URL, the OpenAPI schema and its
    docs, and the header to authenticate with. Needs no credentials."""

    permission_classes = []

    @extend_schema(responses={200: ApiRootSerializer}, auth=[], tags=["root"])
    def get(self, request):
        scheme = knox_settings.AUTH_HEADER_PREFIX
        return Response(
            {
                "resources": {
                    name: reverse(route, request=request) + QUERIES.get(name, "")
                    for name, route in RESOURCES.items()
                },
                "schema": reverse("api-schema", request=request),
                "docs": reverse("api-docs", request=request),
                "authentication": f"Authorization: {scheme} <key>; a key is printed once by "
                "python manage.py create_api_token USERNAME",
            }
        )
