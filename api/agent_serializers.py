"""What the agents API returns and takes (G18). A definition's fields are
checked by ``agents.definitions.check_definition``, not here: these
serializers describe them for the schema and shape the answers."""

from rest_framework import serializers

from agents.definitions import FIELDS
from agents.models import Agent, AgentVersion


class AgentVersionSerializer(serializers.ModelSerializer):
    agent = serializers.SlugRelatedField(slug_field="name", read_only=True)
    created_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    max_cost = serializers.DecimalField(
        max_digits=28, decimal_places=10, read_only=True, allow_null=True, coerce_to_string=True
    )

    class Meta:
        model = AgentVersion
        # A version's definition is agents.definitions.FIELDS, in its order.
        fields = ["agent", "number", *FIELDS, "created_by", "created_at"]
        read_only_fields = fields


class AgentSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(
        slug_field="slug",
        read_only=True,
        help_text="the team the agent belongs to (its slug; G22): its runs are that team's. "
        "It never changes",
    )
    latest = AgentVersionSerializer(read_only=True, help_text="the version runs start from")

    class Meta:
        model = Agent
        fields = ["name", "team", "description", "latest", "created_at", "updated_at"]
        read_only_fields = fields


class AgentDefinitionSerializer(serializers.Serializer):
    """For the schema: the body ``POST /api/agents/`` takes (``PATCH`` the
    same fields, each optional: those left out keep the latest version's)."""

    name = serializers.SlugField(max_length=100, help_text="POST only: the name runs start by")
    team = serializers.SlugField(
        max_length=50,
        required=False,
        help_text="POST only: the slug of the team the agent belongs to, where you hold the "
        "author role; required when you may define agents in more than one team. It never "
        "changes",
    )
    description = serializers.CharField(required=False, allow_blank=True)
    instructions = serializers.CharField(
        required=False, allow_blank=True, help_text="the system message"
    )
    provider = serializers.JSONField(help_text='{"kind": "openai", "model": "..."}')
    tools = serializers.ListField(child=serializers.CharField(), required=False)
    require_approval = serializers.ListField(child=serializers.CharField(), required=False)
    max_iterations = serializers.IntegerField(min_value=1, required=False)
    max_total_tokens = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    max_cost = serializers.CharField(required=False, allow_null=True, help_text='e.g. "2.50"')
    webhook = serializers.CharField(
        required=False, allow_blank=True, help_text="told when each run ends (G19)"
    )


class AgentSavedSerializer(serializers.Serializer):
    agent = AgentSerializer()
    new_version = serializers.BooleanField(
        help_text="false when the definition equals the latest version's (nothing new)"
    )
