"""The two bodies ``POST /api/runs/`` takes, a whole request or a start by
agent, and a run's request as ``Run.request`` shows it. The runtime checks
them (``agents.starting.expand``, ``runs.runtime.run_request``), not these:
a whole request's schema is the runtime's own (``request_json_schema``),
so the API's cannot drift from what it checks."""

from drf_spectacular.extensions import OpenApiSerializerExtension
from rest_framework import serializers

from runs.providers import PROVIDER_KINDS
from runs.runtime.run_request import request_json_schema

#: What the schema says of each field of a request.
_FIELDS = {
    "prompt": "the run's input: the user's message to the model",
    "instructions": "the system message, sent before the prompt",
    "tools": "the names of the tools offered to the model (GET /api/tools/)",
    "provider": "who plays the model's turns: scripted (turns written out) or openai "
    "(a chat-completions endpoint the deployment configures)",
    "webhook": "a URL told when the run ends or begins to wait for approval (G19; the "
    "run-ended webhook of this schema's webhooks); its host must be allowed",
    "max_iterations": "at most this many model turns",
    "require_approval": "tools among tools whose calls wait for an operator's approval "
    "although their policy does not ask for it",
    "max_total_tokens": "the run's limit of tokens over all its attempts (G17); "
    "NRLLM_RUN_MAX_TOTAL_TOKENS when left out",
    "max_cost": "the run's limit of cost over all its attempts, a decimal (a string keeps it "
    "exact; G17); NRLLM_RUN_MAX_COST when left out",
}


class RunRequestSerializer(serializers.Serializer):
    """A run's whole request, as given or as stored: passed through as it
    is. Its schema is ``RunRequestSchema``'s."""

    def to_representation(self, instance):
        return instance


class RunRequestSchema(OpenApiSerializerExtension):
    """``RunRequestSerializer`` in the schema: the runtime's request schema,
    each field described. As a run holds it (``Run.request``: every field a
    stored request always has required, the provider one of the kinds' own
    schemas); as a body, with only the provider's kind listed — a kind's
    other fields are ``Run.request``'s — so that requests generated from
    the schema (schemathesis) do not start scripted runs that wait."""

    target_class = RunRequestSerializer

    def get_name(self, auto_schema, direction):
        return "RunRequest"

    def map_serializer(self, auto_schema, direction):
        schema = request_json_schema(stored=direction == "response")
        if direction == "request":
            schema["properties"]["provider"] = {
                "type": "object",
                "properties": {"kind": {"enum": sorted(PROVIDER_KINDS)}},
                "required": ["kind"],
            }
        for name, description in _FIELDS.items():
            schema["properties"][name]["description"] = description
        if direction == "request":
            # Not part of the request the run keeps: the team it starts in (G22).
            schema["properties"]["team"] = {
                "type": "string",
                "description": "the slug of the team the run starts in, where the submitter "
                "holds the runner role; left out: the token's team, else the submitter's only "
                "such team — with more than one, a 400 naming team. A start by agent runs in "
                "the agent's team and takes no team",
            }
        schema["description"] = "A run's whole request (docs/api.md: starting runs)."
        return schema


class RunStartByAgentSerializer(serializers.Serializer):
    """For the schema: a run of an agent's version (G18)."""

    agent = serializers.CharField(help_text="the agent's name")
    input = serializers.CharField(help_text="the run's input: its prompt")
    version = serializers.IntegerField(
        min_value=1, required=False, help_text="a version's number; the latest if left out"
    )
    webhook = serializers.CharField(required=False, help_text="in place of the agent's")
    max_iterations = serializers.IntegerField(
        min_value=1, required=False, help_text="at most the version's"
    )
    max_total_tokens = serializers.IntegerField(
        min_value=1, required=False, help_text="at most the version's"
    )
    max_cost = serializers.CharField(required=False, help_text="at most the version's")
